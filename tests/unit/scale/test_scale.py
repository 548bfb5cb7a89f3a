"""`nodecheck scale` against the seeds' own worked numbers (seed 001: ResNet-50 on 4 nodes over 10 GbE;
seed 000: the 10B-parameter estimate), Reports and snapshots as inputs, and bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, h100_node_snapshot, hgx_nvml, make_snapshot

from nodecheck.bench.distributed import measurement_from_worker
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.scale import Fabric, Workload, levers, needed_busbw, pick_row, row, table

NODECHECK = str(Path(sys.executable).parent / "nodecheck")
# seed 001: Ts 234 ms and a measured Tc of 106 ms for 25M fp32 gradients (100 MB) over 4 nodes, one GPU
# each; the ring moves 2(n-1)/n x 100 MB = 150 MB in 106 ms: that is the cluster's busbw.
SEED001_BUSBW = 1.5 * 100e6 / 0.106
RESNET50 = Workload(25e6, "fp32", 0.234)
TEN_GBE = Fabric(gpus_per_node=1, inter_busbw=SEED001_BUSBW, intra_busbw=SEED001_BUSBW, source="seed 001", rails=1)


def scale(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NODECHECK, "scale", *args], capture_output=True, text=True, timeout=60)


def test_seed001_resnet50_on_four_nodes_and_its_levers():
    base = row(RESNET50, TEN_GBE, 4, 0.9)
    assert base.comm_s == pytest.approx(0.106) and round(base.efficiency * 100, 1) == 68.8
    assert base.speedup == pytest.approx(2.75, abs=0.01)  # the seed's "2.74x"
    steps = [(label, round(r.efficiency * 100, 1)) for label, r in levers(RESNET50, TEN_GBE, 4, 0.9)]
    assert [e for _, e in steps[:3]] == [68.8, 81.5, 89.8]
    # two NICs: Tc/4 = 26.5 ms -> 94.6%; the seed rounds Tc to 27 ms and prints 94.5%
    assert steps[3][0].startswith("+ a second NIC") and steps[3][1] == pytest.approx(94.5, abs=0.15)


def test_seed001_estimate_from_the_nic_speed():
    """The seed's own estimate before measuring: 150 MB over 10 GbE (1.25 GB/s) = 0.12 s ("0.11 s")."""
    estimate = row(RESNET50, Fabric(1, 1.25e9, 1.25e9, "10 GbE"), 4, 0.9)
    assert estimate.comm_s == pytest.approx(0.12)


def test_seed001_through_the_cli_json():
    out = scale("--params", "25M", "--step-time", "0.234", "--nodes", "4", "--gpus-per-node", "1",
                "--busbw", f"{SEED001_BUSBW / 1e9:.6f}GB/s", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    rows = {r["gpus"]: r for r in result["rows"]}
    assert sorted(rows) == [1, 2, 4] and rows[1]["efficiency"] == 1.0
    assert round(rows[4]["efficiency"] * 100, 1) == 68.8 and rows[4]["comm_s"] == pytest.approx(0.106, abs=1e-6)
    assert [round(l["efficiency"] * 100, 1) for l in result["levers"]][:3] == [68.8, 81.5, 89.8]
    assert result["workload"]["grad_bytes"] == 100e6


def test_seed000_ten_billion_parameters():
    """10B params, bf16 gradients (20 GB), 6PD = 24.576e14 FLOPs per step over 8N A100s at 300 TFLOP/s and
    50% MFU: Ts = 2.048/N s (the seed: ~2/N). Communication <= compute needs IB >= N x P GB/s (the seed's
    rule: gradient bytes / Ts, i.e. algbw); 4 nodes: ~320 Gbit/s."""
    for nodes in (1, 2, 4, 8):
        gpus = 8 * nodes
        step = 24.576e14 / gpus / (300e12 * 0.5)
        assert step == pytest.approx(2.048 / nodes)
        busbw = needed_busbw(gpus, 20e9, step, 1.0, overlap=True)
        algbw = busbw / (2 * (gpus - 1) / gpus)
        assert algbw == pytest.approx(nodes * 10e9, rel=0.03)
    out = scale("--params", "10B", "--grad-dtype", "bf16", "--flops", f"{24.576e14 / 32}", "--peak-tflops", "300",
                "--mfu", "0.5", "--nodes", "4", "--gpus-per-node", "8", "--busbw", "320Gbit/s", "--json")
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout)["rows"][-1]
    assert last["gpus"] == 32 and last["step_s"] == pytest.approx(0.512)
    # at the seed's 320 Gbit/s the ring's 2(n-1)/n doubling is what makes communication exceed compute
    assert last["comm_s"] == pytest.approx(2 * 31 / 32 * 20e9 / 40e9) and last["efficiency_overlap"] < 0.55


