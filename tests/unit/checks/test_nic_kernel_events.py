"""A ConnectX NIC's own events in the kernel log: a port module (cable or transceiver) error and its PCIe slot short
of power, as mlx5_core prints them (drivers/net/ethernet/mellanox/mlx5/core/events.c). The lines are the ones gpud's
InfiniBand matcher quotes from its nodes and tests against (components/accelerator/nvidia/infiniband/kmsg_matcher.go
@4a8de33a3f), in the log formats nodecheck reads; the NIC is a real sysfs tree (test_roce_gids' RoCE HCA at
0000:1a:00.0, netdev bond0), read by the real NIC probe."""

import json

from helpers import NCCL_769, cli, make_measurement, make_report, roce_node

from nodecheck.checks.nic_events import nic_events
from nodecheck.config import Config
from nodecheck.probes.kernel_log import NIC_MODULE_ERROR, NIC_SLOT_POWER, parse_kernel_log
from nodecheck.probes.nics import collect
from nodecheck.report.events import KernelLog
from nodecheck.report.model import Platform

# as gpud quotes them (its node ny2g1r12hh2, and its matcher's test lines), the address moved to this test's HCA
HOT = "mlx5_core 0000:1a:00.0: mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, High Temperature"
POWER = ("ny2g1r12hh2 kernel: mlx5_core 0000:1a:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on "
         "the PCIe slot (27W).")
NO_ADDRESS = "mlx5_port_module_event:2345:(pid 1234): Port module event[error]: module 1, Cable error, Bad or shorted cable/module"
PLUGGED = "mlx5_core 0000:1a:00.0: port_module:254:(pid 0): Port module event: module 0, Cable plugged"


def log_of(*lines: str) -> str:
    """/dev/kmsg records, as nodecheck reads them first."""
    return "\n".join(f"3,{100 + i},{(500 + i) * 1_000_000},-;{line}" for i, line in enumerate(lines))


def test_the_module_and_slot_power_lines_are_read_in_each_format():
    for text in (log_of(HOT, POWER), f"[  500.000000] {HOT}\n[  501.000000] {POWER}",
                 f"[Sun Dec  1 14:54:40 2024] {HOT}\n[Sun Dec  1 14:54:41 2024] {POWER}"):
        hot, power = parse_kernel_log(text)
        assert (hot.kind, hot.pci, hot.code, hot.message) == ("nic", "0000:1a:00.0", NIC_MODULE_ERROR, "module 0: High Temperature")
        assert (power.code, power.message) == (NIC_SLOT_POWER, "insufficient power on the PCIe slot (27 W)")
    (anonymous,) = parse_kernel_log(log_of(NO_ADDRESS, PLUGGED))  # a cable plugged in is no error
    assert (anonymous.pci, anonymous.message) == (None, "module 1: Bad or shorted cable/module")


def report_with(tmp_path, text: str):
    facts = collect(roce_node(tmp_path, NCCL_769))
    report = make_report(nics=facts.nics, platform=Platform(None, True, nccl_conf={}))
    report.kernel_log = KernelLog(True, None, "/dev/kmsg", parse_kernel_log(text), uptime_usec=600 * 1_000_000)
    return report


def test_each_event_is_a_warning_naming_the_nic_and_joins_its_rails_verdict(tmp_path):
    """Three High Temperature events and one slot power event on bond0's HCA: one warning each, subject bond0; a slow
    all-reduce across nodes over it names them, a slow host copy does not; an event whose line names no address is
    the node's (nic?), never a GPU's."""
    from nodecheck.verdicts.bandwidth import with_measurements

    report = report_with(tmp_path, log_of(HOT, HOT, POWER, HOT, NO_ADDRESS))
    found = {(f.kind, f.subject): f for f in nic_events(report, Config())}
    module, power, anonymous = found["nic_module_error", "bond0"], found["nic_slot_power", "bond0"], found["nic_module_error", "nic?"]
    assert {f.severity for f in found.values()} == {"warning"} and module.measured == "module 0: High Temperature"
    assert "x3 since boot" in module.message and "`ethtool -m bond0`" in module.message
    assert "`nodecheck clear nic_module_error --gpu bond0`" in module.message
    assert "powers down ports" in power.message and "Bad or shorted" in anonymous.measured
    report.findings = list(found.values())
    across = make_measurement("allreduce:16-ranks", "allreduce", rate=0.1 * 25e9, spec=25e9, details={"path_kind": "roce"})
    host = make_measurement("gpu0:host", "h2d", rate=0.3 * 50e9, spec=50e9, direction="unidirectional",
                            details={"path_kind": "pcie"})
    slow = {f.message.split(" ")[0]: f for f in with_measurements(report, [across, host], 0.0, Config()).findings
            if f.kind == "bandwidth_below_spec"}
    assert "error signals on this path: bond0 module 0: High Temperature; bond0 insufficient power" in slow["allreduce:16-ranks"].message
    assert "error signals" not in slow["gpu0:host"].message


def test_the_kernel_log_command_and_its_json_say_them(tmp_path):
    (tmp_path / "dmesg.txt").write_text(log_of(HOT, POWER))
    result = cli("kernel-log", str(tmp_path / "dmesg.txt"), "--json")
    document = json.loads(result.stdout)
    assert [(e["kind"], e["device"], e["name"], e["severity"]) for e in document["events"]] == [
        ("nic", "0000:1a:00.0", "port module error", "warning"), ("nic", "0000:1a:00.0", "PCIe slot short of power", "warning")]
    assert {(f["kind"], f["subject"]) for f in document["findings"]} == {("nic_module_error", "pci:0000:1a:00.0"),
                                                                         ("nic_slot_power", "pci:0000:1a:00.0")}
    assert result.returncode == 0  # warnings: the node does not fail
    text = cli("kernel-log", str(tmp_path / "dmesg.txt")).stdout
    assert "0000:1a:00.0: NIC port module error x1 (watch)" in text


def test_a_nic_is_cleared_by_its_name():
    from nodecheck.cli.signals import _subject

    assert [_subject(name) for name in ("bond0", "ibp26s0", "3", "nvswitch1", "0000:1a:00.0")] == [
        "bond0", "ibp26s0", "gpu3", "nvswitch1", "pci:0000:1a:00.0"]
