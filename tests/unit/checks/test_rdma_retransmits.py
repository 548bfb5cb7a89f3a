"""Transport retransmissions (src/nodecheck/probes/ib_counters.py TRANSPORT_COUNTERS, src/nodecheck/checks/error_counters.py): the hw_counters an
operator reads first when NCCL across nodes is slow on RoCE or InfiniBand. Read from gpud's H100 node
(../shared/captures/public/health/ib: every port's at 0 there, as on a healthy idle fabric), then judged over two
samples: any rise is a warning naming the counters, never a drain, and a collective across nodes that measured
low names it on its path."""

import pytest
from helpers import PUBLIC, make_measurement, make_nic, make_report, need
from sysfs_trees import CapturedTree, hca_below_switch_port

from nodecheck.assemble.counters import counter_sample
from nodecheck.checks import evaluate, unmade_checks
from nodecheck.checks.error_counters import ib_findings
from nodecheck.config import Config
from nodecheck.probes.ib_counters import TRANSPORT_COUNTERS, parse_counter, read_port_counters
from nodecheck.report.events import CounterSample, History
from nodecheck.report.model import IbPort
from nodecheck.verdicts.bandwidth import with_measurements

GPUD = PUBLIC / "health/ib/gpud-sys-class-infiniband-h100"
NODE_EXPORTER_IB = PUBLIC / "health/ib/node_exporter-sys/class/infiniband"


def test_the_transport_counters_of_gpuds_h100_ports_read_as_counts():
    """ConnectX-7 keeps three of the four (req_transport_retries_exceeded came with Linux 6.11, after the capture);
    mlx4 in node_exporter's tree keeps none: they are left out, not unknown."""
    for device in ("mlx5_0", "mlx5_bond_0"):
        read = read_port_counters(CapturedTree(need(GPUD)), f"{device}/ports/1")
        values = {name: parse_counter(read[name]) for name in TRANSPORT_COUNTERS if name in read}
        assert values == {"local_ack_timeout_err": 0, "packet_seq_err": 0, "out_of_sequence": 0}, device
    mlx4 = read_port_counters(CapturedTree(need(NODE_EXPORTER_IB)), "mlx4_0/ports/1")
    assert not set(TRANSPORT_COUNTERS) & set(mlx4)


def captured(device: str = "mlx5_bond_0") -> dict:
    """The port's judged counters as the real reader parses them from gpud's tree."""
    return {name: parse_counter(text) for name, text in read_port_counters(CapturedTree(need(GPUD)), f"{device}/ports/1").items()}


def report_with(counters: dict, before: dict | None, link_layer: str = "Ethernet", measurements=()):
    port = IbPort("mlx5_bond_0", 1, "ACTIVE", "LinkUp", "200 Gb/sec (2X NDR)", link_layer, counters)
    nic = make_nic("bond0", kind="ethernet", rdma_device="mlx5_bond_0", ib_ports=[port])
    samples = [CounterSample(940.0, {f"ib/mlx5_bond_0/1/{k}": v for k, v in before.items()})] if before is not None else []
    return make_report(nics=[nic], history=History("boot", [], samples, 1000.0), measurements=list(measurements))


def test_a_rise_is_one_warning_naming_each_counter_that_rose():
    now = captured()
    before = dict(now)
    now.update(local_ack_timeout_err=6, out_of_sequence=40)
    (finding,) = [f for f in ib_findings(report_with(now, before), Config()) if f.kind == "rdma_retransmits"]
    assert (finding.severity, finding.subject) == ("warning", "mlx5_bond_0/1")
    assert finding.measured == "local_ack_timeout_err +6, out_of_sequence +40"
    assert "in 60 s" in finding.message and "lossless" in finding.message and "(bond0)" in finding.message


@pytest.mark.parametrize("name", sorted(TRANSPORT_COUNTERS))
def test_each_counter_alone_is_named(name):
    before = {name: 10}
    (finding,) = ib_findings(report_with({name: 11}, before), Config())
    assert (finding.kind, finding.measured) == ("rdma_retransmits", f"{name} +1")


def retransmits(report) -> list:
    return [f for f in ib_findings(report, Config()) if f.kind == "rdma_retransmits"]


def test_unchanged_first_sample_reset_and_unreadable_say_nothing():
    now = captured()  # the capture's other counters sit saturated (ib_counter_saturated): not this check's
    assert retransmits(report_with(now, dict(now))) == []
    first = report_with(dict(now, out_of_sequence=500), None)
    assert retransmits(first) == [] and "rdma_retransmits" in unmade_checks(first)
    wrapped = report_with(dict(now, out_of_sequence=3), dict(now, out_of_sequence=(1 << 32) - 2))  # 32 bits wrapped
    assert retransmits(wrapped) == []
    garbled = report_with(dict(now, out_of_sequence=None), dict(now, out_of_sequence=0))
    assert retransmits(garbled) == [] and "ib/mlx5_bond_0/1/out_of_sequence" not in counter_sample(garbled)


def test_a_low_collective_across_nodes_names_them_and_nothing_drains_on_them_alone():
    """Judged the way bench and serve judge (verdicts.with_measurements): the all-reduce across nodes at 0.40 of
    its spec names the retransmissions on its path; alone they are a warning and fail nothing."""
    now = captured()
    before = dict(now)
    now["local_ack_timeout_err"] = 8  # retry_cnt 7 + the first try: one send that never got its ack
    report = report_with(now, before)
    report.findings = evaluate(report, Config())
    low = make_measurement("allreduce:16-ranks", "allreduce", rate=20e9, spec=50e9, details={"path_kind": "ethernet"})
    findings = {f.kind: f for f in with_measurements(report, [low], 0.0, Config()).findings}
    assert findings["bandwidth_below_spec"].message.endswith(
        "; error signals on this path: mlx5_bond_0/1 local_ack_timeout_err +8")
    assert findings["rdma_retransmits"].severity == "warning"
    assert [f.kind for f in report.findings if f.severity == "error"] == []


def test_two_real_runs_of_the_reader_over_gpuds_port(tmp_path, monkeypatch):
    """The real reader (LiveHost) on a /sys tree holding gpud's mlx5_0 port, twice, with the real state file."""
    from nodecheck.host.live import LiveHost
    from nodecheck.pipeline import build_report

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    root = tmp_path / "root"
    port = hca_below_switch_port(root, need(GPUD / "mlx5_0/ports/1"))
    first = build_report(LiveHost(root))
    assert "rdma_retransmits" in unmade_checks(first)
    (root / "proc/uptime").write_text("1060.00 2.00\n")
    (port / "hw_counters/packet_seq_err").write_text("12\n")
    second = build_report(LiveHost(root))
    assert [(f.kind, f.subject, f.measured) for f in second.findings if f.kind == "rdma_retransmits"] == [
        ("rdma_retransmits", "mlx5_0/1", "packet_seq_err +12")]
