"""A Kubernetes API server as far as `serve --kubernetes-conditions` speaks to one (issue 25, item 3), on
pytest-httpserver over TLS: one Node (tests/fixtures/kubernetes/node-hgx.json, shaped as `kubectl get node -o json`
prints an EKS H100 node; no API server can run here, so it is not recorded from a live one), the patch semantics
the real server applies to what nodecheck sends, and RBAC taken from deploy/kubernetes's own Roles. It records
every request, and can be told to fail the next ones (status, body, headers) or to change the node under a
writer (a conflict).

What it implements, from the API's documentation:
- PATCH nodes/NAME/status, application/strategic-merge-patch+json: status.conditions merged by `type` (the
  patchMergeKey of NodeStatus.conditions), each listed field replaced.
- PATCH nodes/NAME, application/merge-patch+json (RFC 7386): objects merged, lists replaced whole (spec.taints
  has no merge key); metadata.resourceVersion in the patch makes it conditional (409 Conflict when stale).
- POST namespaces/NS/events: 409 AlreadyExists for a name already taken.
- Bearer token checked (401), RBAC from the manifests' rules (403 with the server's wording), 404 for another
  node. Every change bumps resourceVersion."""

from __future__ import annotations

import copy
import json
import re
import threading

from helpers import REPO
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

NODE = json.loads((REPO / "tests/fixtures/kubernetes/node-hgx.json").read_text())
ACCOUNT = ("monitoring", "nodecheck")
STRATEGIC, MERGE = "application/strategic-merge-patch+json", "application/merge-patch+json"


def granted(*manifests: str) -> set[tuple[str, str, str | None]]:
    """(verb, resource, namespace or None for cluster-wide) the manifests grant the account."""
    from helpers import kubernetes_objects

    out = set()
    for name in manifests:
        objects = kubernetes_objects(name)
        for role_kind, binding_kind in (("ClusterRole", "ClusterRoleBinding"), ("Role", "RoleBinding")):
            role, binding = objects.get(role_kind), objects.get(binding_kind)
            if role is None:
                continue
            assert binding["roleRef"]["name"] == role["metadata"]["name"]
            assert {"kind": "ServiceAccount", "namespace": ACCOUNT[0], "name": ACCOUNT[1]} in binding["subjects"]
            namespace = role["metadata"].get("namespace") if role_kind == "Role" else None
            for rule in role["rules"]:
                assert rule["apiGroups"] == [""]
                out |= {(verb, resource, namespace) for verb in rule["verbs"] for resource in rule["resources"]}
    return out


