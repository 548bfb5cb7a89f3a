"""`serve --kubernetes-conditions` and `--kubernetes-taint` (issue 25, item 2), contract-tested: the exact PATCH
and POST bodies, the retries and their backoff, the taint (only nodecheck's own), and RBAC that grants exactly
what the code asks, against the fake API server of tests/kube_api_server.py over real TLS with the service
account's CA and token. No Kubernetes API server runs here (docs say so)."""

import json
import logging
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from helpers import (
    REPO,
    free_port,
    h100_node_snapshot,
    hgx_nvml,
    kubernetes_objects,
    make_ca_and_certs,
    make_report,
    make_snapshot,
    promtool_check,
    wait_until,
)
from kube_api_server import ACCOUNT, MERGE, NODE, STRATEGIC, TOKEN, Clock, FakeApiServer, granted, serve_in_pod, service_account
from scripted_server import ScriptedServer

from nodecheck.core.errors import NodecheckError
from nodecheck.host.snapshot import open_snapshot
from nodecheck.kubernetes.api import ApiClient, ApiError, Backoff
from nodecheck.kubernetes.node_health import CONDITIONS, EVENT_REPEAT_S, HEARTBEAT_S, TAINT_KEY, NodeHealth, conditions
from nodecheck.pipeline import build_report
from nodecheck.report.findings import Finding

NAME = NODE["metadata"]["name"]
EVERYTHING = granted("rbac.yaml", "rbac-taint.yaml")


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return service_account(tmp_path_factory.mktemp("kube-tls"))


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("kube-reports")
    built = {}
    for name, snap in (("healthy", h100_node_snapshot(root / "h100")),
                       ("nvlink_down", make_snapshot(root / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                                                     nvml_gpus=hgx_nvml(inactive={3: [7]})))):
        built[name] = build_report(open_snapshot(snap, root / f"{name}-work"))
    return built


@pytest.fixture()
def api(tls):
    with FakeApiServer(tls[0], TOKEN, set(EVERYTHING)) as server:
        yield server


def client(tls, port: int, waits: list | None = None, stop_after: int | None = None, attempts: int = 5) -> ApiClient:
    """waits: where the client's sleeps are recorded (nothing sleeps); stop_after: say "stopping" at that wait."""
    def wait(seconds: float) -> bool:
        if waits is not None:
            waits.append(seconds)
        return stop_after is not None and len(waits or []) >= stop_after

    return ApiClient("127.0.0.1", port, tls[1], timeout=10, backoff=Backoff(attempts=attempts), wait=wait, jitter=lambda d: d)


def health(tls, api, clock, taint=False, **options) -> NodeHealth:
    return NodeHealth(client(tls, api.port), NAME, "error", taint, clock=clock, **options)


def warning(kind="nvlink_errors", subject="gpu5") -> Finding:
    return Finding(kind, "warning", subject, "12/s", "<= 1/s", f"{subject} NVLink replay errors rising 12/s")


# -- what is sent
def test_conditions_name_the_gravest_finding_of_each_area_from_real_snapshots(reports):
    broken = {c["type"]: c for c in conditions(reports["nvlink_down"], "error")}
    assert set(broken) == set(CONDITIONS.values())
    gpu = broken["NodecheckGpuProblem"]
    assert (gpu["status"], gpu["reason"]) == ("True", "NvlinkInactive") and gpu["message"].startswith("gpu3 17 of 18 NVLinks active")
    assert (broken["NodecheckFabricProblem"]["status"], broken["NodecheckFabricProblem"]["reason"]) == ("False", "NodecheckFabricOk")
    bandwidth = broken["NodecheckBandwidthProblem"]  # serve measures nothing by itself: never "ok" unmeasured
    assert (bandwidth["status"], bandwidth["reason"]) == ("Unknown", "NodecheckBandwidthUnknown")
    healthy = {c["type"]: c["status"] for c in conditions(reports["healthy"], "error")}
    assert healthy == {"NodecheckGpuProblem": "False", "NodecheckFabricProblem": "False", "NodecheckBandwidthProblem": "Unknown"}
    many = make_report(findings=[Finding("gpu_xid", "error", f"gpu{i}", "Xid 79", "none", "x" * 2000) for i in range(3)])
    gpu = {c["type"]: c for c in conditions(many, "error")}["NodecheckGpuProblem"]
    assert gpu["reason"] == "GpuXid" and len(gpu["message"]) == 1024 and gpu["message"].endswith("... (+2 more)")


