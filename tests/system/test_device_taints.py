"""`serve --kubernetes-device-taints` (issue 53), contract-tested against the fake API server (tests/kube_api_server.py
with its DRA part, tests/kube_dra.py) over real TLS: the exact requests, the DeviceTaintRule bodies validated
strictly against the schema of the Kubernetes release serving each version, only nodecheck's own rules touched, the
share a node may lose device by device, the node taint speaking for what no rule can, conflicts, a 403, a slice that
changes, a server without DRA, and RBAC that grants exactly what the code asks. The ResourceSlices are the published
EKS node's (tests/fixtures/README.md), given this node's name and its GPUs' UUIDs and PCI addresses."""

import copy
import re
import signal
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest
import yaml
from helpers import REPO, free_port, hgx_nvml, make_gpu, make_report, make_snapshot, promtool_check, wait_until
from kube_api_server import NODE, T0, TOKEN, Clock, FakeApiServer, granted, serve_in_pod, service_account
from kube_dra import DraState

from nodecheck.host.snapshot import open_snapshot
from nodecheck.kubernetes.api import ApiClient, ApiError, Backoff
from nodecheck.kubernetes.device_taints import DeviceTaints
from nodecheck.kubernetes.node_health import HEARTBEAT_S, TAINT_KEY, NodeHealth
from nodecheck.pipeline import build_report
from nodecheck.report.findings import Finding

NAME = NODE["metadata"]["name"]
EVERYTHING = granted("rbac.yaml", "rbac-taint.yaml", "rbac-device-taints.yaml")
RULES = "/apis/resource.k8s.io/v1/devicetaintrules"
SELECTOR = urllib.parse.urlencode({"labelSelector": f"app.kubernetes.io/managed-by=nodecheck,nodecheck/node={NAME}"})


def hgx_pci(i: int) -> str:
    return f"0000:{0x18 + i * 0x10:02x}:00.0"  # tests/helpers.py hgx_nvml's bus ids


def hgx_slices() -> list[dict]:
    """The published EKS node's slices as this node's: its name, and gpu-N holding GPU N's UUID and PCI address."""
    eks = yaml.safe_load((REPO / "tests/fixtures/kubernetes/resourceslices-eks-h100x8-v1.yaml").read_text())
    slices = []
    for item in copy.deepcopy(eks["items"]):
        item["spec"]["nodeName"] = item["spec"]["pool"]["name"] = NAME
        for device in item["spec"]["devices"]:
            if item["spec"]["driver"] == "gpu.nvidia.com":
                n = int(device["name"].removeprefix("gpu-"))
                device["attributes"]["uuid"] = {"string": f"GPU-hgx-{n}"}
                device["attributes"]["resource.kubernetes.io/pciBusID"] = {"string": hgx_pci(n)}
        slices.append(item)
    other = copy.deepcopy(slices[-1])  # another node's slice, listing the same UUIDs: never read
    other["spec"]["nodeName"] = other["spec"]["pool"]["name"] = "gpu-node-8"
    return [*slices, other]


