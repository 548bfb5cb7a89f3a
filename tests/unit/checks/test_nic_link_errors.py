"""An Ethernet NIC's link going down and frames arriving damaged (src/nodecheck/probes/nics.py NETDEV_COUNTERS,
src/nodecheck/checks/error_counters.py netdev_findings): what `ip -s link` shows an operator first on a RoCE rail or the socket NIC
of a gloo job. Read from the real sysfs trees of node_exporter's and procfs's fixtures (../shared/peer/sysfs: igb's
ens10f0 up after one carrier drop, ice's enp162s0f0np0 down), and judged over two
samples. The kernel's counter itself is read from a real veth whose peer goes down and up in
tests/unit/probes/test_nics.py."""

import pytest
from helpers import SHARED, make_measurement, make_nic, make_report, need

from nodecheck.assemble.counters import counter_sample
from nodecheck.checks import evaluate, unmade_checks
from nodecheck.checks.error_counters import netdev_findings
from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.probes.nics import collect
from nodecheck.report.events import CounterSample, History
from nodecheck.verdicts.bandwidth import with_measurements

PEER = SHARED / "peer" / "sysfs"


def nic_of(case: str, name: str):
    return next(n for n in collect(SnapshotHost(need(PEER / case))).nics if n.name == name)


def test_the_counters_of_the_published_trees():
    """igb's ens10f0: up, its carrier down once and up once since boot, no checksum error; ice's enp162s0f0np0:
    down, its carrier down once. A virtual netdev (node_exporter's bond0) has none: nothing to judge."""
    ens = nic_of("node_exporter-devices-ens10f0", "ens10f0")
    assert ens.counters == {"carrier_down_count": 1, "carrier_changes": 2, "rx_crc_errors": 0}
    ice = nic_of("procfs-devices-enp162s0f0np0", "enp162s0f0np0")
    assert (ice.state, ice.counters["carrier_down_count"]) == ("down", 1)
    assert nic_of("node_exporter-sys", "bond0").counters == {}


def report_with(now: dict, before: dict | None, kind: str = "ethernet", virtual: bool = False, measurements=()):
    nic = make_nic("ens10f0", kind=kind, virtual=virtual, counters=now)
    samples = [CounterSample(940.0, {f"net/ens10f0/{k}": v for k, v in before.items()})] if before is not None else []
    return make_report(nics=[nic], history=History("boot", [], samples, 1000.0), measurements=list(measurements))


def captured() -> dict:
    return dict(nic_of("node_exporter-devices-ens10f0", "ens10f0").counters)


def test_a_carrier_drop_since_the_previous_sample_is_a_warning():
    before, now = captured(), captured()
    now.update(carrier_down_count=3, carrier_changes=6)
    (finding,) = netdev_findings(report_with(now, before), Config())
    assert (finding.kind, finding.severity, finding.subject, finding.measured) == (
        "nic_link_errors", "warning", "ens10f0", "carrier_down_count +2")
    assert "went down 2 time(s) in 60 s (now up)" in finding.message


def test_a_kernel_before_5_8_counts_downs_and_ups_together():
    before, now = {"carrier_changes": 2, "rx_crc_errors": 0}, {"carrier_changes": 4, "rx_crc_errors": 0}
    (finding,) = netdev_findings(report_with(now, before), Config())
    assert finding.measured == "carrier_changes +2" and "2 carrier change(s) (a down and an up each)" in finding.message


def test_checksum_errors_above_the_limit_are_an_error_tempered_by_a_passing_path():
    before, now = captured(), captured()
    now["rx_crc_errors"] = 1200  # 20/s over 60 s
    report = report_with(now, before)
    (finding,) = netdev_findings(report, Config())
    assert (finding.severity, finding.measured, finding.expected) == ("error", "rx_crc_errors 20.0/s", "<= 10/s")
    report.findings = evaluate(report, Config())
    passing = make_measurement("nic:ens10f0", "allreduce", rate=0.95e9, spec=1e9, details={"path_kind": "ethernet"})
    (tempered,) = [f for f in with_measurements(report, [passing], 0.0, Config()).findings if f.kind == "nic_link_errors"]
    assert tempered.severity == "warning" and "its path's last bandwidth test passed" in tempered.message
    low = make_measurement("allreduce:4-ranks", "allreduce", rate=0.3e9, spec=1e9, details={"path_kind": "ethernet"})
    judged = {f.kind: f for f in with_measurements(report, [low], 0.0, Config()).findings}
    assert judged["bandwidth_below_spec"].message.endswith("error signals on this path: ens10f0 rx_crc_errors 20.0/s")
    assert judged["nic_link_errors"].severity == "error"
    now["rx_crc_errors"] = 300  # 5/s: under the limit
    assert netdev_findings(report_with(now, before), Config()) == []
    config = Config()
    config.errors.limits["nic_rx_crc_errors_per_s"] = 50
    now["rx_crc_errors"] = 1200
    assert netdev_findings(report_with(now, before), config) == []


def test_what_is_not_judged():
    before, now = captured(), captured()
    now.update(carrier_down_count=9, rx_crc_errors=99999)
    assert netdev_findings(report_with(now, before, kind="infiniband"), Config()) == []  # its port's counters judge it
    assert netdev_findings(report_with(now, before, virtual=True), Config()) == []
    assert netdev_findings(report_with(now, dict(now)), Config()) == []  # nothing moved
    first = report_with(now, None)
    assert netdev_findings(first, Config()) == [] and "nic_link_errors" in unmade_checks(first)
    reset = report_with(captured(), now)  # counters went down: a driver reload, unknown for this run
    assert netdev_findings(reset, Config()) == []
    garbled = dict(now, carrier_down_count=None, carrier_changes=None, rx_crc_errors=None)
    assert netdev_findings(report_with(garbled, before), Config()) == []
    assert not [k for k in counter_sample(report_with(garbled, before)) if k.startswith("net/")]


@pytest.mark.parametrize("text", ["-1", "1e3", "²", "9" * 30, "", "N/A"])
def test_a_garbled_counter_file_reads_as_unknown(tmp_path, text):
    """The tree with its carrier_down_count replaced (a hostile snapshot, a broken driver)."""
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(need(PEER / "node_exporter-devices-ens10f0"), tree, symlinks=True)
    (tree / "fs/sys/class/net/ens10f0/carrier_down_count").write_text(text + "\n")
    nic = next(n for n in collect(SnapshotHost(tree)).nics if n.name == "ens10f0")
    assert nic.counters["carrier_down_count"] is None and nic.counters["carrier_changes"] == 2


def test_inspect_says_the_nic_links_are_counted():
    """`inspect`'s error-counter line names the NIC links among what it covers (it once read "Error counters: ;")."""
    from nodecheck.render.kernel_log import counter_lines

    assert counter_lines(report_with(captured(), captured())) == ["Error counters: 1 NIC links; rates over the last 60 s"]
