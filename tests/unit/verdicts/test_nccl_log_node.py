"""A debug log is judged against its own node: NCCL's Init lines name each rank's GPU by bus id ("busId 42000"), and
a log none of whose GPUs is one of the node's says what NCCL did, not what is wrong with this node."""

import json

from helpers import PUBLIC, REPO, hgx_nvml, make_snapshot, need, nodecheck, without_device_lines

from nodecheck.bench.nccl_debug import parse_nccl_debug
from nodecheck.verdicts.nccl_run import NcclRun, nccl_run_from_details, other_node

HGX = REPO / "examples" / "hgx-h100-8gpu"
KOLYOZ = PUBLIC / "nccl-debug" / "2node-h100-ibext-v8-gdrdma-cumem-nccltests-ngc.txt"  # nccl-tests#252: 4x H100 each
G5 = PUBLIC / "nccl-debug" / "2node-g5-efa-aws-libfabric-gdr-disabled-nccl2234.txt"  # one A10G each, busId 1e0


def kolyoz_like(tmp_path):
    """An HGX H100 snapshot whose GPUs sit where kolyoz1's four do (0x42, 0x55, 0xd4, 0xe6) and four more."""
    buses = [0x42, 0x55, 0xD4, 0xE6, 0x18, 0x28, 0x38, 0x48]
    return make_snapshot(tmp_path / "kolyoz", topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                         nvml_gpus=[dict(g, pci=f"00000000:{bus:02x}:00.0") for g, bus in zip(hgx_nvml(), buses, strict=True)])


def test_the_logs_bus_ids_are_read():
    assert parse_nccl_debug(need(KOLYOZ).read_text()).bus_ids == ["42000", "55000", "d4000", "e6000"]
    assert parse_nccl_debug(need(G5).read_text()).bus_ids == ["1e0"]
    # NCCL before 2.9 printed no busId: nothing to compare, nothing refused
    assert parse_nccl_debug("h:1:1 [7] NCCL INFO comm 0x7f5780001ca0 rank 15 nranks 32 cudaDev 7 nvmlDev 7 - Init COMPLETE").bus_ids == []
    assert nccl_run_from_details({"bus_ids": ["x" * 17]}).bus_ids == []


def test_another_nodes_log_is_shown_not_judged(tmp_path):
    """kolyoz's log against the HGX example (GPUs at 18:00.0 to 88:00.0): what NCCL did is printed, "not judged", exit 2;
    against a node with its GPUs at their bus ids it is judged (exit 0: a healthy run). AWS's g5 log keeps what it says
    by itself (the plugin turning GDR off, NCCL_PROTO) but nothing of the HGX node."""
    other = nodecheck("nccl-log", str(need(KOLYOZ)), "--from", str(HGX))
    assert other.returncode == 2
    assert "between nodes: NET/IBext_v8/0/GDRDMA, NET/IBext_v8/3/GDRDMA" in other.stdout
    assert "not judged against snapshot" in other.stdout and "bus ids 42000, 55000, d4000, e6000" in other.stderr
    document = json.loads(nodecheck("nccl-log", str(KOLYOZ), "--from", str(HGX), "--json").stdout)
    assert "none of snapshot" in document["not_judged"] and document["findings"] == []
    own = nodecheck("nccl-log", str(KOLYOZ), "--from", str(kolyoz_like(tmp_path)), "--json")
    assert own.returncode == 0 and json.loads(own.stdout)["not_judged"] is None
    g5 = json.loads(nodecheck("nccl-log", str(need(G5)), "--from", str(HGX), "--json").stdout)
    assert sorted(f["kind"] for f in g5["findings"]) == ["nccl_no_gdr", "nccl_setting"]
    assert "bus ids 1e0" in g5["not_judged"]


def test_bench_refuses_a_table_whose_nccl_lines_are_another_nodes(tmp_path):
    """AWS's 2x p5 rows (no device lines) under kolyoz's NCCL Init lines: their GPUs are not the HGX example's, so the
    rows are not judged against its links (exit 2); on a node with those GPUs they are."""
    rows = without_device_lines(PUBLIC / "nccl" / "aws-eks-2x-p5-all_reduce_perf-mpirun-tagged-elided.txt", tmp_path)
    init = [line for line in need(KOLYOZ).read_text().splitlines() if "Init START" in line]
    log = tmp_path / "mixed.txt"
    log.write_text("\n".join(init) + "\n" + rows.read_text())
    refused = nodecheck("bench", "--nccl-log", str(log), "--from", str(HGX))
    assert refused.returncode == 2 and refused.stdout == "" and "bus ids 42000, 55000, d4000, e6000" in refused.stderr
    judged = nodecheck("bench", "--nccl-log", str(log), "--from", str(kolyoz_like(tmp_path)))
    assert judged.returncode in (0, 1) and "bus ids" not in judged.stderr


def test_other_node_needs_both_sides():
    """No busId in the log, or a node whose GPUs are unknown (a login node), compares nothing and refuses nothing."""
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.pipeline import build_report

    report = build_report(SnapshotHost(HGX))
    assert other_node(NcclRun(), report, "x") is None
    assert other_node(NcclRun(bus_ids=["18000", "1e0"]), report, "x") is None  # one of them is the node's
    assert other_node(NcclRun(bus_ids=["1e0"]), report, "x").startswith("the log's GPUs are at bus ids 1e0")
    import dataclasses

    assert other_node(NcclRun(bus_ids=["1e0"]), dataclasses.replace(report, gpus=[]), "x") is None