def gpus():
    return [make_gpu(i, uuid=f"GPU-hgx-{i}", pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0") for i in range(8)]


def xid(gpu: int, message: str = "Xid 79 (GPU has fallen off the bus)") -> Finding:
    return Finding("gpu_xid", "error", f"gpu{gpu}", "Xid 79", "none", f"gpu{gpu} {message}: reset the GPU")


def report(*findings: Finding):
    return make_report(gpus=gpus(), findings=list(findings))


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return service_account(tmp_path_factory.mktemp("kube-tls"))


def server(tls, permissions=EVERYTHING, **dra):
    return FakeApiServer(tls[0], TOKEN, set(permissions), dra=DraState(hgx_slices(), **dra))


@pytest.fixture()
def api(tls):
    with server(tls) as running:
        yield running


def client(tls, port: int, attempts: int = 5) -> ApiClient:
    return ApiClient("127.0.0.1", port, tls[1], timeout=10, backoff=Backoff(attempts=attempts), wait=lambda s: False,
                     jitter=lambda d: d)


def publisher(tls, api, clock, taint=False, effect="NoSchedule", share=0.5) -> NodeHealth:
    api_client = client(tls, api.port)
    devices = DeviceTaints(api_client, NAME, "error", effect, share)
    return NodeHealth(api_client, NAME, "error", taint, clock=clock, device_taints=devices)


def rules(api) -> dict[str, tuple]:
    """name -> (device, taint key, value, effect) of the rules the server holds."""
    return {name: (r["spec"]["deviceSelector"]["device"], r["spec"]["taint"]["key"], r["spec"]["taint"].get("value"),
                   r["spec"]["taint"]["effect"]) for name, r in api.dra.rules.items()}


def node_tainted(api) -> bool:
    return any(t["key"] == TAINT_KEY for t in api.taints())


def reasons(api) -> list[str]:
    return [e["reason"] for e in api.events]


# -- what is sent
def test_the_exact_requests_and_rule_of_a_first_round(tls, api):
    publisher(tls, api, Clock()).sync(report(xid(3)))
    dra = [(r["method"], r["path"], r["query"]) for r in api.requests if r["path"].startswith("/apis/")]
    assert dra == [("GET", RULES, SELECTOR), ("GET", "/apis/resource.k8s.io/v1/resourceslices", "fieldSelector=spec.nodeName%3Dgpu-node-7"),
                   ("POST", RULES, "")]
    (created,) = [r["body"] for r in api.requests if r["method"] == "POST" and r["path"] == RULES]
    name = created["metadata"]["name"]
    assert name.startswith("nodecheck.gpu-node-7.gpu-3.gpu-xid.") and created == {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "nodecheck", "nodecheck/node": NAME},
                     "annotations": {"nodecheck/node": NAME, "nodecheck/gpu": "gpu3",
                                     "nodecheck/message": "gpu3 Xid 79 (GPU has fallen off the bus): reset the GPU"}},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": NAME, "device": "gpu-3"},
                 "taint": {"key": "nodecheck/gpu_xid", "value": "gpu3", "effect": "NoSchedule"}}}
    assert api.dra.rules[name]["spec"]["taint"]["timeAdded"]  # the server's
    tainted = [e for e in api.events if e["reason"] == "NodecheckDeviceTainted"]
    assert len(tainted) == 1 and tainted[0]["type"] == "Warning" and tainted[0]["message"].startswith(
        "gpu3 tainted nodecheck/gpu_xid:NoSchedule by DeviceTaintRule: gpu3 Xid 79")
    assert api.conditions()["NodecheckGpuProblem"]["status"] == "True"  # the node condition still says it


def test_nothing_is_asked_again_until_a_finding_changes_or_the_heartbeat(tls, api):
    clock = Clock()
    health = publisher(tls, api, clock)
    health.sync(report(xid(3)))
    api.requests.clear()
    clock.now += 60
    health.sync(report(xid(3)))
    assert [r for r in api.requests if r["path"].startswith("/apis/")] == []
    health.sync(report(xid(3), xid(5)))
    assert sorted(d for d, *_ in rules(api).values()) == ["gpu-3", "gpu-5"]


def test_the_rule_goes_when_the_finding_clears_and_one_deleted_by_hand_comes_back_at_the_heartbeat(tls, api):
    clock = Clock()
    health = publisher(tls, api, clock)
    health.sync(report(xid(3)))
    (name,) = api.dra.rules
    del api.dra.rules[name]  # kubectl delete devicetaintrule ...
    clock.now += 60
    health.sync(report(xid(3)))
    assert api.dra.rules == {}  # not read again inside the heartbeat
    clock.now += HEARTBEAT_S
    health.sync(report(xid(3)))
    assert list(api.dra.rules) == [name]
    clock.now += 60
    health.sync(report())  # repaired (and, for an Xid, `nodecheck clear`ed)
    assert api.dra.rules == {} and reasons(api).count("NodecheckDeviceTaintLifted") == 1
    lifted = next(e for e in api.events if e["reason"] == "NodecheckDeviceTaintLifted")
    assert lifted["type"] == "Normal" and lifted["message"] == "nodecheck/gpu_xid lifted from gpu3: the finding cleared"


