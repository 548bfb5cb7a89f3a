"""Across nodes on RDMA nodes, NCCL's data moves over the rails (the RDMA NICs nearest to the GPUs),
not the socket NIC: the spec is the ring bound over those rails."""

import pytest

from conftest import PUBLIC, hgx_nvml, make_snapshot, need
from nodecheck.bench.distributed import fabric_nics, ring_bound
from nodecheck.bench.nccl_tests import parse_nccl_log
from nodecheck.build import build_report
from nodecheck.config import Config
from nodecheck.model import Measurement
from nodecheck.rules import measurement_findings
from nodecheck.snapshot import SnapshotHost


def hgx_h100_with_ndr(tmp_path, storage_nic: bool = True):
    """An HGX H100 node: the published 8-GPU/8-NIC topology (one mlx5 per GPU), NVML as such a board
    reports, and /sys/class/infiniband with every rail an ACTIVE 400 Gb/sec (4X NDR) port, plus a
    100 Gb/s storage NIC near no GPU, as such nodes are built."""
    snap = make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    devices = [(f"mlx5_{i}", "400 Gb/sec (4X NDR)") for i in range(8)] + ([("mlx5_8", "100 Gb/sec (4X EDR)")] if storage_nic else [])
    for name, rate in devices:
        port = snap / "fs/sys/class/infiniband" / name / "ports" / "1"
        port.mkdir(parents=True)
        for file, text in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("rate", rate), ("link_layer", "InfiniBand")):
            (port / file).write_text(text + "\n")
    (snap / "fs/sys/class/net/lo").mkdir(parents=True)
    (snap / "fs/sys/class/net/lo/type").write_text("772\n")
    return build_report(SnapshotHost(snap))


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
    """CoreWeave's 64x H100 run over NDR InfiniBand (with SHARP), judged on nodes like the one above:
    0.97 of the ring bound, no finding; not absurdly above it either."""
    report = hgx_h100_with_ndr(tmp_path)
    bound, _ = ring_bound(report, fabric_nics(report, {}), Config())
    log = parse_nccl_log(need(PUBLIC / "nccl" / "coreweave-h100-64gpu-ib-sharp-all_reduce_perf-elided.txt").read_text())
    largest = max((r for r in log.rows if r.out_of_place), key=lambda r: r.size_bytes)
    m = Measurement.measured("allreduce:64-ranks", "allreduce", largest.out_of_place.busbw_gbytes * 1e9, bound,
                             largest.size_bytes, "nccl-tests", "busbw", {"path_kind": "infiniband"})
    assert 0.9 < m.ratio < 1.1 and measurement_findings([m], Config()) == []
    # the same run judged against the socket NIC alone (what nodecheck did before) reads absurdly high
    assert largest.out_of_place.busbw_gbytes * 1e9 / (100e9 / 8) > 30
