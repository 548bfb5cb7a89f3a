"""nccl-tests logs as operators paste them: the rank count read from every row, a bound per collective, P2P or staged
decided from the node when the log has no NCCL transport lines, and a partial NVLink mesh bounded by its NVLink."""

import json
from pathlib import Path

import pytest
from helpers import PUBLIC, REPO, h100_nvml_records, hgx_nvml, make_snapshot, need, nodecheck, without_device_lines

from nodecheck.bench.bounds import peer_access, slowest_pair
from nodecheck.bench.collective_rows import collective_of, ranks_from_rows
from nodecheck.bench.nccl_binary import _network_bound, measurement_from_log
from nodecheck.bench.nccl_tests import parse_nccl_log
from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.verdicts.bandwidth import measurement_findings, with_threshold


def _examples():
    """The HGX H100 example node: NV18 pairs (450 GB/s), eight 400G rails."""
    return REPO / "examples" / "hgx-h100-8gpu"


# (file, collective, ranks): the rank counts nccl-tests' busbw = algbw x 2(n-1)/n (all-reduce) or (n-1)/n (all-gather,
# alltoall) gives from the largest rows; each log's source names its job (../shared/captures/public/SOURCES.md)
RANKS = [
    ("aws-2x-p4de-all_reduce_perf-srun-prefixed-noavg.txt", "all_reduce", (16, 16)),  # 2x p4de: 16 A100
    ("aws-batch-p5-all_reduce_perf-mpirun-tagged.txt", "all_reduce", (8, 8)),  # its rows say 8, not 16
    ("aws-eks-2x-p5-all_reduce_perf-mpirun-tagged-elided.txt", "all_reduce", (16, 16)),  # 2x p5: 16 H100
    ("coreweave-h100-64gpu-ib-sharp-all_reduce_perf-elided.txt", "all_reduce", (96, 96)),  # its rows say 96, not 64
    ("coreweave-gb200-nvl72-1rack-all_reduce_perf-partial.txt", "all_reduce", (72, 72)),
    ("superbench-8x-a100-sxm4-40gb-all_gather_perf.txt", "all_gather", (8, 8)),
    ("superbench-8x-a100-sxm4-40gb-alltoall_perf.txt", "alltoall", (8, 8)),
    ("tinybox-6x-rtx4090-p2p-patched-all_reduce_perf-single-size.txt", "all_reduce", (6, 6)),
    ("4x-rtx5090-genoa-no-p2p-all_reduce_perf-nccltests287.txt", "all_reduce", (4, 4)),
]


@pytest.mark.parametrize("name,collective,ranks", RANKS)
def test_the_rank_count_is_in_every_row(name, collective, ranks):
    log = parse_nccl_log(need(PUBLIC / "nccl" / name).read_text())
    assert collective_of(log, name)[0] == collective
    assert ranks_from_rows(log, collective) == ranks
    if log.ranks and log.devices:  # where the device lines name every rank, the rows agree with them
        assert log.ranks == ranks[0] or len(log.devices) < log.ranks


def test_1440_ranks_from_the_rows_bracket_the_device_lines():
    """Two decimals leave a range at 1440 ranks; the device line's rank 1439 sits inside it."""
    log = parse_nccl_log(need(PUBLIC / "nccl" / "coreweave-gb200-20racks-1440gpu-all_reduce_perf-partial.txt").read_text())
    least, most = ranks_from_rows(log, "all_reduce")
    assert least <= 1440 <= most and least > 1000