def test_a_restarted_pod_takes_over_its_predecessors_rules_and_touches_no_other(tls, api):
    publisher(tls, api, Clock()).sync(report(xid(3), xid(4)))
    admin = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": "maintenance-gpu-1"},
             "spec": {"deviceSelector": {"device": "gpu-1"}, "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}}
    neighbour = copy.deepcopy(next(iter(api.dra.rules.values())))
    neighbour["metadata"]["name"] = "nodecheck.gpu-node-8.gpu-3.gpu-xid.00000000"
    neighbour["metadata"]["labels"]["nodecheck/node"] = neighbour["metadata"]["annotations"]["nodecheck/node"] = "gpu-node-8"
    api.dra.rules.update({admin["metadata"]["name"]: admin, neighbour["metadata"]["name"]: neighbour})
    api.requests.clear()
    later = Clock()
    later.now += 3600
    publisher(tls, api, later).sync(report(xid(4)))  # a new pod: gpu3 repaired meanwhile
    assert sorted(rules(api)) == sorted(["maintenance-gpu-1", "nodecheck.gpu-node-8.gpu-3.gpu-xid.00000000",
                                         next(n for n in api.dra.rules if ".gpu-4." in n)])
    writes = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in api.requests if r["method"] in ("POST", "PUT", "DELETE")
              and r["path"].startswith("/apis/")]
    assert len(writes) == 1 and writes[0][0] == "DELETE" and ".gpu-3." in writes[0][1]  # gpu4's rule kept as it was


def test_a_gpu_fallen_off_the_bus_is_tainted_by_its_address(tls, api):
    """NVML lists seven GPUs; the driver still manages gpu3's address, the Xid names it (pci:...), and the slice
    still lists the device there."""
    seven = [g for g in gpus() if g.index != 3]
    lost = Finding("gpu_xid", "error", f"pci:{hgx_pci(3)}", "Xid 79", "none", f"pci:{hgx_pci(3)} Xid 79 (GPU has fallen off the bus)")
    aer = Finding("pcie_aer_fatal", "error", "pci:0000:47:00.0", 1, 0, "the switch port above it: fatal AER")  # not a GPU
    publisher(tls, api, Clock(), taint=True).sync(make_report(gpus=seven, driver_gpus=[hgx_pci(i) for i in range(8)],
                                                              findings=[lost, aer]))
    assert list(rules(api).values()) == [("gpu-3", "nodecheck/gpu_xid", "pci-0000-48-00.0", "NoSchedule")]
    assert node_tainted(api)  # for the switch port


# -- the node and its share
def test_with_the_node_taint_a_gpus_finding_takes_the_device_and_the_rest_the_node(tls, api):
    clock = Clock()
    health = publisher(tls, api, clock, taint=True)
    health.sync(report(xid(3)))
    assert list(rules(api).values()) == [("gpu-3", "nodecheck/gpu_xid", "gpu3", "NoSchedule")] and not node_tainted(api)
    clock.now += 60
    pair = Finding("nvlink_inactive", "error", "gpu0-gpu1", 17, 18, "gpu0-gpu1 NVLink down")  # which of the two?
    health.sync(report(xid(3), pair))
    assert node_tainted(api) and len(api.dra.rules) == 1
    clock.now += 60
    health.sync(report(xid(3)))
    assert not node_tainted(api)


def test_past_the_share_no_device_is_newly_tainted_and_the_node_speaks(tls, api):
    clock = Clock()
    health = publisher(tls, api, clock, taint=True)
    health.sync(report(*(xid(i) for i in range(5))))
    assert api.dra.rules == {} and node_tainted(api)
    (withheld,) = [e for e in api.events if e["reason"] == "NodecheckDeviceTaintsWithheld"]
    assert "5 of 8 GPUs have failing findings, more than the 4 (0.5 of them)" in withheld["message"]
    assert b"nodecheck_kubernetes_device_taints_withheld_gpus 5.0" in metrics_after(health)
    clock.now += 60
    health.sync(report(xid(2), xid(6)))
    assert sorted(d for d, *_ in rules(api).values()) == ["gpu-2", "gpu-6"] and not node_tainted(api)
    assert b"nodecheck_kubernetes_device_taint_rules 2.0" in metrics_after(health)
    clock.now += 60
    health.sync(report(*(xid(i) for i in range(8))))  # past it again: the two rules stay, none is added, the node speaks
    assert sorted(d for d, *_ in rules(api).values()) == ["gpu-2", "gpu-6"] and node_tainted(api)
    assert "the rules of gpu2, gpu6 kept" in api.events[-1]["message"]


