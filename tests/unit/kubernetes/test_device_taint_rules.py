"""Which DeviceTaintRules a Report asks for (src/nodecheck/kubernetes/device_taint_rules.py), on the published
EKS node's ResourceSlices (tests/fixtures/README.md): the device a GPU's finding names, what stays with the node,
the share a node may lose device by device, and rule objects the Kubernetes releases' own schemas accept."""

import copy

import pytest
import yaml
from helpers import REPO

from nodecheck.kubernetes.device_taint_rules import (
    MANAGED_BY,
    NODE_LABEL,
    Rule,
    gpu_of,
    held_rules,
    node_label,
    owner_selector,
    plan,
    rule_name,
    rule_object,
    same,
)
from nodecheck.kubernetes.resource_slices import map_gpus, slice_devices
from nodecheck.report.findings import Finding

kubernetes_validate = pytest.importorskip("kubernetes_validate")

EKS = yaml.safe_load((REPO / "tests/fixtures/kubernetes/resourceslices-eks-h100x8-v1.yaml").read_text())
NODE = "ip-100-64-147-149.ec2.internal"
BUSES = ["53", "64", "75", "86", "97", "a8", "b9", "ca"]


def devices():
    found, _ = slice_devices(EKS, NODE)
    by_pci = {d.pci: d.uuid for d in found if d.pci}
    return map_gpus(found, [(f"gpu{i}", by_pci[f"0000:{bus}:00.0"], f"00000000:{bus.upper()}:00.0") for i, bus in enumerate(BUSES)])


def xid(gpu: int, severity: str = "error", subject: str | None = None) -> Finding:
    return Finding("gpu_xid", severity, subject or f"gpu{gpu}", "Xid 79", "none",
                   f"gpu{gpu} Xid 79 (GPU has fallen off the bus): drain the node and reset the GPU")


def test_a_gpus_own_findings_name_it_and_nothing_else_does():
    assert [gpu_of(s) for s in ("gpu3", "gpu3:memory", "gpu3:compute", "gpu3:host", "gpu12")] == ["gpu3"] * 4 + ["gpu12"]
    for subject in ("gpu0-gpu1", "gpu0->gpu1", "gpu3/mlx5_0", "node", "eth0", "pci:0000:53:00.0", "gpu", "gpu99999", "gpu3 "):
        assert gpu_of(subject) is None, subject
    fallen = frozenset({"0000:86:00.0"})  # a GPU the driver manages that NVML no longer lists
    assert gpu_of("pci:0000:86:00.0", fallen) == gpu_of("pci:00000000:86:00.0", fallen) == "pci:0000:86:00.0"
    assert gpu_of("pci:0000:85:00.0", fallen) is None  # a switch port's AER: not a GPU


def test_an_xid_on_gpu3_taints_exactly_its_device_of_the_published_slice():
    wanted = plan(NODE, [xid(3), xid(5, "warning"), Finding("nvlink_inactive", "error", "gpu0-gpu1", 1, 2, "pair")],
                  "error", devices(), 8, 0.5)
    (rule,) = wanted.rules
    assert (rule.driver, rule.pool, rule.device, rule.key, rule.gpu) == ("gpu.nvidia.com", NODE, "gpu-3", "nodecheck/gpu_xid", "gpu3")
    assert wanted.covered == {("gpu_xid", "gpu3")} and wanted.notes == []  # the pair and the warning stay with the node
    assert rule.name.startswith(f"nodecheck.{NODE}.gpu-3.gpu-xid.")


def test_two_kinds_on_one_gpu_are_two_rules_and_one_kind_twice_is_one():
    findings = [xid(2), xid(2, subject="gpu2:memory"),
                Finding("gpu_result_mismatch", "error", "gpu2:compute", "differs", "same bits", "gpu2 multiply differs")]
    wanted = plan(NODE, findings, "error", devices(), 8, 0.5)
    assert sorted(r.key for r in wanted.rules) == ["nodecheck/gpu_result_mismatch", "nodecheck/gpu_xid"]
    assert {r.device for r in wanted.rules} == {"gpu-2"} and len(wanted.covered) == 3


