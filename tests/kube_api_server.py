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
  node. Every change bumps resourceVersion.
- resource.k8s.io (ResourceSlices, DeviceTaintRules) when a test gives it a kube_dra.DraState; 404 otherwise."""

from __future__ import annotations

import copy
import json
import re
import ssl
import threading

from helpers import REPO, make_ca_and_certs
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

NODE = json.loads((REPO / "tests/fixtures/kubernetes/node-hgx.json").read_text())
TOKEN = "eyJhbGciOiJSUzI1NiJ9.nodecheck-test-token.c2lnbmF0dXJl"  # noqa: S105 - the fake server's own
T0 = 1_795_000_000.0  # 2026-11-18T11:06:40Z: the fake clock's start
ACCOUNT = ("monitoring", "nodecheck")
STRATEGIC, MERGE = "application/strategic-merge-patch+json", "application/merge-patch+json"


def service_account(root) -> tuple[ssl.SSLContext, object]:
    """(the server's TLS context, the service account directory under root: token and ca.crt)."""
    make_ca_and_certs(root)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(root / "server.pem", root / "server.key")
    account = root / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN + "\n")
    (account / "ca.crt").write_bytes((root / "ca.pem").read_bytes())
    return context, account


class Clock:
    """The publisher's wall clock, moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def serve_in_pod(api_port: int, account, work, *flags: str):
    """`nodecheck serve` as the DaemonSet runs it (in-cluster environment, the account directory, NODE_NAME) on the
    HGX snapshot whose gpu3 has an NVLink down: (the process, its metrics port)."""
    import subprocess
    import sys

    from helpers import free_port, hgx_nvml, make_snapshot

    snap = make_snapshot(work / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml(inactive={3: [7]}))
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api_port),
           "NODE_NAME": NODE["metadata"]["name"], "STATE_DIRECTORY": str(work / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "nodecheck", "serve", "--from", str(snap), "--listen", f"127.0.0.1:{port}",
                             *flags, "--kubernetes-credentials", str(account)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, port


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
                assert rule["apiGroups"] in ([""], ["resource.k8s.io"])  # the core group; DRA's (kube_dra.py)
                out |= {(verb, resource, namespace) for verb in rule["verbs"] for resource in rule["resources"]}
    return out


def status_document(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeApiServer:
    def __init__(self, ssl_context, token: str, permissions: set, node: dict | None = None, dra=None) -> None:
        self.node = copy.deepcopy(node or NODE)
        self.dra = dra  # kube_dra.DraState: resource.k8s.io's ResourceSlices and DeviceTaintRules; None: not served
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
            self.requests.append({"method": request.method, "path": request.path, "query": request.query_string.decode(),
                                  "content_type": request.content_type,
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

    def _forbidden(self, verb: str, resource: str, name: str, namespace: str | None, group: str = "") -> Response:
        kind, _, sub = resource.partition("/")
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        subresource = f' subresource "{sub}"' if sub else ""
        qualified = f"{kind}.{group}" if group else kind
        return self._refuse(403, "Forbidden", f'{qualified} "{name}" is forbidden: User "system:serviceaccount:{ACCOUNT[0]}:{ACCOUNT[1]}" '
                                              f'cannot {verb} resource "{kind}" in API group "{group}"{subresource} {where}')

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
        if request.path.startswith("/apis/resource.k8s.io/") and self.dra is not None:
            return self.dra.route(self, request, body, request.path.split("/")[3:])
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
