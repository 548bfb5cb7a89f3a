"""The DRA part of the fake API server (tests/kube_api_server.py) as `serve --kubernetes-device-taints` speaks to
it: resource.k8s.io's ResourceSlices (listed with a fieldSelector on spec.nodeName) and DeviceTaintRules (listed
with an equality labelSelector, created, replaced and deleted), in the versions a test says the server serves (404
for the others, as a server without that version or feature gate answers).

What it implements, from k8s.io/api resource/v1 types.go and the API conventions:
- every DeviceTaintRule nodecheck sends is validated strictly (an unknown field is an error: 422) against the
  OpenAPI schema of the Kubernetes release that introduced its version (kubernetes-validate: v1alpha3 1.33,
  v1beta2 1.36, v1 1.37);
- POST of a name already taken: 409 AlreadyExists; PUT: 409 Conflict unless metadata.resourceVersion is the
  stored one; DELETE of an absent name: 404;
- taint.timeAdded set by the server when absent, and replaced by the current time when an update keeps it but
  changes the effect; metadata.generation bumped when the spec changes; resourceVersion bumped on every change."""

from __future__ import annotations

import copy
import urllib.parse

import kubernetes_validate

GROUP = "resource.k8s.io"
RELEASE_OF = {"v1alpha3": "1.33.0", "v1beta2": "1.36.0", "v1": "1.37.0"}
NOW = "2026-11-18T11:06:40Z"


class DraState:
    def __init__(self, slices: list[dict], rule_versions=("v1",), slice_versions=("v1",)) -> None:
        self.slices = copy.deepcopy(slices)
        self.rule_versions, self.slice_versions = set(rule_versions), set(slice_versions)
        self.rules: dict[str, dict] = {}
        self.version = 1000
        self.race_next_write = False  # another writer changes the rule before nodecheck's next PUT

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    def route(self, server, request, body, path_parts: list[str]):
        """path_parts: after /apis/resource.k8s.io/: [version, resource(, name)]."""
        version, resource, name = (path_parts + [None])[:3]
        served = self.slice_versions if resource == "resourceslices" else self.rule_versions
        if resource not in ("resourceslices", "devicetaintrules") or version not in served or len(path_parts) > 3:
            return server._refuse(404, "NotFound", "the server could not find the requested resource")
        verb = {"GET": "list", "POST": "create", "PUT": "update", "DELETE": "delete"}.get(request.method, "?")
        if not server._allowed(verb, resource, None):
            return server._forbidden(verb, resource, name or "", None, GROUP)
        query = dict(urllib.parse.parse_qsl(request.query_string.decode()))
        if resource == "resourceslices":
            if verb != "list" or name:
                return server._refuse(405, "MethodNotAllowed", "nodecheck only lists ResourceSlices")
            return server._answer(200, self._slices(version, query.get("fieldSelector", "")))
        if verb == "list" and not name:
            return server._answer(200, self._list(version, query.get("labelSelector", "")))
        if verb == "create" and not name:
            return self._create(server, version, body)
        if verb == "update" and name:
            return self._update(server, version, name, body)
        if verb == "delete" and name:
            if self.rules.pop(name, None) is None:
                return server._refuse(404, "NotFound", f'devicetaintrules.{GROUP} "{name}" not found')
            self._bump()
            return server._answer(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        return server._refuse(405, "MethodNotAllowed", f"{request.method} {request.path}")

    # -- ResourceSlices
    def _slices(self, version: str, field_selector: str) -> dict:
        key, _, node = field_selector.partition("=")
        items = [s for s in self.slices if not field_selector or (key == "spec.nodeName" and s["spec"].get("nodeName") == node)]
        return {"kind": "ResourceSliceList", "apiVersion": f"{GROUP}/{version}", "metadata": {"resourceVersion": str(self.version)},
                "items": [dict(copy.deepcopy(s), apiVersion=f"{GROUP}/{version}") for s in items]}

    # -- DeviceTaintRules
    def _list(self, version: str, label_selector: str) -> dict:
        wanted = dict(term.split("=", 1) for term in label_selector.split(",") if "=" in term)
        items = [r for r in self.rules.values() if all(r["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
        return {"kind": "DeviceTaintRuleList", "apiVersion": f"{GROUP}/{version}", "metadata": {"resourceVersion": str(self.version)},
                "items": [dict(copy.deepcopy(r), apiVersion=f"{GROUP}/{version}") for r in items]}

    def _invalid(self, server, version: str, body) -> object | None:
        if not isinstance(body, dict) or body.get("apiVersion") != f"{GROUP}/{version}" or body.get("kind") != "DeviceTaintRule":
            return server._refuse(400, "BadRequest", "not a DeviceTaintRule of this version")
        try:
            kubernetes_validate.validate(body, RELEASE_OF[version], strict=True)
        except kubernetes_validate.ValidationError as error:
            return server._refuse(422, "Invalid", f"DeviceTaintRule is invalid: {error.message}")
        return None

    def _create(self, server, version: str, body):
        refused = self._invalid(server, version, body)
        if refused is not None:
            return refused
        name = body["metadata"]["name"]
        if name in self.rules:
            return server._refuse(409, "AlreadyExists", f'devicetaintrules.{GROUP} "{name}" already exists')
        if "resourceVersion" in body["metadata"]:
            return server._refuse(422, "Invalid", "metadata.resourceVersion: must not be set on create")
        stored = copy.deepcopy(body)
        stored["metadata"].update(uid=f"rule-{len(self.rules)}-{self.version}", generation=1, creationTimestamp=NOW,
                                  resourceVersion=self._bump())
        stored["spec"]["taint"].setdefault("timeAdded", NOW)
        self.rules[name] = stored
        return server._answer(201, stored)

    def _update(self, server, version: str, name: str, body):
        refused = self._invalid(server, version, body)
        if refused is not None:
            return refused
        current = self.rules.get(name)
        if current is None:
            return server._refuse(404, "NotFound", f'devicetaintrules.{GROUP} "{name}" not found')
        if body["metadata"].get("name") != name:
            return server._refuse(400, "BadRequest", "the name of the object does not match the name on the URL")
        if self.race_next_write:
            self.race_next_write = False
            current["metadata"]["resourceVersion"] = self._bump()
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return server._refuse(409, "Conflict", f'Operation cannot be fulfilled on devicetaintrules.{GROUP} "{name}": '
                                                   "the object has been modified; please apply your changes to the latest version and try again")
        stored = copy.deepcopy(body)
        old_taint, taint = current["spec"]["taint"], stored["spec"]["taint"]
        if "timeAdded" not in taint or (taint["timeAdded"] == old_taint.get("timeAdded") and taint["effect"] != old_taint["effect"]):
            taint["timeAdded"] = "2026-11-18T12:00:00Z"  # "replaced with the current time"
        generation = current["metadata"]["generation"] + (stored["spec"] != current["spec"])
        stored["metadata"].update(uid=current["metadata"]["uid"], generation=generation,
                                  creationTimestamp=current["metadata"]["creationTimestamp"], resourceVersion=self._bump())
        self.rules[name] = stored
        return server._answer(200, stored)