def test_the_exact_requests_of_a_first_round(tls, api, reports):
    clock = Clock()
    health(tls, api, clock).sync(reports["nvlink_down"])
    assert [(r["method"], r["path"], r["content_type"]) for r in api.requests] == [
        ("PATCH", f"/api/v1/nodes/{NAME}/status", STRATEGIC),  # {}: reads the node, changes nothing
        ("PATCH", f"/api/v1/nodes/{NAME}/status", STRATEGIC),
        ("POST", "/api/v1/namespaces/default/events", "application/json")]
    assert all(r["authorization"] == f"Bearer {TOKEN}" for r in api.requests)
    assert api.requests[0]["body"] == {}
    now = "2026-11-18T11:06:40Z"
    assert api.requests[1]["body"] == {"status": {"conditions": [
        {"type": "NodecheckGpuProblem", "status": "True", "reason": "NvlinkInactive",
         "message": "gpu3 17 of 18 NVLinks active (gpu0, a sibling of the same model, has 18 up); slot(s) 7 inactive: check `nvidia-smi nvlink -s`, the NVLink bridges, fabric manager, and the NVSwitch tray",
         "lastHeartbeatTime": now, "lastTransitionTime": now},
        {"type": "NodecheckFabricProblem", "status": "False", "reason": "NodecheckFabricOk",
         "message": "fabric: ok (21 check(s) unknown)", "lastHeartbeatTime": now, "lastTransitionTime": now},
        {"type": "NodecheckBandwidthProblem", "status": "Unknown", "reason": "NodecheckBandwidthUnknown",
         "message": "bandwidth: unknown (made by `nodecheck prolog`/`healthcheck` only)", "lastHeartbeatTime": now,
         "lastTransitionTime": now}]}}
    (posted,) = api.events
    assert posted["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NAME, "uid": NODE["metadata"]["uid"]}
    assert (posted["type"], posted["reason"], posted["count"]) == ("Warning", "NodecheckGpuProblem", 1)
    assert posted["metadata"]["namespace"] == "default" and posted["metadata"]["name"].startswith(f"{NAME}.")
    assert posted["source"] == {"component": "nodecheck", "host": NAME} and posted["firstTimestamp"] == now
    # the kubelet's and NPD's conditions are untouched; nothing else in the node moved
    kept = {c["type"]: c for c in NODE["status"]["conditions"]}
    assert {t: c for t, c in api.conditions().items() if t in kept} == kept
    assert api.node["spec"] == NODE["spec"] and api.node["metadata"]["labels"] == NODE["metadata"]["labels"]


def test_patched_on_change_and_at_the_heartbeat_and_the_transition_time_moves_with_the_status(tls, api, reports):
    clock = Clock()
    publisher = health(tls, api, clock)
    publisher.sync(reports["nvlink_down"])
    started = api.conditions()["NodecheckGpuProblem"]["lastTransitionTime"]
    api.requests.clear()
    clock.now += 60
    publisher.sync(reports["nvlink_down"])
    assert api.requests == []  # nothing changed, heartbeat not due: no load on the API server
    clock.now += HEARTBEAT_S
    publisher.sync(reports["nvlink_down"])
    read, beat = api.requests  # what the server holds now (another writer shows there), then the heartbeat
    assert (read["body"], beat["body"]["status"]["conditions"][0]["type"]) == ({}, "NodecheckGpuProblem")
    gpu = api.conditions()["NodecheckGpuProblem"]
    assert gpu["lastTransitionTime"] == started and gpu["lastHeartbeatTime"] > started
    api.requests.clear()
    clock.now += 60
    publisher.sync(reports["healthy"])  # repaired
    gpu = api.conditions()["NodecheckGpuProblem"]
    assert (gpu["status"], gpu["reason"]) == ("False", "NodecheckGpuOk") and gpu["lastTransitionTime"] > started
    assert [(e["type"], e["reason"]) for e in api.events] == [("Warning", "NodecheckGpuProblem"), ("Normal", "NodecheckGpuOk")]


def test_npd_writing_the_same_conditions_is_named_in_the_log_and_an_event(tls, api, reports, caplog):
    """docs/kubernetes.md says to run the NPD plugin or serve's conditions, not both. Both at once overwrite each
    other; serve reads the node at every heartbeat and names the other writer by what only NPD's config writes."""
    clock = Clock()
    publisher = health(tls, api, clock)
    publisher.sync(reports["nvlink_down"])
    assert [e["reason"] for e in api.events] == ["NodecheckGpuProblem"]  # serve's own: no warning of a second writer
    npd = {"type": "NodecheckGpuProblem", "status": "True", "reason": "NodecheckGpuFailing", "message": "gpu3 NVLinks active 17 < 18",
           "lastHeartbeatTime": "2026-11-18T11:07:00Z", "lastTransitionTime": "2026-11-18T11:07:00Z"}
    api.node["status"]["conditions"] = [c for c in api.node["status"]["conditions"] if c["type"] != npd["type"]] + [npd]
    clock.now += HEARTBEAT_S
    with caplog.at_level(logging.WARNING, "nodecheck.serve"):
        publisher.sync(reports["nvlink_down"])
    said = [e for e in api.events if e["reason"] == "NodecheckConditionsShared"]
    assert len(said) == 1 and "NodecheckGpuProblem (reason NodecheckGpuFailing)" in said[0]["message"], api.events
    assert "run one of them" in caplog.text and api.conditions()["NodecheckGpuProblem"]["reason"] == "NvlinkInactive"
    api.node["status"]["conditions"][-1].update(reason="NodecheckGpuFailing")  # NPD writes again
    clock.now += HEARTBEAT_S
    publisher.sync(reports["nvlink_down"])
    assert len([e for e in api.events if e["reason"] == "NodecheckConditionsShared"]) == 1  # said hourly, not each beat


def test_what_npd_writes_is_what_its_shipped_config_says_and_never_what_serve_writes():
    from nodecheck.checks import FINDING_KINDS
    from nodecheck.kubernetes.node_health import NPD_MESSAGES, NPD_REASONS, reason_of

    config = json.loads((REPO / "deploy/kubernetes/npd-nodecheck.json").read_text())
    # the bandwidth condition is not shipped (it needs a bench's file: docs/kubernetes.md gives its rule)
    shipped = {rule["reason"] for rule in config["rules"] if rule["type"] == "permanent"}
    assert shipped <= NPD_REASONS and NPD_REASONS - shipped == {"NodecheckBandwidthFailing"}
    messages = {c["message"] for c in config["conditions"]}
    assert messages <= NPD_MESSAGES and len(NPD_MESSAGES - messages) == 1
    assert not {reason_of(kind) for kind in FINDING_KINDS} & NPD_REASONS


def test_a_restarted_daemon_keeps_the_transition_time_the_server_holds(tls, api, reports):
    health(tls, api, Clock()).sync(reports["nvlink_down"])
    held = api.conditions()["NodecheckGpuProblem"]["lastTransitionTime"]
    later = Clock()
    later.now += 3600
    health(tls, api, later).sync(reports["nvlink_down"])  # a new pod: reads before it writes
    assert api.conditions()["NodecheckGpuProblem"]["lastTransitionTime"] == held
    assert len(api.events) == 1  # the condition did not turn True again: no second event


def test_warning_events_once_per_finding_again_after_the_repeat_and_bounded(tls, api):
    clock = Clock()
    publisher = health(tls, api, clock)
    publisher.sync(make_report(findings=[warning()]))
    publisher.sync(make_report(findings=[warning()]))
    assert [(e["type"], e["reason"], e["message"]) for e in api.events] == [
        ("Warning", "NvlinkErrors", "gpu5 NVLink replay errors rising 12/s")]
    clock.now += EVENT_REPEAT_S  # the API server's event TTL is an hour: posted again to stay visible
    publisher.sync(make_report(findings=[warning()]))
    assert len(api.events) == 2
    publisher.sync(make_report(findings=[]))
    clock.now += 1
    publisher.sync(make_report(findings=[warning()]))  # gone and back: a new event
    assert len(api.events) == 3
    publisher.sync(make_report(findings=[warning(subject=f"gpu{i}") for i in range(100)]))
    assert len(api.events) == 3 + 20 and len({e["metadata"]["name"] for e in api.events}) == len(api.events)


def test_a_transition_event_the_server_refused_is_posted_in_a_later_round(tls, api, reports):
    """The status PATCH landed (the condition is True on the server), the Event's POST did not: the next round
    reads True and sees no transition, so the Event waits in the publisher and goes out then, once."""
    clock = Clock()
    publisher = health(tls, api, clock)
    publisher.sync(reports["healthy"])
    api.permissions.discard(("create", "events", "default"))  # a Role edited by hand, say
    with pytest.raises(ApiError) as refused:
        publisher.sync(reports["nvlink_down"])
    assert refused.value.status == 403 and api.conditions()["NodecheckGpuProblem"]["status"] == "True" and api.events == []
    api.permissions.add(("create", "events", "default"))
    publisher.known = None  # as follow() does after a failed round: read the server afresh
    clock.now += 60
    publisher.sync(reports["nvlink_down"])
    clock.now += 60
    publisher.sync(reports["nvlink_down"])
    assert [(e["type"], e["reason"]) for e in api.events] == [("Warning", "NodecheckGpuProblem")]


def test_a_restarted_daemon_does_not_post_its_predecessors_warnings_again(tls, api):
    """A DaemonSet rollout restarts every pod: the new one posts a lasting warning under the name the old one
    used in the same repeat window, the API server refuses it as AlreadyExists, and no second event appears."""
    clock = Clock()
    health(tls, api, clock).sync(make_report(findings=[warning(), warning(subject="gpu6")]))
    clock.now += 60
    restarted = health(tls, api, clock)
    restarted.sync(make_report(findings=[warning(), warning(subject="gpu6")]))
    refused = [r for r in api.requests if r["method"] == "POST"][2:]
    assert len(api.events) == 2 and len(refused) == 2  # both were tried, both refused by name
    clock.now += EVENT_REPEAT_S  # the next window: posted again, as by one daemon
    restarted.sync(make_report(findings=[warning(), warning(subject="gpu6")]))
    assert len(api.events) == 4


# -- the taint
def test_the_taint_is_nodecheck_s_own_and_every_other_one_is_kept(tls, api, reports):
    clock = Clock()
    publisher = health(tls, api, clock, taint=True)
    others = NODE["spec"]["taints"]
    publisher.sync(reports["nvlink_down"])
    assert api.taints() == [*others, {"key": TAINT_KEY, "effect": "NoSchedule"}]
    write = [r for r in api.requests if r["path"] == f"/api/v1/nodes/{NAME}" and r["body"]][-1]
    assert write["content_type"] == MERGE and write["body"]["metadata"]["resourceVersion"]  # conditional
    api.node["spec"]["taints"].append({"key": "example.com/other", "effect": "NoExecute"})  # an admin, meanwhile
    clock.now += 60
    publisher.sync(reports["healthy"])
    assert api.taints() == [*others, {"key": "example.com/other", "effect": "NoExecute"}]
    clock.now += 60
    publisher.sync(reports["healthy"])
    assert api.taints() == [*others, {"key": "example.com/other", "effect": "NoExecute"}]


def test_a_taint_lifted_by_hand_while_the_problem_lasts_comes_back_at_the_heartbeat(tls, api, reports):
    clock = Clock()
    publisher = health(tls, api, clock, taint=True)
    publisher.sync(reports["nvlink_down"])
    api.node["spec"]["taints"] = [t for t in api.taints() if t["key"] != TAINT_KEY]  # kubectl taint ... -
    clock.now += 60
    publisher.sync(reports["nvlink_down"])
    assert all(t["key"] != TAINT_KEY for t in api.taints())  # not re-read inside the heartbeat
    clock.now += HEARTBEAT_S
    publisher.sync(reports["nvlink_down"])
    assert api.taints() == [*NODE["spec"]["taints"], {"key": TAINT_KEY, "effect": "NoSchedule"}]


def test_a_taint_write_that_lost_a_race_reads_again(tls, api, reports):
    publisher = health(tls, api, Clock(), taint=True)
    api.race_next_write = True
    publisher.sync(reports["nvlink_down"])
    writes = [r for r in api.requests if r["path"] == f"/api/v1/nodes/{NAME}" and r["body"]]
    assert len(writes) == 2 and writes[0]["body"]["metadata"]["resourceVersion"] != writes[1]["body"]["metadata"]["resourceVersion"]
    assert api.taints()[-1] == {"key": TAINT_KEY, "effect": "NoSchedule"} and len(api.taints()) == 3


def test_an_unknown_area_never_taints(tls, api, reports):
    publisher = health(tls, api, Clock(), taint=True)
    publisher.sync(reports["healthy"])  # bandwidth Unknown, the rest ok
    assert api.taints() == NODE["spec"]["taints"]


# -- RBAC: exactly what the code asks
def test_the_rbac_manifests_grant_exactly_what_nodecheck_asks(tls, reports):
    for taint, manifests in ((False, ("rbac.yaml",)), (True, ("rbac.yaml", "rbac-taint.yaml"))):
        permissions = granted(*manifests)
        with FakeApiServer(tls[0], TOKEN, permissions) as server:
            clock = Clock()
            publisher = NodeHealth(client(tls, server.port), NAME, "error", taint, clock=clock)
            publisher.sync(reports["nvlink_down"])
            clock.now += 60
            publisher.sync(make_report(findings=[warning()]))
            used = set()
            for r in server.requests:
                if r["path"].endswith("/events"):
                    used.add(("create", "events", r["path"].split("/")[4]))
                else:
                    used.add(("patch", "nodes/status" if r["path"].endswith("/status") else "nodes", None))
            assert used == permissions, (taint, used ^ permissions)
    with FakeApiServer(tls[0], TOKEN, granted("rbac.yaml")) as server:  # --kubernetes-taint without rbac-taint.yaml
        publisher = NodeHealth(client(tls, server.port), NAME, "error", True, clock=Clock())
        with pytest.raises(ApiError) as refused:
            publisher.sync(reports["nvlink_down"])
    assert refused.value.status == 403 and 'cannot patch resource "nodes"' in str(refused.value)


# -- retries and backoff
def test_retries_what_a_retry_can_cure_with_exponential_backoff(tls, api):
    waits = []
    api.fail_next(503)
    api.fail_next(500, {"kind": "Status", "message": "etcdserver: leader changed", "code": 500})
    api.fail_next(429, b"", {"Retry-After": "3"})
    answer = client(tls, api.port, waits).request("PATCH", f"/api/v1/nodes/{NAME}/status", {}, STRATEGIC)
    assert answer["metadata"]["name"] == NAME and waits == [0.5, 1.0, 3.0]
    waits.clear()
    for _ in range(5):
        api.fail_next(502)
    with pytest.raises(ApiError) as gave_up:
        client(tls, api.port, waits).request("PATCH", f"/api/v1/nodes/{NAME}/status", {}, STRATEGIC)
    assert gave_up.value.status == 502 and waits == [0.5, 1.0, 2.0, 4.0]
    assert Backoff().delay(10, None, lambda d: d) == 30.0 and Backoff().delay(0, 900, lambda d: d) == 30.0


def test_refusals_are_not_retried_and_say_what_the_server_said(tls, api):
    waits = []
    with pytest.raises(ApiError) as wrong_node:
        client(tls, api.port, waits).request("PATCH", "/api/v1/nodes/not-this-one/status", {}, STRATEGIC)
    assert wrong_node.value.status == 404 and 'nodes "not-this-one" not found' in str(wrong_node.value) and waits == []
    (tls[1] / "token").write_text("expired\n")
    try:
        with pytest.raises(ApiError) as unauthorized:
            client(tls, api.port, waits).request("PATCH", f"/api/v1/nodes/{NAME}/status", {}, STRATEGIC)
    finally:
        (tls[1] / "token").write_text(TOKEN + "\n")
    assert unauthorized.value.status == 401 and waits == []
    answer = client(tls, api.port).request("PATCH", f"/api/v1/nodes/{NAME}/status", {}, STRATEGIC)  # token re-read
    assert answer["metadata"]["uid"] == NODE["metadata"]["uid"]


def test_a_stopping_daemon_ends_its_retries_and_an_absent_server_is_an_error(tls, api):
    waits = []
    api.fail_next(503)
    api.fail_next(503)
    with pytest.raises(ApiError):
        client(tls, api.port, waits, stop_after=1).request("PATCH", f"/api/v1/nodes/{NAME}/status", {}, STRATEGIC)
    assert waits == [0.5]
    waits.clear()
    with pytest.raises(ApiError) as refused:
        client(tls, free_port(), waits, attempts=2).request("PATCH", f"/api/v1/nodes/{NAME}/status", {}, STRATEGIC)
    assert refused.value.status == 0 and "no answer" in str(refused.value) and waits == [0.5]


@pytest.mark.parametrize("body, what", [
    (b"x" * (5 * 1024 * 1024), "larger than 4 MiB"),
    (b"<html>gateway</html>", "not a JSON object"),
    (b"[1, 2]", "not a JSON object"),
])
def test_a_hostile_answer_is_an_error_not_a_crash(tls, api, body, what):
    for _ in range(5):
        api.fail_next(200, body)
    with pytest.raises(ApiError) as refused:
        client(tls, api.port, []).request("PATCH", f"/api/v1/nodes/{NAME}/status", {}, STRATEGIC)
    assert what in str(refused.value)


def test_a_server_whose_certificate_the_account_s_ca_did_not_sign_is_refused(tls, api, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    make_ca_and_certs(other)
    (other / "token").write_text(TOKEN)
    (other / "ca.crt").write_bytes((other / "ca.pem").read_bytes())
    with pytest.raises(ApiError) as refused:
        ApiClient("127.0.0.1", api.port, other, backoff=Backoff(attempts=1)).request("PATCH", f"/api/v1/nodes/{NAME}/status", {})
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value) and api.requests == []


def test_in_cluster_configuration_errors_are_clear(tls, tmp_path):
    with pytest.raises(NodecheckError, match="KUBERNETES_SERVICE_HOST is not set"):
        ApiClient.in_cluster({}, tls[1])
    with pytest.raises(NodecheckError, match="not a port"):
        ApiClient.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "https"}, tls[1])
    (tmp_path / "ca.crt").write_bytes((tls[1] / "ca.crt").read_bytes())
    with pytest.raises(NodecheckError, match="service account token .*token: No such file"):
        ApiClient.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, tmp_path)
    (tmp_path / "token").write_text("two words\n")
    with pytest.raises(NodecheckError, match="not a token"):
        ApiClient.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, tmp_path)
    assert ApiClient.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}, tls[1]).host == "fd00::1"