def metrics_after(health: NodeHealth) -> bytes:
    health.record_round(True)
    return health.exposition()


@pytest.mark.parametrize("dra, said", [
    (None, "serves no ResourceSlice (no DRA)"),
    ({"slice_versions": ("v1",), "rule_versions": ()}, "serves no DeviceTaintRule"),
])
def test_without_dra_the_node_acts_and_says_so_once(tls, dra, said):
    with FakeApiServer(tls[0], TOKEN, set(EVERYTHING), dra=None if dra is None else DraState(hgx_slices(), **dra)) as api:
        clock = Clock()
        health = publisher(tls, api, clock, taint=True)
        health.sync(report(xid(3)))
        assert node_tainted(api)
        (event,) = [e for e in api.events if e["reason"] == "NodecheckDeviceTaintsWithheld"]
        assert said in event["message"]
        probed = [r["path"] for r in api.requests if r["path"].startswith("/apis/")]
        assert all(p.endswith(("/resourceslices", "/devicetaintrules")) for p in probed) and len(probed) <= 6
        api.requests.clear()
        clock.now += HEARTBEAT_S
        health.sync(report(xid(3)))
        again = [r["path"] for r in api.requests if r["path"].startswith("/apis/")]  # what is not served: asked once
        assert again == ([] if dra is None else ["/apis/resource.k8s.io/v1/resourceslices"])
        assert reasons(api).count("NodecheckDeviceTaintsWithheld") == 1


def test_a_node_no_slice_lists_keeps_its_gpus_with_the_node(tls):
    with FakeApiServer(tls[0], TOKEN, set(EVERYTHING), dra=DraState([s for s in hgx_slices() if s["spec"]["nodeName"] != NAME])) as api:
        publisher(tls, api, Clock(), taint=True).sync(report(xid(3)))
        assert api.dra.rules == {} and node_tainted(api)
        (event,) = [e for e in api.events if e["reason"] == "NodecheckDeviceTaintsWithheld"]
        assert "no ResourceSlice lists a device of node gpu-node-7" in event["message"] and "gpu3: no DRA device" in event["message"]


@pytest.mark.parametrize("version", ["v1beta2", "v1alpha3"])
def test_an_older_release_gets_its_own_version_of_the_rule(tls, version):
    with server(tls, rule_versions=(version,), slice_versions=("v1beta1",)) as api:
        health = publisher(tls, api, Clock())
        health.sync(report(xid(3)))
        (rule,) = api.dra.rules.values()  # the fake server validated it against that release's schema
        assert rule["apiVersion"] == f"resource.k8s.io/{version}" and rule["spec"]["deviceSelector"]["device"] == "gpu-3"
        created = [r for r in api.requests if r["method"] == "POST" and "devicetaintrules" in r["path"]]
        assert created[0]["path"] == f"/apis/resource.k8s.io/{version}/devicetaintrules"


# -- conflicts, changes, refusals
def test_a_replace_that_lost_a_race_reads_again_and_the_effect_change_restarts_time_added(tls, api):
    publisher(tls, api, Clock()).sync(report(xid(3)))
    (name,) = api.dra.rules
    first_added = api.dra.rules[name]["spec"]["taint"]["timeAdded"]
    api.dra.race_next_write = True
    publisher(tls, api, Clock(), effect="NoExecute").sync(report(xid(3)))  # reconfigured, restarted
    puts = [r for r in api.requests if r["method"] == "PUT"]
    assert len(puts) == 2 and puts[0]["body"]["metadata"]["resourceVersion"] != puts[1]["body"]["metadata"]["resourceVersion"]
    assert puts[1]["body"]["spec"]["taint"]["timeAdded"] == first_added  # sent as read: the server restarts it
    taint = api.dra.rules[name]["spec"]["taint"]
    assert taint["effect"] == "NoExecute" and taint["timeAdded"] != first_added
    restarted = taint["timeAdded"]
    clock = Clock()
    clock.now += HEARTBEAT_S
    publisher(tls, api, clock, effect="NoExecute").sync(report(xid(3, "Xid 79 again")))  # a new message: the same eviction
    assert api.dra.rules[name]["spec"]["taint"]["timeAdded"] == restarted
    assert api.dra.rules[name]["metadata"]["annotations"]["nodecheck/message"] == "gpu3 Xid 79 again: reset the GPU"


