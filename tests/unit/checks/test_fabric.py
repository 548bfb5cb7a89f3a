"""Across nodes on RDMA nodes, NCCL's data moves over the rails (the RDMA NICs nearest to the GPUs),
not the socket NIC: the spec is the ring bound over those rails."""

import pytest
from helpers import A100_SXM4, PUBLIC, gpu_node_with_rdma, hgx_h100_with_ndr, hgx_nvml, need

from nodecheck.assemble.rails import fabric_nics, ring_bound
from nodecheck.bench.nccl_tests import parse_nccl_log
from nodecheck.config import Config
from nodecheck.report.model import Measurement
from nodecheck.verdicts.bandwidth import algorithm_bound, measurement_findings


def efa_node(tmp_path, topo: str, nvml_gpus: list[dict], adapters: int):
    """An AWS EFA node: `adapters` EFA devices, each reporting 100 Gb/sec (4X EDR) with no link layer, as the
    efa driver answers (p4d/p4de: 4 adapters = 400 Gbit/s; p5.48xlarge: 32 = 3200 Gbit/s, AWS's figures)."""
    devices = [(f"rdmap{16 + i}s0", "100 Gb/sec (4X EDR)", "Unspecified") for i in range(adapters)]
    return gpu_node_with_rdma(tmp_path / topo, topo, nvml_gpus, devices)


def judged(report, log_name: str, ranks: int, environ: dict | None = None, size: int | None = None):
    """The largest out-of-place busbw of a published log (or its row at `size` bytes) as nodecheck's all-reduce
    across `ranks` ranks, against the ring bound of this node's rails; with its findings."""
    bound, _ = ring_bound(report, fabric_nics(report, environ or {}), Config())
    log = parse_nccl_log(need(PUBLIC / "nccl" / log_name).read_text())
    rows = [r for r in log.rows if r.out_of_place and (size is None or r.size_bytes == size)]
    largest = max(rows, key=lambda r: r.size_bytes)
    m = Measurement.measured(f"allreduce:{ranks}-ranks", "allreduce", largest.out_of_place.busbw_gbytes * 1e9, bound,
                             largest.size_bytes, "nccl-tests", "busbw", {"path_kind": "infiniband"})
    return m, measurement_findings([m], Config())


def test_the_rails_are_the_rdma_nics_nearest_the_gpus(tmp_path):
    report = hgx_h100_with_ndr(tmp_path)
    rails = fabric_nics(report, {})
    assert sorted(n.rdma_device for n in rails) == [f"mlx5_{i}" for i in range(8)]  # not the storage NIC
    bound, basis = ring_bound(report, rails, Config())
    assert bound == pytest.approx(8 * 400e9 / 8) and "8 rail(s)" in basis