# -- the daemon
def test_follow_publishes_in_its_own_thread_and_survives_a_refusing_server(tls, api, reports, caplog):
    caplog.set_level(logging.INFO, "nodecheck.serve")
    publisher = health(tls, api, Clock())
    stop = threading.Event()
    worker = threading.Thread(target=publisher.follow, args=(stop,), daemon=True)
    worker.start()
    assert publisher.exposition() == b""  # nothing said before the first round
    try:
        api.fail_next(403, {"kind": "Status", "message": "nodes \"gpu-node-7\" is forbidden", "code": 403})
        publisher.offer(reports["nvlink_down"])
        wait_until(lambda: "Kubernetes conditions not published" in caplog.text, 30, "the refusal logged")
        failing = publisher.exposition().decode()
        assert "nodecheck_kubernetes_publish_success 0.0" in failing and "last_success_timestamp" not in failing
        publisher.offer(reports["nvlink_down"])
        wait_until(lambda: api.conditions().get("NodecheckGpuProblem", {}).get("status") == "True", 30, "the condition")
        wait_until(lambda: "published again" in caplog.text, 30, "the recovery logged")
        published = publisher.exposition().decode()
        assert "nodecheck_kubernetes_publish_success 1.0" in published
        assert "nodecheck_kubernetes_publish_last_success_timestamp_seconds 1.7" in published
    finally:
        stop.set()
        publisher.offer(reports["healthy"])
        worker.join(30)
    assert not worker.is_alive() and "is forbidden" in caplog.text