def test_more_failing_gpus_than_the_share_add_no_rule_and_the_node_speaks():
    half = plan(NODE, [xid(i) for i in range(4)], "error", devices(), 8, 0.5)
    assert len(half.rules) == 4
    more = plan(NODE, [xid(i) for i in range(5)], "error", devices(), 8, 0.5)
    assert more.rules == [] and more.covered == set() and "5 of 8 GPUs" in more.notes[0]
    held = plan(NODE, [xid(i) for i in range(8)], "error", devices(), 8, 0.5, already=frozenset({"gpu1", "gpu6", "gpu9"}))
    assert [r.device for r in held.rules] == ["gpu-1", "gpu-6"] and held.covered == {("gpu_xid", "gpu1"), ("gpu_xid", "gpu6")}
    assert "no new device taint, the rules of gpu1, gpu6 kept" in held.notes[0]
    capped = plan(NODE, [xid(i) for i in range(8)], "error", devices(), 8, 0.25, already=frozenset(f"gpu{i}" for i in range(8)))
    assert [r.device for r in capped.rules] == ["gpu-0", "gpu-1"]  # never more than the share, whatever was held
    assert plan(NODE, [xid(0)], "error", devices(), 1, 0.5).rules == []  # one GPU: half of it is none
    assert len(plan(NODE, [xid(0)], "error", devices(), 1, 1.0).rules) == 1


def test_a_gpu_no_slice_lists_stays_with_the_node_and_mig_devices_follow_their_gpu():
    mapped = devices()
    del mapped.devices["gpu6"]
    wanted = plan(NODE, [xid(6)], "error", mapped, 8, 0.5)
    assert wanted.rules == [] and wanted.covered == set() and "gpu6: no DRA device lists it" in wanted.notes[0]
    slices = copy.deepcopy(EKS)
    gpu_slice = next(s for s in slices["items"] if s["spec"]["driver"] == "gpu.nvidia.com")
    uuid1 = next(d["attributes"]["uuid"]["string"] for d in gpu_slice["spec"]["devices"] if d["name"] == "gpu-1")
    gpu_slice["spec"]["devices"].append({"name": "gpu-1-mig-1g10gb-19-0", "attributes": {
        "uuid": {"string": "MIG-3cd1a7a2-0000-5f3b-9d52-3a3c0a5d7f1e"}, "parentUUID": {"string": uuid1}}})
    found, _ = slice_devices(slices, NODE)
    by_pci = {d.pci: d.uuid for d in found if d.pci}
    mig = map_gpus(found, [("gpu1", by_pci["0000:64:00.0"], None)])
    assert [r.device for r in plan(NODE, [xid(1)], "error", mig, 8, 0.5).rules] == ["gpu-1", "gpu-1-mig-1g10gb-19-0"]


def test_a_gpu_fallen_off_the_bus_is_found_at_its_pci_address():
    """NVML lists seven GPUs, the driver manages eight: the Xid names the eighth by its address (pci:...), and the
    published slice still lists the device there."""
    found, _ = slice_devices(EKS, NODE)
    by_pci = {d.pci: d.uuid for d in found if d.pci}
    listed = [(f"gpu{i}", by_pci[f"0000:{bus}:00.0"], f"00000000:{bus.upper()}:00.0") for i, bus in enumerate(BUSES) if bus != "86"]
    fallen = frozenset({"0000:86:00.0"})
    mapped = map_gpus(found, listed + [("pci:0000:86:00.0", None, "0000:86:00.0")])
    lost = Finding("gpu_xid", "error", "pci:0000:86:00.0", "Xid 79", "none", "pci:0000:86:00.0 Xid 79 (fallen off the bus)")
    aer = Finding("pcie_aer_fatal", "error", "pci:0000:85:00.0", 1, 0, "switch port fatal AER")
    wanted = plan(NODE, [lost, aer], "error", mapped, 8, 0.5, fallen)
    (rule,) = wanted.rules
    assert (rule.device, rule.gpu) == ("gpu-3", "pci:0000:86:00.0") and wanted.covered == {("gpu_xid", "pci:0000:86:00.0")}
    body = rule_object(rule, NODE, "NoSchedule", "v1")
    assert body["spec"]["taint"]["value"] == "pci-0000-86-00.0"
    kubernetes_validate.validate(body, "1.37.0", strict=True)