def test_rows_name_the_collective_when_the_log_does_not():
    reduce = parse_nccl_log(need(PUBLIC / "nccl" / "aws-2x-p4de-all_reduce_perf-srun-prefixed-noavg.txt").read_text())
    assert collective_of(reduce)[0] == "all_reduce"
    gather = parse_nccl_log(need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-all_gather_perf.txt").read_text())
    assert collective_of(gather) == (None, "not named in the log or its file name, and its rows do not settle it")
    assert ranks_from_rows(gather, "broadcast") is None  # no n in broadcast's factor


def judged(log, snapshot, *more):
    """A published log (by name, or a path) judged against a snapshot's node."""
    path = log if isinstance(log, Path) else need(PUBLIC / "nccl" / log)
    run = nodecheck("bench", "--nccl-log", str(path), "--from", str(snapshot), "--json", *more)
    assert run.returncode in (0, 1), run.stderr
    return json.loads(run.stdout)


def pcie_node(tmp_path, name: str, **fields):
    """Four PCIe GPUs (g6e's NODE topology) as `name` boards at PCIe 5.0 x16: 63 GB/s a pair."""
    gpus = [dict(h100_nvml_records()[0], name=name, arch=10, uuid=f"GPU-pcie-{i}", pci=f"00000000:{0x18 + i * 0x10:02x}:00.0",
                 nvlink=[[0, "ERR Not Supported"]], **fields) for i in range(4)]
    return make_snapshot(tmp_path / name.replace(" ", "-"), topo="aws-g6e-12xlarge-4x-l40s-node.txt", nvml_gpus=gpus)


def test_a_log_without_transport_lines_takes_p2p_from_the_node(tmp_path):
    """nccl-tests#287's healthy 4x RTX 5090 run (NCCL over SHM: GeForce has no P2P), pasted with no NCCL INFO line:
    27.26 GB/s busbw = 0.43 of PCIe 5.0 x16 read as P2P PCIe, an error. GeForce boards, or NVML's P2P status saying
    not supported, make it the staged path it ran on (0.43 passes its calibrated 0.35); NVML saying ok keeps P2P
    (a real error); nothing saying either way makes the PCIe verdict a note."""
    log = "4x-rtx5090-genoa-no-p2p-all_reduce_perf-nccltests287.txt"
    geforce = judged(log, pcie_node(tmp_path, "NVIDIA GeForce RTX 5090"))
    log = without_device_lines(PUBLIC / "nccl" / log, tmp_path / "rows")  # its rows, held against other PCIe boards
    assert geforce["measurement"]["details"]["path_kind"] == "pcie-staged" and geforce["findings"] == []
    refused = judged(log, pcie_node(tmp_path, "NVIDIA RTX PRO 6000", p2p_read=5))
    assert refused["measurement"]["details"]["path_kind"] == "pcie-staged" and refused["findings"] == []
    allowed = judged(log, pcie_node(tmp_path, "NVIDIA RTX PRO 6000 Blackwell", p2p_read=0))
    assert [(f["kind"], f["severity"]) for f in allowed["findings"]] == [("bandwidth_below_spec", "error")]
    unknown = judged(log, pcie_node(tmp_path, "NVIDIA L40S"))
    (note,) = unknown["findings"]
    assert (note["kind"], note["severity"]) == ("bandwidth_below_spec", "info")
    assert "the log has no NCCL transport lines" in note["message"] and "may be healthy" in note["message"]


def test_nvml_p2p_status_is_read_and_replayed(tmp_path):
    report = build_report(SnapshotHost(pcie_node(tmp_path, "NVIDIA L40S", p2p_read=2)), None)
    assert report.gpus[0].p2p_read == {"gpu1": "GPU not supported", "gpu2": "GPU not supported", "gpu3": "GPU not supported"}
    assert peer_access(report) == (False, "NVML's P2P read status: GPU not supported")
    unsaid = build_report(SnapshotHost(pcie_node(tmp_path / "u", "NVIDIA L40S")), None)
    assert unsaid.gpus[0].p2p_read is None and peer_access(unsaid)[0] is None


def test_alltoall_inside_a_node_is_bounded_by_its_nvlink(tmp_path):
    """superbench's 8x A100 alltoall (its rows: the HGX H100 example's GPUs are another board), bounded by the pair's
    NVLink."""
    out = judged(without_device_lines(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-alltoall_perf.txt", tmp_path),
                 _examples())
    m = out["measurement"]
    assert m["details"]["collective"] == "alltoall" and m["details"]["path_kind"] == "nvlink"
    assert m["spec_bytes_per_second"] == pytest.approx(450e9)  # the HGX H100 example: NV18


def test_a_bound_per_collective_across_nodes():
    """On the HGX example's eight 400G rails, 16 ranks on 2 nodes: all-reduce and the ring family are bounded by the
    rails' sum (400 GB/s); alltoall by one GPU's rail x N/(N-1) x (n-1)/n = 50 x 2 x 15/16 = 93.75 GB/s (OCI's healthy
    two-node alltoall baseline read 0.22 of the ring bound, 88 GB/s: 0.94 of this); sendrecv by one rail; gather by
    nothing nodecheck knows."""
    report = build_report(SnapshotHost(_examples()), None)
    ring, kind, basis = _network_bound(report, None, "all_gather", 16, 2)
    assert (ring, kind) == (400e9, "infiniband") and basis.startswith("8 rank(s) per node on 2 nodes; ring bound: 8 rail(s)")
    alltoall, _, basis = _network_bound(report, None, "alltoall", 16, 2)
    assert alltoall == pytest.approx(93.75e9) and "N=2 nodes, n=16 ranks" in basis
    assert 88e9 / alltoall > Config().ratio_for("nccl_tests", "infiniband", "busbw")
    assert _network_bound(report, None, "sendrecv", 2, 2)[0] == 50e9
    none, _, why = _network_bound(report, None, "gather", 16, 2)
    assert none is None and "the collective is gather" in why
    unknown, _, why = _network_bound(report, None, "all_reduce", 16, None)
    assert unknown is None and "pass --nodes N" in why


def dgx1(tmp_path):
    """The DGX-1's hybrid cube mesh (OneFlow's DLPerf capture: NV1/NV2 pairs, SYS between the two quads) with NVML
    naming its V100s (Volta: NVLink 2, 25 GB/s a link)."""
    gpus = [dict(g, name="Tesla V100-SXM2-16GB", arch=5) for g in hgx_nvml(links_per_gpu=6, version=2)]
    return make_snapshot(tmp_path / "dgx1", topo="dgx1-v100-8gpu-hybrid-cube-mesh-1nic-oneflow.txt", nvml_gpus=gpus)


def test_a_partial_nvlink_mesh_is_bounded_by_its_nvlink_not_a_sys_pair(tmp_path):
    """A SYS pair's PCIe (15.75 GB/s) bounded the in-node all-reduce, so a third of the healthy rate passed; each V100
    has 6 NVLinks in the mesh, 150 GB/s one way: a ring over NVLink is bounded by that. A figure far above it says
    the path was misread (no NVSwitch: no NVLS)."""
    report = build_report(SnapshotHost(dgx1(tmp_path)), None)
    bound = slowest_pair(report)
    assert (bound.kind, bound.bytes_per_second) == ("nvlink", 150e9) and bound.basis.startswith("partial NVLink mesh")
    log = parse_nccl_log(need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-all_reduce_perf.txt").read_text())
    m = with_threshold(measurement_from_log(log, report, "nccl-log", "m", name="all_reduce_perf"), Config())
    assert m.spec_bytes_per_second == 150e9 and m.ratio == pytest.approx(235.26 / 150)
    assert [f.kind for f in measurement_findings([m], Config())] == ["bandwidth_above_bound"]
    assert "note" not in m.details  # no NVLS on a mesh without NVSwitch


def test_nvls_above_spec_inside_an_nvswitch_node_is_said():
    """An all-reduce inside an NVSwitch node with NVLS reads above its NVLink rate (busbw 480 GB/s on H100's 450:
    nccl-tests issues #153, #312): the note says why, as bench says it of its own."""
    report = build_report(SnapshotHost(_examples()), None)
    log = parse_nccl_log(need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-all_reduce_perf.txt").read_text())
    log.rows = [r for r in log.rows if r.out_of_place]
    for row in log.rows:  # the same run at 2.1x its rate, as NVLS gives on H100 (nccl-tests issues #153, #312)
        row.out_of_place.busbw_gbytes *= 2.1
    m = measurement_from_log(log, report, "nccl-log", "m", name="all_reduce_perf")
    assert m.ratio > 1 and "NVLS" in m.details["note"]


def test_a_gb200_job_without_imex_takes_the_rails(tmp_path):
    """A GB200 tray registered in its NVLink fabric: with IMEX READY and its domain UP a job across the domain's nodes
    takes NVLink (no rail spec, and bench's ranks carry the NVLink domain); with the domain DEGRADED, or IMEX unread,
    GPUs share no memory across nodes and NCCL takes the rails: a job at rail speed read 0.20 of NVLink."""
    from helpers import DEGRADED, tray

    from nodecheck.assemble.rails import rank_nvlink

    up = dict(json.loads(DEGRADED), status="UP")
    ready = tray(tmp_path / "up", domain=json.dumps(up))
    assert ready.nvlink_across_nodes() == (True, "IMEX READY, its domain UP")
    assert _network_bound(ready, None, "all_reduce", 8, 2)[1] == "nvlink"
    assert rank_nvlink(ready, ready.gpus[0], {})["domain"]
    for report, why in ((tray(tmp_path / "degraded"), "IMEX is not ready (daemon READY, domain DEGRADED)"),
                        (tray(tmp_path / "unread", daemon=None, domain=None), "IMEX's state is unknown")):
        assert report.in_nvlink_domain() and not report.nvlink_across_nodes()[0] and why in report.nvlink_across_nodes()[1]
        spec, kind, basis = _network_bound(report, None, "all_reduce", 8, 2)
        assert kind != "nvlink" and "RDMA rails" in basis  # the tray's one eth0 is no rail: no spec, said why
        assert rank_nvlink(report, report.gpus[0], {}) is None
    over_nvlink = _network_bound(tray(tmp_path / "nccl", daemon=None, domain=None), None, "all_reduce", 8, 2, True)
    assert over_nvlink[1] == "nvlink" and "NCCL's lines show NVLink between nodes" in over_nvlink[2]


@pytest.mark.parametrize("ratio,name", [(0.711, "GB300"), (0.719, "GB200")])
def test_a_healthy_four_gpu_nvlink5_tray_passes_with_margin(ratio, name):
    """OCI's GB300 quick-start and Azure's GB200 benchmarking guide: a healthy 4-GPU tray's all-reduce at 1 GiB reads
    0.711 and 0.719 of NVLink, under the 0.7 calibrated on 8x A100 by no margin; its own calibration passes it by 5%."""
    from helpers import make_measurement, make_report

    from nodecheck.bench.bounds import calibration
    from nodecheck.report.model import Gpu

    tray = make_report(gpus=[Gpu(i, name=f"NVIDIA {name}", architecture=10) for i in range(4)])
    variant = calibration(tray, 4, "nvlink")
    assert variant == "gen5x4"
    m = make_measurement(path="allreduce:node-4-gpus", rate=ratio * 1800e9, spec=1800e9)
    m.details.update(path_kind="nvlink", calibration=variant)
    threshold = Config().ratio_for("allreduce", "nvlink", "busbw", variant)
    assert ratio / threshold >= 1.05 and measurement_findings([m], Config()) == []
    assert Config().ratio_for("allreduce", "nvlink", "busbw", calibration(tray, 8, "nvlink")) == 0.7  # 8 A100s' own