def test_nccl_ib_hca_and_ib_disable_are_read_as_nccl_reads_them(tmp_path):
    report = hgx_h100_with_ndr(tmp_path)
    two = fabric_nics(report, {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"})
    assert sorted(n.rdma_device for n in two) == ["mlx5_0", "mlx5_1"]
    assert ring_bound(report, two, Config())[0] == pytest.approx(100e9)
    assert sorted(n.rdma_device for n in fabric_nics(report, {"NCCL_IB_HCA": "^mlx5_8,mlx5_7"})) == [f"mlx5_{i}" for i in range(7)]
    assert fabric_nics(report, {"NCCL_IB_DISABLE": "1"}) == []


def test_a_published_healthy_ib_run_reads_as_healthy_against_the_ring_bound(tmp_path):
    """CoreWeave's H100 run over NDR InfiniBand (with SHARP; 96 ranks by its rows' busbw/algbw, where its README
    says 64), judged on nodes like the one above: 0.97 of the ring bound, no finding; not absurdly above it either."""
    report = hgx_h100_with_ndr(tmp_path)
    bound, _ = ring_bound(report, fabric_nics(report, {}), Config())
    log = parse_nccl_log(need(PUBLIC / "nccl" / "coreweave-h100-64gpu-ib-sharp-all_reduce_perf-elided.txt").read_text())
    largest = max((r for r in log.rows if r.out_of_place), key=lambda r: r.size_bytes)
    m = Measurement.measured("allreduce:96-ranks", "allreduce", largest.out_of_place.busbw_gbytes * 1e9, bound,
                             largest.size_bytes, "nccl-tests", "busbw", {"path_kind": "infiniband"})
    assert 0.9 < m.ratio < 1.1 and measurement_findings([m], Config()) == []
    # the same run judged against the socket NIC alone (what nodecheck did before) reads absurdly high
    assert largest.out_of_place.busbw_gbytes * 1e9 / (100e9 / 8) > 30


def test_published_aws_efa_runs_read_as_healthy(tmp_path):
    """2x p4de (16 A100, 4 EFA each) and 2x p5 (8 H100, 32 EFA each): above the ring bound (NCCL picks a tree for
    few nodes, which sends each node's data across once rather than 2(n-1)/n times), below what any algorithm can
    reach (2(n-1)/n x the ring bound), no finding. The AWS Batch p5 log names no rank count, but its rows do
    (483.05 / 276.03 = 1.75 = 2 x 7/8): 8 ranks, one p5 node over NVLink (with NVLS), not a run across nodes."""
    p4de = efa_node(tmp_path, "aws-p4d-24xlarge-8x-a100-nv12.txt", hgx_nvml(12, version=5, **A100_SXM4), adapters=4)
    p5 = efa_node(tmp_path, "aws-p5-48xlarge-8x-h100-nv18.txt", hgx_nvml(18, version=6), adapters=32)
    assert ring_bound(p4de, fabric_nics(p4de, {}), Config())[0] == pytest.approx(50e9)
    assert ring_bound(p5, fabric_nics(p5, {}), Config())[0] == pytest.approx(400e9)
    for report, log, expected in ((p4de, "aws-2x-p4de-all_reduce_perf-srun-prefixed-noavg.txt", 78.33 / 50),
                                  (p5, "aws-eks-2x-p5-all_reduce_perf-mpirun-tagged-elided.txt", 437.79 / 400)):
        m, findings = judged(report, log, ranks=16)
        assert m.ratio == pytest.approx(expected, abs=0.01) and 1 < m.ratio < algorithm_bound(m) == 1.875, (log, m.ratio)
        assert findings == [], (log, findings)
    from nodecheck.bench.collective_rows import ranks_from_rows
    from nodecheck.bench.nccl_tests import parse_nccl_log

    batch = parse_nccl_log(need(PUBLIC / "nccl" / "aws-batch-p5-all_reduce_perf-mpirun-tagged.txt").read_text())
    assert ranks_from_rows(batch, "all_reduce") == (8, 8)


def test_published_aws_efa_runs_read_as_healthy_through_nccl_log(tmp_path):
    """`bench --nccl-log ... --nodes 2` on the same two AWS logs: a rank's traffic leaves by its GPU's rails, four EFA
    adapters a GPU on a p5 (before: one, so AWS's healthy 438 GB/s read 4.38 x a 100 GB/s bound, a 'misread'
    warning), the four adapters of a p4de shared by its eight GPUs. One rank per p5 node is bounded by its GPU's four."""
    from nodecheck.bench.nccl_binary import _network_bound, measurement_from_log

    p4de = efa_node(tmp_path, "aws-p4d-24xlarge-8x-a100-nv12.txt", hgx_nvml(12, version=5, **A100_SXM4), adapters=4)
    p5 = efa_node(tmp_path, "aws-p5-48xlarge-8x-h100-nv18.txt", hgx_nvml(18, version=6), adapters=32)
    for report, name, bound, rails in ((p5, "aws-eks-2x-p5-all_reduce_perf-mpirun-tagged-elided.txt", 400e9, "32 rail(s)"),
                                       (p4de, "aws-2x-p4de-all_reduce_perf-srun-prefixed-noavg.txt", 50e9, "4 rail(s)")):
        m = measurement_from_log(parse_nccl_log(need(PUBLIC / "nccl" / name).read_text()), report, "nccl-log", "m", nodes=2)
        assert m.spec_bytes_per_second == pytest.approx(bound) and f"ring bound: {rails}" in m.details["spec_basis"], m.details
        assert measurement_findings([m], Config()) == [], name
    assert "4 rails per GPU" in measurement_from_log(parse_nccl_log(need(PUBLIC / "nccl" / "aws-eks-2x-p5-all_reduce_perf-mpirun-tagged-elided.txt")
                                                                    .read_text()), p5, "nccl-log", "m", nodes=2).details["spec_basis"]
    slow = parse_nccl_log(need(PUBLIC / "nccl" / "aws-eks-2x-p5-all_reduce_perf-mpirun-tagged-elided.txt").read_text())
    for row in slow.rows:  # the same job with half its rail bandwidth: caught against the p5's 32 adapters
        if row.out_of_place:
            row.out_of_place.busbw_gbytes /= 2
    (finding,) = measurement_findings([measurement_from_log(slow, p5, "nccl-log", "m", nodes=2)], Config())
    assert (finding.kind, finding.severity, finding.measured) == ("bandwidth_below_spec", "error", "0.55")
    one, _, basis = _network_bound(p5, None, "all_reduce", 2, 2)
    assert one == pytest.approx(50e9) and "ring bound: 4 rail(s)" in basis
    assert _network_bound(p5, None, "sendrecv", 2, 2)[0] == pytest.approx(50e9)


def test_published_healthy_runs_pass_at_benchs_quick_payload(tmp_path):
    """bench --quick judges its all-reduce across nodes at 1 GiB. AWS's own two p5 nodes on EKS reached 313.29 GB/s
    there, 0.78 of the 400 GB/s ring bound (1.09 at 2 GiB): against the general 0.8 a healthy pair was named slow and
    drained. `allreduce.infiniband` is calibrated at 0.7: every published run passes at that payload, and the same
    figure where the node's rails allow twice as much (half its rail bandwidth missing) is still an error."""
    from nodecheck.bench.distributed import LEVELS

    (quick,) = LEVELS["nccl"]["quick"]["sizes"]
    p4de = efa_node(tmp_path, "aws-p4d-24xlarge-8x-a100-nv12.txt", hgx_nvml(12, version=5, **A100_SXM4), adapters=4)
    p5 = efa_node(tmp_path, "aws-p5-48xlarge-8x-h100-nv18.txt", hgx_nvml(18, version=6), adapters=32)
    for report, log, ranks, expected in (
            (p5, "aws-eks-2x-p5-all_reduce_perf-mpirun-tagged-elided.txt", 16, 313.29 / 400),
            (p4de, "aws-2x-p4de-all_reduce_perf-srun-prefixed-noavg.txt", 16, 76.79 / 50),
            (hgx_h100_with_ndr(tmp_path), "coreweave-h100-64gpu-ib-sharp-all_reduce_perf-elided.txt", 96, 365.90 / 400)):
        m, findings = judged(report, log, ranks, size=quick)
        assert m.ratio == pytest.approx(expected, abs=0.005) and findings == [], (log, m.ratio, findings)
    assert Config().threshold("allreduce", "infiniband")[1].startswith("calibrated for allreduce over infiniband")
    m, _ = judged(p5, "aws-eks-2x-p5-all_reduce_perf-mpirun-tagged-elided.txt", 16, size=quick)
    halved = Measurement.measured(m.path, m.test, m.bytes_per_second, 2 * m.spec_bytes_per_second, quick, "nccl-tests",
                                  "busbw", {"path_kind": "infiniband"})
    (finding,) = measurement_findings([halved], Config())
    assert (finding.kind, finding.severity, finding.measured) == ("bandwidth_below_spec", "error", "0.39")


def test_a_log_across_nodes_that_stops_before_busbw_levels_off_is_said_not_judged(tmp_path):
    """AWS's healthy EKS 2x p5 job read 167 GB/s at 256 MiB and 279 at 512 MiB, 0.42 and 0.70 of the 400 GB/s ring
    bound of its 32 adapters, and 438 at 2 GiB: the same log pasted only to 512 MiB is latency, not the rails. It is
    said (info) instead of naming a slow node; to 1 GiB it is judged (0.78, healthy). A tenth of that rate is slow at
    any payload a healthy run's share is known for."""
    import dataclasses

    from nodecheck.bench.nccl_binary import measurement_from_log

    p5 = efa_node(tmp_path, "aws-p5-48xlarge-8x-h100-nv18.txt", hgx_nvml(18, version=6), adapters=32)
    log = parse_nccl_log(need(PUBLIC / "nccl" / "aws-eks-2x-p5-all_reduce_perf-mpirun-tagged-elided.txt").read_text())
    whole = list(log.rows)
    for end, severities in ((256 << 20, ["info"]), (512 << 20, ["info"]), (1 << 30, [])):
        log.rows = [r for r in whole if r.size_bytes <= end]
        m = measurement_from_log(log, p5, "nccl-log", "m", nodes=2)
        assert m.details["across_nodes"] and bool(m.details.get("payload_below_plateau")) == bool(severities), (end, m.details)
        m = dataclasses.replace(m, spec_bytes_per_second=400e9)  # the ring bound of all 32 adapters, as judged above
        m.ratio = m.bytes_per_second / m.spec_bytes_per_second
        findings = measurement_findings([m], Config())
        assert [f.severity for f in findings] == severities, (end, findings)
        if severities:
            assert "below the 1 GiB where a healthy run's busbw stops climbing across nodes" in findings[0].message
    # the same job at a tenth of its rate (28 GB/s at 512 MiB, 0.07 of the bound): a healthy run already reads 0.38 of
    # its level at 256 MiB, so this one would level off near 0.18, under half the 0.7 threshold: slow whatever the
    # payload. At 128 MiB (below any published share) it is still only said.
    for end, severity in ((512 << 20, "error"), (256 << 20, "error"), (128 << 20, "info")):
        log.rows = [dataclasses.replace(r, out_of_place=dataclasses.replace(r.out_of_place, busbw_gbytes=r.out_of_place.busbw_gbytes / 10))
                    for r in whole if r.size_bytes <= end and r.out_of_place]
        m = measurement_from_log(log, p5, "nccl-log", "m", nodes=2)
        m = dataclasses.replace(m, spec_bytes_per_second=400e9)
        m.ratio = m.bytes_per_second / m.spec_bytes_per_second
        (finding,) = measurement_findings([m], Config())
        assert finding.severity == severity, (end, finding)
        assert ("slow even for its payload" in finding.message) == (severity == "error")


def test_a_fabric_misread_is_said_not_passed(tmp_path):
    """The same p5 run judged against one 100 Gbit/s rail (NCCL_IB_HCA naming one adapter, as a wrong
    config would): 35 x the bound, which no algorithm reaches: a warning that the verdict cannot be
    trusted, not a pass and not a drain."""
    p5 = efa_node(tmp_path, "aws-p5-48xlarge-8x-h100-nv18.txt", hgx_nvml(18, version=6), adapters=32)
    m, findings = judged(p5, "aws-eks-2x-p5-all_reduce_perf-mpirun-tagged-elided.txt", 16, {"NCCL_IB_HCA": "=rdmap16s0"})
    assert m.ratio == pytest.approx(35.0, abs=0.1)
    (finding,) = findings
    assert (finding.kind, finding.severity) == ("bandwidth_above_bound", "warning") and "misread" in finding.message


def test_a_published_gb200_nvl72_rack_reads_as_healthy_against_nvlink5():
    """CoreWeave's one-rack GB200 NVL72 run: 72 GPUs in one NVLink domain, each with 18 NVLink 5 links
    through the switches (900 GB/s one way), so the bound is a GPU's NVLink rate, not a NIC's:
    0.93 of it, no finding. (The 20-rack run crosses racks over InfiniBand beneath NVLink domains: its
    bound is neither the rails' sum nor NVLink's, and nodecheck does not judge it.)"""
    from nodecheck.core.specs import nvlink

    spec = nvlink(5, 18).bytes_per_second
    log = parse_nccl_log(need(PUBLIC / "nccl" / "coreweave-gb200-nvl72-1rack-all_reduce_perf-partial.txt").read_text())
    largest = max((r for r in log.rows if r.out_of_place), key=lambda r: r.size_bytes)
    m = Measurement.measured("nccl-tests:node-72-gpus", "nccl_tests", largest.out_of_place.busbw_gbytes * 1e9, spec,
                             largest.size_bytes, "nccl-tests", "busbw", {"path_kind": "nvlink"})
    assert spec == pytest.approx(900e9) and m.ratio == pytest.approx(0.927, abs=0.002)
    assert measurement_findings([m], Config()) == []


def test_one_rank_per_node_is_judged_against_its_one_rail(tmp_path, monkeypatch):
    """Issue 20 (2): torchrun's default, one rank per node on an 8-rail HGX node: NCCL drives that rank's GPU
    and its one NIC. The rank hands the worker the rail nearest its GPU (before: the node's eight, so a
    healthy 45 GB/s read 0.11 and every node was named slow); the job's bound sums each node's distinct
    rails over its ranks."""
    from nodecheck.assemble.rails import rank_rails
    from nodecheck.bench import distributed
    from nodecheck.bench.distributed import DistEnv, run_allreduce
    from nodecheck.core.pairing import job_bound

    report = hgx_h100_with_ndr(tmp_path)
    fabric = fabric_nics(report, {})
    nearest = [[n.rdma_device for n in rank_rails(report, gpu, fabric)] for gpu in report.gpus]
    assert all(len(rails) == 1 for rails in nearest) and len({r[0] for r in nearest}) == 8, nearest

    seen = {}

    def worker(argv, out, timeout, env=None):
        seen["argv"] = argv
        rails = __import__("json").loads(argv[argv.index("--rails") + 1])
        members = [{"rank": r, "node": f"node{r}", "address": f"198.18.0.{r + 1}", "rails": rails} for r in range(2)]
        return {"world_size": 2, "backend": "nccl", "nodes": members, "spec_bytes_per_second": job_bound(members),
                "rows": [{"size_bytes": 1 << 30, "seconds": 1.0, "algbw": 45e9, "busbw": 45e9}], "pair_exchanges": []}

    monkeypatch.setattr(distributed, "run_worker", worker)
    env = DistEnv(0, 2, "198.18.0.1", 29500)
    m = run_allreduce(report, Config(), env, "quick", 30, {"LOCAL_RANK": "5", "CUDA_VISIBLE_DEVICES": "5"})
    argv = seen["argv"]
    assert [r["name"] for r in __import__("json").loads(argv[argv.index("--rails") + 1])] == nearest[5]
    assert argv[argv.index("--gpu-uuid") + 1] == report.gpus[5].uuid and argv[argv.index("--gpu-ordinal") + 1] == "0"
    assert m.spec_bytes_per_second == pytest.approx(50e9) and m.ratio == pytest.approx(0.9)
    assert measurement_findings([m], Config()) == [] and "local rank 5: gpu5" in m.details["fabric"]
    assert m.details["gpu"]["index"] == 5
    # the slow-node exchange starts where the verdict does
    assert float(argv[argv.index("--threshold") + 1]) == Config().ratio_for(m.test, m.details["path_kind"], m.direction)