def test_rule_names_are_dns_subdomains_unique_and_bounded():
    names = {rule_name(NODE, "gpu.nvidia.com", NODE, f"gpu-{i}", kind) for i in range(8) for kind in ("gpu_xid", "nvlink_inactive")}
    assert len(names) == 16
    other_pool = rule_name(NODE, "gpu.nvidia.com", "another-pool", "gpu-0", "gpu_xid")
    assert other_pool not in names and other_pool.rsplit(".", 1)[0] == rule_name(NODE, "gpu.nvidia.com", NODE, "gpu-0", "gpu_xid").rsplit(".", 1)[0]
    long_node = ".".join(["a" * 60] * 4)
    assert rule_name(long_node, "d", "p", "gpu-0", "gpu_xid").startswith("nodecheck.") and len(rule_name(long_node, "d", "p", "gpu-0", "gpu_xid")) < 60
    assert rule_name(NODE, "d", "p", "Not_A_Label", "gpu_xid") == rule_name(NODE, "d", "p", "Not_A_Label", "gpu_xid")
    assert len(rule_name(NODE, "d", "p", "Not_A_Label", "gpu_xid")) == len("nodecheck.") + 40
    assert node_label(NODE) == NODE and len(node_label(long_node)) == 62


@pytest.mark.parametrize("version, release", [("v1alpha3", "1.33.0"), ("v1beta2", "1.36.0"), ("v1", "1.37.0")])
def test_the_rules_nodecheck_writes_are_valid_in_each_release_that_serves_them(version, release):
    rule = plan(NODE, [xid(3)], "error", devices(), 8, 0.5).rules[0]
    for effect in ("NoSchedule", "NoExecute", "None"):
        kubernetes_validate.validate(rule_object(rule, NODE, effect, version), release, strict=True)
        kubernetes_validate.validate(rule_object(rule, NODE, effect, version, "1234", "2026-11-18T11:06:40Z"), release, strict=True)
    wrong = rule_object(rule, NODE, "NoSchedule", version)
    wrong["spec"]["deviceSelector"]["deviceClassName"] = "gpu.nvidia.com"  # tombstoned in 1.35: nodecheck never sends it
    if version != "v1alpha3":
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(wrong, release, strict=True)


def test_only_this_nodes_own_rules_are_read_back_from_a_hostile_answer():
    rule = Rule("nodecheck.n1.gpu-0.gpu-xid.0", "gpu.nvidia.com", "n1", "gpu-0", "nodecheck/gpu_xid", "gpu0", "m")
    mine = rule_object(rule, "n1", "NoSchedule", "v1", "7", "2026-11-18T11:06:40Z")
    theirs = copy.deepcopy(mine)
    theirs["metadata"]["name"] = "x"
    theirs["metadata"]["annotations"]["nodecheck/node"] = "n2"  # same label, another node's annotation
    admin = {"metadata": {"name": "admin-rule", "labels": {}}, "spec": {}}
    answer = {"items": [mine, theirs, admin, None, 5, {"metadata": "x"}, {"metadata": {"name": 7}}]}
    held, notes = held_rules(answer, "n1")
    assert list(held) == [rule.name] and notes == []
    assert same(held[rule.name], rule, "NoSchedule") and not same(held[rule.name], rule, "NoExecute")
    assert held[rule.name].time_added == "2026-11-18T11:06:40Z" and held[rule.name].resource_version == "7"
    assert owner_selector("n1") == f"{MANAGED_BY}=nodecheck,{NODE_LABEL}=n1"
    flood, notes = held_rules({"items": [mine] * 5000}, "n1")
    assert len(flood) == 1 and "first 1024 read" in notes[0]
    for hostile in ({}, {"items": "x"}, {"items": [{"metadata": {"name": "a", "labels": [], "annotations": "b"}}]}):
        assert held_rules(hostile, "n1") == ({}, [])