def test_table_rows_levers_and_payload_choice():
    rows = table(RESNET50, Fabric(8, 12.5e9, 300e9, "x"), 8, 0.9)
    assert [(r.gpus, r.nodes) for r in rows] == [(1, 1), (8, 1), (16, 2), (32, 4), (64, 8)]
    assert rows[1].busbw == 300e9 and rows[2].busbw == 12.5e9  # in the node, then across nodes
    assert all(a.efficiency >= b.efficiency for a, b in zip(rows, rows[1:], strict=False))
    # bf16 already: no bf16 lever; in one node: no NIC lever
    labels = [label for label, _ in levers(Workload(1e9, "bf16", 0.1), Fabric(8, 1e9, 1e9, "x"), 8, 0.9)]
    assert labels == ["as given", "+ 2 accumulation steps (communicate half as often)"]
    sweep = [{"size_bytes": 2**i, "busbw": i * 1e9} for i in (20, 24, 27, 30)]
    assert pick_row(sweep, 100e6)["size_bytes"] == 2**27 and pick_row(sweep, 5e9)["size_bytes"] == 2**30
    assert pick_row([], 1) is None


def test_from_a_report_uses_the_measured_busbw_at_the_gradient_payload(tmp_path):
    """A Report as `nodecheck bench --json` writes it for a 2-node job (gloo worker output shape)."""
    report = build_report(SnapshotHost(h100_node_snapshot(tmp_path / "h")))
    rows = [{"size_bytes": s, "seconds": 1.0, "algbw": b / 1.5, "busbw": b} for s, b in ((2**20, 0.4e9), (2**27, 1.1e9), (2**29, 1.2e9))]
    nodes = [{"rank": 0, "node": "a", "address": "198.18.0.1"}, {"rank": 1, "node": "b", "address": "198.18.0.2"}]
    report.measurements = [measurement_from_worker("allreduce:2-ranks", {"rows": rows, "nodes": nodes, "backend": "gloo",
                                                                          "spec_bytes_per_second": 1.25e9})]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report.to_dict()))
    out = scale("--params", "25M", "--step-time", "0.234", "--from", str(path), "--nodes", "2", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["fabric"]["gpus_per_node"] == 1 and result["fabric"]["inter_busbw"] == 1.1e9  # 134 MB >= 100 MB
    assert "measured: allreduce:2-ranks at 134 MB" in result["fabric"]["source"]
    assert result["rows"][-1]["comm_s"] == pytest.approx(100e6 / 1.1e9)


def test_from_a_snapshot_uses_the_specs_and_says_so(tmp_path):
    """The real H100 node (its virtio NIC reports no speed: given 100 Gb/s here, as a physical NIC would);
    no measurement, so the specs, labelled."""
    snap = h100_node_snapshot(tmp_path / "h")
    for speed in (p for p in (snap / "fs").rglob("speed") if p.parent.name == "eth0"):
        speed.write_text("100000\n")
    specs = [p for p in build_report(SnapshotHost(snap)).paths if p.path.startswith("nic:") and p.bytes_per_second]
    out = scale("--params", "7B", "--grad-dtype", "bf16", "--step-time", "1.5", "--from", str(snap), "--nodes", "4", "--json")
    assert out.returncode == 0, out.stderr
    fabric = json.loads(out.stdout)["fabric"]
    assert fabric["gpus_per_node"] == 1 and fabric["source"].startswith("spec, not measured")
    assert fabric["inter_busbw"] == min(p.bytes_per_second for p in specs)


def test_from_a_multi_rail_snapshot_the_rails_are_summed_as_bench_bounds_the_job():
    """The 8-GPU example node has 8 NDR rails of 400 Gbit/s. Without a measurement, scale once took the slowest single
    NIC (50 GB/s) where bench bounds the same job, 8 ranks a node, by the sum of its rails: 8x too little, and the
    example job's Report holds bench's bound. Now both say 400 GB/s; a job of one rank per node uses GPU 0's rail."""
    example = REPO / "examples"
    job = json.loads((example / "job-8node-allreduce.json").read_text())
    (bench_bound,) = [m["spec_bytes_per_second"] for m in job["measurements"] if m["test"] == "allreduce"]
    out = scale("--params", "7B", "--step-time", "1.5", "--from", str(example / "hgx-h100-8gpu"), "--json")
    fabric = json.loads(out.stdout)["fabric"]
    assert fabric["inter_busbw"] == bench_bound == 400e9 and "ring bound: 8 rail(s)" in fabric["source"], fabric
    one = scale("--params", "7B", "--step-time", "1.5", "--gpus-per-node", "1", "--from", str(example / "hgx-h100-8gpu"), "--json")
    fabric = json.loads(one.stdout)["fabric"]
    assert fabric["inter_busbw"] == 50e9 and "1 rail(s) (mlx5_0)" in fabric["source"], fabric


def test_the_nic_lever_counts_the_rails_the_figure_already_uses():
    """Seed 001's lever is "a second NIC" for its one 10 GbE port. On the 8-rail example it once said the same, where
    doubling the inter-node busbw takes 16 NICs a node; by hand the count is unknown and the label says only "twice"."""
    example = REPO / "examples"

    def nic_lever(*args: str) -> str:
        out = scale("--params", "7B", "--step-time", "1.5", "--nodes", "2", *args, "--json")
        assert out.returncode == 0, out.stderr
        (label,) = [lever["lever"] for lever in json.loads(out.stdout)["levers"] if "NIC" in lever["lever"]]
        return label

    assert nic_lever("--from", str(example / "hgx-h100-8gpu")).startswith("+ 16 NICs per node where 8 are")
    assert nic_lever("--from", str(example / "hgx-h100-8gpu"), "--gpus-per-node", "1").startswith("+ a second NIC")
    assert nic_lever("--from", str(example / "job-8node-allreduce.json")).startswith("+ 16 NICs per node where 8 are")
    assert nic_lever("--busbw", "400Gbit/s").startswith("+ twice the NICs per node")
    assert [label for label, _ in levers(RESNET50, TEN_GBE, 4, 0.9)][-1].startswith("+ a second NIC")


def test_snapshot_without_nic_speeds_says_what_to_do(tmp_path):
    snap = make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    out = scale("--params", "7B", "--step-time", "1.5", "--from", str(snap))
    assert out.returncode == 2 and "no all-reduce measurement and no NIC speed" in out.stderr and "--busbw" in out.stderr


@pytest.mark.parametrize("args,message", [
    (["--params", "-5M", "--step-time", "1", "--busbw", "1GB/s"], "expected a count"),
    (["--params", "25M", "--step-time", "1", "--busbw", "0GB/s"], "must be above zero"),
    (["--params", "25M", "--step-time", "1", "--busbw", "10 parsecs"], "expected a rate with its unit"),
    (["--params", "25M", "--step-time", "0", "--busbw", "1GB/s"], "must be above zero"),
    (["--params", "25M", "--busbw", "1GB/s"], "give one of --step-time"),
    (["--params", "25M", "--step-time", "1", "--flops", "1e12", "--busbw", "1GB/s"], "give one of --step-time"),
    (["--params", "25M", "--flops", "1e12", "--busbw", "1GB/s"], "--peak-tflops"),
    (["--params", "25M", "--step-time", "1", "--grad-dtype", "int3", "--busbw", "1GB/s"], "--grad-dtype 'int3'"),
    (["--params", "25M", "--step-time", "1", "--accum", "0", "--busbw", "1GB/s"], "--accum must be 1..1,000,000"),
    (["--params", "25M", "--step-time", "1"], "give --busbw"),
    (["--params", "25M", "--step-time", "1", "--from", "/nonexistent/report.json"], "/nonexistent/report.json"),
    (["--params", "25M", "--step-time", "nan", "--busbw", "1GB/s"], "must be above zero (and finite)"),
    (["--params", "25M", "--step-time", "inf", "--busbw", "1GB/s"], "must be above zero (and finite)"),
    (["--params", "25M", "--flops", "1e12", "--peak-tflops", "inf", "--busbw", "1GB/s"], "--peak-tflops above zero"),
    (["--params", "25M", "--step-time", "1", "--busbw", "1e999GB/s"], "must be above zero (and finite)"),
    (["--params", "1" * 50000, "--step-time", "1", "--busbw", "1GB/s"], "expected a count"),  # once 97 s of regex
])
def test_bad_input_is_exit_2_with_a_message(args, message):
    out = scale(*args)
    assert out.returncode == 2 and message in out.stderr, (out.returncode, out.stdout, out.stderr)


def test_not_a_report(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"measurements": [{"ok": true, "test": "allreduce", "path": "allreduce:x-ranks"}]}')
    out = scale("--params", "25M", "--step-time", "1", "--from", str(path))
    assert out.returncode == 2 and str(path) in out.stderr


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="needs matplotlib (sh deploy/install.sh plot)")
    png = tmp_path / "scale.png"
    out = scale("--params", "25M", "--step-time", "0.234", "--gpus-per-node", "1", "--nodes", "8", "--busbw", "10Gbit/s",
                "--plot", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert f"nodecheck scale: chart written to {png}" in out.stderr  # said, on stderr (stdout may be --json)


def test_the_text_says_what_was_given_as_it_was_given():
    """7B is seven billion parameters, as models are named; one GPU is not "1 GPUs"; the rate echoes the unit typed."""
    out = scale("--params", "7B", "--step-time", "0.5", "--gpus-per-node", "1", "--nodes", "2", "--busbw", "400Gbit/s")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("gradients: 7B params x fp32 = 28 GB per step")
    assert "across nodes 50 GB/s = 400 Gbit/s" in lines[1] and "(by hand: --busbw 400Gbit/s); 1 GPU per node" in lines[1]
    assert "levers at 2 GPUs" in out.stdout and "1 GPUs" not in out.stdout
    seed = scale("--params", "25M", "--step-time", "0.234", "--gpus-per-node", "1", "--nodes", "4", "--busbw", "1.415GB/s")
    assert "68.8%" in seed.stdout  # README: the seed's measured busbw gives the seed's figure


def test_a_report_with_busbw_zero_is_refused_not_read_as_free_communication(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"schema": "nodecheck.report", "measurements": [{"ok": True, "test": "allreduce", "path": "allreduce:2-ranks",
                                                  "bytes_per_second": 0, "payload_bytes": 1 << 25, "details": {"nodes": []}}]}))
    out = scale("--params", "25M", "--step-time", "1", "--from", str(path))
    assert out.returncode == 2 and "not a usable bandwidth" in out.stderr, out.stdout + out.stderr