def status_document(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeApiServer:
    def __init__(self, ssl_context, token: str, permissions: set, node: dict | None = None) -> None:
        self.node = copy.deepcopy(node or NODE)
        self.token, self.permissions = token, permissions
        self.events: list[dict] = []
        self.requests: list[dict] = []  # method, path, content_type, body, authorization
        self.faults: list[tuple[int, bytes, dict]] = []  # answers for the next requests, in order
        self.race_next_write = False  # change the node's resourceVersion before the next conditional write
        self.lock = threading.Lock()
        self.server = HTTPServer(host="127.0.0.1", port=0, ssl_context=ssl_context)
        self.server.expect_request(re.compile(".*")).respond_with_handler(self.handle)

    def __enter__(self) -> FakeApiServer:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.clear()
        if self.server.is_running():
            self.server.stop()

    @property
    def port(self) -> int:
        return self.server.port

    def fail_next(self, status: int, body: bytes | dict = b"", headers: dict | None = None) -> None:
        payload = json.dumps(body).encode() if isinstance(body, dict) else body
        self.faults.append((status, payload, headers or {}))

    def conditions(self) -> dict[str, dict]:
        return {c["type"]: c for c in self.node["status"]["conditions"]}

    def taints(self) -> list[dict]:
        return self.node["spec"].get("taints") or []

    # -- the server
    def handle(self, request: Request) -> Response:
        with self.lock:
            body = request.get_data()
            try:
                parsed = json.loads(body) if body else None
            except ValueError:
                parsed = None
            self.requests.append({"method": request.method, "path": request.path, "content_type": request.content_type,
                                  "body": parsed, "authorization": request.headers.get("Authorization")})
            if self.faults:
                status, payload, headers = self.faults.pop(0)
                return Response(payload, status=status, headers=headers, content_type="application/json")
            return self._route(request, parsed)

    def _answer(self, code: int, document: dict) -> Response:
        return Response(json.dumps(document), status=code, content_type="application/json")

    def _refuse(self, code: int, reason: str, message: str) -> Response:
        return self._answer(code, status_document(code, reason, message))

    def _allowed(self, verb: str, resource: str, namespace: str | None) -> bool:
        return (verb, resource, None) in self.permissions or (namespace is not None and (verb, resource, namespace) in self.permissions)

    def _forbidden(self, verb: str, resource: str, name: str, namespace: str | None) -> Response:
        kind, _, sub = resource.partition("/")
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        subresource = f' subresource "{sub}"' if sub else ""
        return self._refuse(403, "Forbidden", f'{kind} "{name}" is forbidden: User "system:serviceaccount:{ACCOUNT[0]}:{ACCOUNT[1]}" '
                                              f'cannot {verb} resource "{kind}" in API group ""{subresource} {where}')

    def _route(self, request: Request, body) -> Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._refuse(401, "Unauthorized", "Unauthorized")
        name = self.node["metadata"]["name"]
        node_path = re.fullmatch(r"/api/v1/nodes/([^/]+)(/status)?", request.path)
        events_path = re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", request.path)
        if request.method == "PATCH" and node_path:
            resource = "nodes/status" if node_path.group(2) else "nodes"
            if not self._allowed("patch", resource, None):
                return self._forbidden("patch", resource, node_path.group(1), None)
            if node_path.group(1) != name:
                return self._refuse(404, "NotFound", f'nodes "{node_path.group(1)}" not found')
            if not isinstance(body, dict):
                return self._refuse(400, "BadRequest", "the body of the request was in an unknown format")
            if resource == "nodes/status":
                return self._patch_status(request.content_type, body)
            return self._patch_node(request.content_type, body)
        if request.method == "POST" and events_path:
            namespace = events_path.group(1)
            if not self._allowed("create", "events", namespace):
                return self._forbidden("create", "events", "", namespace)
            return self._create_event(namespace, body)
        return self._refuse(404, "NotFound", "the server could not find the requested resource")

    def _bump(self) -> None:
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)

    def _patch_status(self, content_type: str, body: dict) -> Response:
        if content_type != STRATEGIC:
            return self._refuse(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}")
        if set(body) - {"status"} or set(body.get("status", {})) - {"conditions"}:
            return self._refuse(422, "Invalid", f"nodecheck patches only status.conditions: {sorted(body)}")
        before = json.dumps(self.node, sort_keys=True)
        listed = self.node["status"]["conditions"]
        for patch in body.get("status", {}).get("conditions", []):
            if set(patch) - {"type", "status", "reason", "message", "lastHeartbeatTime", "lastTransitionTime"}:
                return self._refuse(422, "Invalid", f"unknown field in a NodeCondition: {sorted(patch)}")
            if patch.get("status") not in ("True", "False", "Unknown"):
                return self._refuse(422, "Invalid", f"status: Unsupported value: {patch.get('status')!r}")
            current = next((c for c in listed if c["type"] == patch["type"]), None)
            if current is None:
                listed.append(dict(patch))
            else:
                current.update(patch)
        if json.dumps(self.node, sort_keys=True) != before:
            self._bump()
        return self._answer(200, self.node)

    def _patch_node(self, content_type: str, body: dict) -> Response:
        if content_type != MERGE:
            return self._refuse(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}")
        version = (body.get("metadata") or {}).get("resourceVersion")
        if self.race_next_write and version is not None:
            self.race_next_write = False
            self._bump()  # another writer got there first
        if version is not None and version != self.node["metadata"]["resourceVersion"]:
            return self._refuse(409, "Conflict", f'Operation cannot be fulfilled on nodes "{self.node["metadata"]["name"]}": '
                                                 "the object has been modified; please apply your changes to the latest version and try again")
        if set(body) - {"metadata", "spec"} or set(body.get("spec") or {}) - {"taints"}:
            return self._refuse(422, "Invalid", f"nodecheck patches only spec.taints: {sorted(body)}")
        before = json.dumps(self.node, sort_keys=True)
        if "taints" in (body.get("spec") or {}):
            self.node["spec"]["taints"] = body["spec"]["taints"]
        if json.dumps(self.node, sort_keys=True) != before:
            self._bump()
        return self._answer(200, self.node)

    def _create_event(self, namespace: str, body) -> Response:
        if not isinstance(body, dict) or body.get("kind") != "Event":
            return self._refuse(400, "BadRequest", "not an Event")
        if body["metadata"].get("namespace") != namespace:
            return self._refuse(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request")
        if any(e["metadata"]["name"] == body["metadata"]["name"] for e in self.events):
            return self._refuse(409, "AlreadyExists", f'events "{body["metadata"]["name"]}" already exists')
        created = copy.deepcopy(body)
        created["metadata"]["uid"] = f"event-{len(self.events)}"
        self.events.append(created)
        return self._answer(201, created)