def test_a_slice_that_changes_moves_the_rule_at_the_heartbeat(tls, api):
    clock = Clock()
    health = publisher(tls, api, clock)
    health.sync(report(xid(3)))
    assert [d for d, *_ in rules(api).values()] == ["gpu-3"]
    gpu_slice = next(s for s in api.dra.slices if s["spec"]["driver"] == "gpu.nvidia.com" and s["spec"]["nodeName"] == NAME)
    gpu_slice["spec"]["pool"]["generation"] += 1  # the driver restarted and names its devices anew
    for device in gpu_slice["spec"]["devices"]:
        device["name"] = device["name"].replace("gpu-", "gpu-1")
    clock.now += HEARTBEAT_S
    health.sync(report(xid(3)))
    assert [d for d, *_ in rules(api).values()] == ["gpu-13"]


def test_a_refused_rule_leaves_the_node_taint_to_speak_and_fails_the_round(tls):
    without = {p for p in EVERYTHING if p[1] != "devicetaintrules" or p[0] == "list"}
    with server(tls, without) as api:
        health = publisher(tls, api, Clock(), taint=True)
        with pytest.raises(ApiError) as refused:
            health.sync(report(xid(3)))
        assert refused.value.status == 403 and 'devicetaintrules.resource.k8s.io' in str(refused.value)
        assert 'cannot create resource "devicetaintrules" in API group "resource.k8s.io"' in str(refused.value)
        assert node_tainted(api) and api.conditions()["NodecheckGpuProblem"]["status"] == "True"


def test_an_api_server_gone_is_an_error_and_the_next_round_reads_afresh(tls, api):
    devices = DeviceTaints(client(tls, free_port(), attempts=1), NAME)
    with pytest.raises(ApiError) as gone:
        devices.sync(report(xid(3)), T0)
    assert gone.value.status == 0 and devices.held is None and devices.versions == {}
    devices.api = client(tls, api.port)
    assert devices.sync(report(xid(3)), T0 + 1).covered == {("gpu_xid", "gpu3")} and len(api.dra.rules) == 1


def test_hostile_answers_are_read_as_nothing_or_refused_never_a_crash(tls, api):
    devices = DeviceTaints(client(tls, api.port, attempts=1), NAME)
    api.fail_next(200, {"kind": "DeviceTaintRuleList", "items": [{"metadata": 5}, None, {"metadata": {"name": ["x"]}}]})
    api.fail_next(200, {"kind": "ResourceSliceList", "items": "x" * 1000})
    outcome = devices.sync(report(xid(3)), T0)
    assert outcome.covered == set() and api.dra.rules == {} and devices.withheld == 1
    assert "no ResourceSlice lists a device of node gpu-node-7" in outcome.events[0][2]
    api.fail_next(200, b"<html>a proxy's page</html>")
    with pytest.raises(ApiError, match="not a JSON object"):
        devices.sync(report(xid(3), xid(4)), T0 + 1)
    assert devices.held is None  # read again next round
    assert devices.sync(report(xid(3), xid(4)), T0 + 2).covered == {("gpu_xid", "gpu3"), ("gpu_xid", "gpu4")}