def test_json_output_is_strict_json():
    out = scale("--params", "25M", "--step-time", "0.234", "--busbw", "10Gbit/s", "--nodes", "4", "--json")
    document = json.loads(out.stdout, parse_constant=lambda name: pytest.fail(f"{name} in --json output"))
    assert document["rows"][0]["needed_busbw"] is None and document["rows"][-1]["efficiency"] < 1


def test_a_multi_node_nvlink_domain_crosses_nodes_at_nvlink_until_it_is_full(tmp_path):
    """GB200 NVL72: a job of up to 72 GPUs crosses its nodes over NVLink, not the rails. scale predicted every
    job past one node at the rails' ring bound (8 x 400 Gbit/s = 400 GB/s here), 2.25 x too little for NVLink 5
    (900 GB/s a GPU); now rows up to the domain's size use the NVLink figure and larger ones the rails."""
    from gpu_fabric_cases import published
    from helpers import gpu_node_with_rdma

    from nodecheck.report.model import Imex
    from nodecheck.scale import fabric_from_report

    gpus = hgx_nvml(18, version=7, arch=10, name="NVIDIA GB200", fabric=published()["gb200-healthy"])
    rails = [(f"mlx5_{i}", "400 Gb/sec (4X NDR)", "InfiniBand") for i in range(8)]
    report = gpu_node_with_rdma(tmp_path / "tray", "hgx-h100-8gpu-8nic-sglang30401.txt", gpus, rails)
    work = Workload(7e9, "bf16", 1.5)
    unsized = fabric_from_report(report, None, work.grad_bytes)
    assert unsized.domain_gpus is None and "--nvlink-domain-gpus N" in unsized.source
    fabric = fabric_from_report(report, None, work.grad_bytes, domain_gpus=72)
    assert (fabric.inter_busbw, fabric.intra_busbw, fabric.domain_gpus) == (400e9, 900e9, 72)
    by_gpus = {r.gpus: r.busbw for r in table(work, fabric, 16, 0.9)}
    assert by_gpus[16] == by_gpus[64] == 900e9 and by_gpus[128] == 400e9
    assert {r.gpus: r.busbw for r in table(work, unsized, 16, 0.9)}[16] == 400e9  # as before: the rails
    assert not [label for label, _ in levers(work, fabric, 64, 0.9) if "NIC" in label]  # no NIC carries it
    report.imex = Imex("READY", "UP", [{"index": str(i), "host": f"10.0.0.{i}", "status": "READY", "unconnected": []}
                                       for i in range(18)])
    listed = fabric_from_report(report, None, work.grad_bytes)
    assert listed.domain_gpus == 18 * 8 and "IMEX's node list" in listed.source
    out = scale("--params", "7B", "--step-time", "1.5", "--busbw", "400GB/s", "--intra-busbw", "800GB/s",
                "--gpus-per-node", "4", "--nvlink-domain-gpus", "72", "--nodes", "32", "--json")
    rows = {r["gpus"]: r["busbw"] for r in json.loads(out.stdout)["rows"]}
    assert rows[64] == 800e9 and rows[128] == 400e9, out.stderr


def test_a_share_the_inputs_give_no_figure_for_prints_no_nan():
    """`scale` printed `nan%`: a share of no figure (inf over inf) reads '-'."""
    import dataclasses

    from nodecheck.render.scale import scale_lines

    work = Workload(7e9, "bf16", 0.1)
    fabric = Fabric(8, 10e9, 400e9, "by hand")
    rows = table(work, fabric, 4, 0.9)
    broken = [dataclasses.replace(r, efficiency=float("nan"), efficiency_overlap=float("nan")) for r in rows]
    text = "\n".join(scale_lines(work, fabric, broken, [("lever", broken[-1])], 0.9))
    assert "nan" not in text.lower() and " - " in text
