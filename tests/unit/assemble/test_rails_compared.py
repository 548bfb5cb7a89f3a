"""Without a config, a node's rails are each other's reference. The HGX example snapshot (the published NV18 topology,
gpuN nearest mlx5_N, each port as gpud's H100 NDR node wrote it: `4: ACTIVE`, `5: LinkUp`, `400 Gb/sec (4X NDR)`)
with one port changed as a fault leaves it: down with no link partner (`1: DOWN`, `2: Polling`, as mlx5_11 of
../shared/captures/public/ib/ibstat-h100-node-roce-some-down-polling.txt), disabled on purpose (`3: Disabled`, as
that node's unused ports), or up on two of its four lanes."""

import pytest
from examples_builder import build_node

from nodecheck.config import loads
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report

RAIL_KINDS = ("nic_rail_down", "nic_rate_mismatch")


def judged(tmp_path, config=None, **port):
    snap = build_node(tmp_path / "hgx")
    for name, value in port.items():
        (snap / f"fs/sys/class/infiniband/mlx5_5/ports/1/{name}").write_text(value + "\n")
    report = build_report(SnapshotHost(snap), config)
    return report, [f for f in report.findings if f.kind in RAIL_KINDS + ("nic_down",)]


def test_the_healthy_example_names_no_rail(tmp_path):
    report, found = judged(tmp_path)
    assert len(report.rdma_nics_up()) == 8 and found == []


def test_a_rail_without_a_link_partner_is_named_with_its_gpu(tmp_path):
    _, found = judged(tmp_path, state="1: DOWN", phys_state="2: Polling")
    (finding,) = found
    assert (finding.kind, finding.subject, finding.severity, finding.measured) == ("nic_rail_down", "mlx5_5", "warning",
                                                                                  "DOWN (Polling)")
    assert "the nearest NIC of gpu5" in finding.message and "`ibstat mlx5_5`" in finding.message


def test_a_rail_the_subnet_manager_never_activated_is_named(tmp_path):
    """Link up, port INIT: no subnet manager brought it to ACTIVE, and NCCL cannot use it."""
    _, found = judged(tmp_path, state="2: INIT", phys_state="5: LinkUp")
    assert [(f.kind, f.subject, f.measured) for f in found] == [("nic_rail_down", "mlx5_5", "INIT (LinkUp)")]


def test_a_config_that_wants_it_up_makes_it_an_error(tmp_path):
    config = loads('[nics."mlx5_5"]\nstate = "up"\n', "test")
    _, found = judged(tmp_path, config, state="1: DOWN", phys_state="2: Polling")
    assert {(f.kind, f.severity) for f in found} == {("nic_down", "error"), ("nic_rail_down", "warning")}


@pytest.mark.parametrize("port", [{"state": "1: DOWN", "phys_state": "3: Disabled"}, {"state": ""}, {"state": "\x00"}])
def test_a_port_disabled_on_purpose_or_unread_is_not_a_fault(tmp_path, port):
    """Disabled on purpose, as a node's unused ports are; or a state file empty or garbled: unknown, not down."""
    assert judged(tmp_path, **port)[1] == []


def test_a_port_up_at_2x_is_slower_than_the_other_rails(tmp_path):
    _, found = judged(tmp_path, rate="200 Gb/sec (2X NDR)")
    assert [(f.kind, f.subject, f.measured, f.expected) for f in found] == [
        ("nic_rate_mismatch", "mlx5_5", "200 Gbit/s", "400 Gbit/s")]


def test_every_rail_down_is_no_comparison(tmp_path):
    """No rail is up to compare with (a switch reboot, the subnet manager gone): the rails say nothing; a config's
    [nics] or the bandwidth test does."""
    snap = build_node(tmp_path / "hgx")
    for k in range(8):
        (snap / f"fs/sys/class/infiniband/mlx5_{k}/ports/1/state").write_text("2: INIT\n")
    report = build_report(SnapshotHost(snap))
    assert not [f for f in report.findings if f.kind in RAIL_KINDS]