def test_the_rbac_manifest_grants_exactly_what_device_taints_ask(tls):
    permissions = granted("rbac.yaml", "rbac-device-taints.yaml")
    with server(tls, permissions) as api:
        clock = Clock()
        health = publisher(tls, api, clock)
        health.sync(report(xid(3)))
        clock.now += HEARTBEAT_S
        health.sync(report(xid(3, "Xid 79 twice")))  # a new message: replaced at the heartbeat
        clock.now += 60
        health.sync(report())
        verbs = {"GET": "list", "POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}
        used = set()
        for r in api.requests:
            if r["path"].endswith("/events"):
                used.add(("create", "events", "default"))
            elif r["path"].startswith("/apis/"):
                used.add((verbs[r["method"]], r["path"].split("/")[4], None))
            else:
                used.add(("patch", "nodes/status", None))
        assert used == permissions, used ^ permissions
        assert all(r["method"] != "GET" or "/apis/" in r["path"] for r in api.requests)  # list, never get


# -- the daemon
def test_serve_holds_a_device_taint_for_the_gpu_with_a_link_down(tls, api, tmp_path):
    """As the DaemonSet runs it, with the HGX snapshot whose gpu3 has an NVLink down."""
    proc, port = serve_in_pod(api.port, tls[1], tmp_path, "--kubernetes-conditions", "--kubernetes-taint", "--kubernetes-device-taints")
    try:
        wait_until(lambda: api.dra.rules, 60, "the device taint")
        metrics = wait_until(lambda: scrape(port) if b"nodecheck_kubernetes_device_taint_rules 1.0" in scrape(port) else None,
                             60, "the device-taint series")
        assert promtool_check(metrics.decode()).returncode == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert list(rules(api).values()) == [("gpu-3", "nodecheck/nvlink_inactive", "gpu3", "NoSchedule")]
    assert not node_tainted(api) and "gpu3 tainted nodecheck/nvlink_inactive:NoSchedule" in out
    (held,) = copy.deepcopy(list(api.dra.rules.values()))  # what docs/kubernetes.md shows, less what the server adds
    del held["spec"]["taint"]["timeAdded"]
    for added in ("uid", "generation", "creationTimestamp", "resourceVersion"):
        del held["metadata"][added]
    shown = [d for block in re.findall(r"```yaml\n(.*?)```", (REPO / "docs/kubernetes.md").read_text(), re.S)
             for d in yaml.safe_load_all(block) if isinstance(d, dict) and d.get("kind") == "DeviceTaintRule"]
    assert shown == [held]


def scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read()


@pytest.mark.parametrize("args, message", [
    (["--kubernetes-device-taints"], "needs --kubernetes-conditions"),
    (["--kubernetes-conditions", "--kubernetes-device-taint-effect", "NoExecute"], "goes with --kubernetes-device-taints"),
    (["--kubernetes-conditions", "--kubernetes-device-taints", "--kubernetes-device-taint-effect", "PreferNoSchedule"],
     "one of NoSchedule, NoExecute, None"),
    (["--kubernetes-conditions", "--kubernetes-device-taints", "--kubernetes-device-taint-max-share", "0"], "above 0 and at most 1"),
    (["--kubernetes-conditions", "--kubernetes-device-taints", "--kubernetes-device-taint-max-share", "nan"], "above 0 and at most 1"),
])
def test_device_taint_options_fail_clearly_before_serving(tmp_path, args, message):
    run = subprocess.run([sys.executable, "-m", "nodecheck", "serve", "--listen", f"127.0.0.1:{free_port()}",
                          "--kubernetes-node", "n1", *args],
                         env={"PATH": "/usr/bin:/bin", "STATE_DIRECTORY": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and message in " ".join((run.stdout + run.stderr).split()), run.stdout + run.stderr


def test_the_snapshots_gpus_map_to_the_slices_devices(tmp_path):
    """The Report's own UUIDs and bus ids (NVML's spelling: 00000000:18:00.0) find the slice's devices."""
    snap = make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    built = build_report(open_snapshot(snap, tmp_path / "work"))
    from nodecheck.kubernetes.resource_slices import map_gpus, slice_devices

    devices, _ = slice_devices({"items": hgx_slices()}, NAME)
    mapped = map_gpus(devices, [(f"gpu{g.index}", g.uuid, g.pci_bus_id) for g in built.gpus])
    assert {i: [d.name for d in ds] for i, ds in mapped.devices.items()} == {f"gpu{i}": [f"gpu-{i}"] for i in range(8)}
    for device in devices:
        device_slice = device.uuid.replace("GPU-hgx-", "") if device.uuid else None
        assert device_slice is None or device.pci == hgx_pci(int(device_slice))