def test_serve_publishes_the_conditions_and_the_taint(tls, api, tmp_path):
    """The daemon as the DaemonSet runs it: in-cluster environment, the account directory, NODE_NAME."""
    proc, port = serve_in_pod(api.port, tls[1], tmp_path, "--kubernetes-conditions", "--kubernetes-taint")
    try:
        wait_until(lambda: api.conditions().get("NodecheckGpuProblem", {}).get("status") == "True", 60, "the condition")
        wait_until(lambda: any(t["key"] == TAINT_KEY for t in api.taints()), 60, "the taint")
        metrics = wait_until(lambda: scrape(port) if b"nodecheck_kubernetes_publish_success 1.0" in scrape(port) else None, 60,
                             "the publisher's own series")
        assert b"nodecheck_probe_success" in metrics
        assert promtool_check(metrics.decode()).returncode == 0  # the two expositions make one clean one
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "set taint nodecheck/unhealthy:NoSchedule" in out


def scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read()


@pytest.mark.parametrize("args, env, message", [
    (["--kubernetes-conditions"], {}, "no node name"),
    (["--kubernetes-conditions", "--kubernetes-node", "Bad_Name"], {}, "is not a Kubernetes node name"),
    (["--kubernetes-taint", "--kubernetes-node", "n1"], {}, "needs --kubernetes-conditions"),
    (["--kubernetes-conditions", "--kubernetes-node", "n1"], {}, "KUBERNETES_SERVICE_HOST is not set"),
])
def test_kubernetes_options_fail_clearly_before_serving(tmp_path, args, env, message):
    run = subprocess.run([sys.executable, "-m", "nodecheck", "serve", "--listen", f"127.0.0.1:{free_port()}", *args],
                         env={"PATH": "/usr/bin:/bin", "STATE_DIRECTORY": str(tmp_path), **env}, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and message in " ".join((run.stdout + run.stderr).split()), run.stdout + run.stderr


def test_the_manifests_agree_with_the_code():
    """The DaemonSet runs as the account the Roles bind, names its node, and tolerates its own taint (a restarted
    pod must land on a tainted node to lift the taint); NPD's plugin and serve name the same conditions."""
    objects = kubernetes_objects("daemonset.yaml")
    daemonset, account = objects["DaemonSet"], objects["ServiceAccount"]
    pod = daemonset["spec"]["template"]["spec"]
    assert (account["metadata"]["namespace"], account["metadata"]["name"]) == ACCOUNT
    assert (daemonset["metadata"]["namespace"], pod["serviceAccountName"]) == ACCOUNT
    assert {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    npd = json.loads((REPO / "deploy/kubernetes/npd-nodecheck.json").read_text())
    assert {(c["type"], c["reason"]) for c in npd["conditions"]} == {
        (kind, f"Nodecheck{area.capitalize()}Ok") for area, kind in CONDITIONS.items() if area != "bandwidth"}


def trickled_header(conn, stop) -> None:
    """A status line, then one header byte every 0.2 s, for ever: a per-read timeout never trips on it."""
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while not stop.wait(0.2):
        conn.sendall(b"X")


def test_a_server_that_trickles_its_header_is_cut_off_at_the_calls_deadline(tls, reports, caplog):
    """It hung `serve --kubernetes-conditions` for ever with nodecheck_kubernetes_publish_success at 1 and no log
    line. Each call now has one deadline for the whole of it: past it the call fails, is logged and exported."""
    caplog.set_level(logging.INFO, "nodecheck.serve")
    with ScriptedServer(trickled_header, tls[0]) as server:
        api = ApiClient("127.0.0.1", server.port, tls[1], timeout=1.0, backoff=Backoff(attempts=2), wait=lambda s: False,
                        jitter=lambda d: d)
        started = time.monotonic()
        with pytest.raises(ApiError, match="deadline"):
            api.request("GET", f"/api/v1/nodes/{NAME}")
        assert time.monotonic() - started < 10  # two attempts of 1 s each, not for ever
        publisher = NodeHealth(api, NAME, "error", False, clock=Clock())
        stop = threading.Event()
        worker = threading.Thread(target=publisher.follow, args=(stop,), daemon=True)
        worker.start()
        try:
            publisher.offer(reports["nvlink_down"])
            wait_until(lambda: "Kubernetes conditions not published" in caplog.text, 30, "the failure logged")
            assert "nodecheck_kubernetes_publish_success 0.0" in publisher.exposition().decode()
        finally:
            stop.set()
            publisher.offer(reports["healthy"])
            worker.join(30)
        assert not worker.is_alive()


def test_an_api_servers_words_reach_the_log_plain_and_a_deep_answer_is_an_error(tls, api):
    api.fail_next(500, {"kind": "Status", "message": "boom \x1b]0;owned\x07 here", "code": 500})
    with pytest.raises(ApiError) as raised:
        client(tls, api.port, attempts=1).request("GET", f"/api/v1/nodes/{NAME}")
    assert "\x1b" not in str(raised.value) and "boom ?]0;owned? here" in str(raised.value)
    api.fail_next(200, b"[" * 100_000)
    with pytest.raises(ApiError, match="not a JSON object"):
        client(tls, api.port, attempts=1).request("GET", f"/api/v1/nodes/{NAME}")
