"""PCIe AER and InfiniBand port error counters (src/nodecheck/probes/aer.py, src/nodecheck/probes/ib_counters.py, src/nodecheck/checks/error_counters.py):
parsed from the published sysfs trees of ../shared/captures/public/health (node_exporter's AER and IB trees,
gpud's H100 NDR node with link_downed saturated at 255), then judged over two real runs of the real reader
against a /sys tree whose counters move between them, the samples kept in a real state file."""

import json

import pytest
from helpers import PUBLIC, make_gpu, make_nic, make_report, need
from sysfs_trees import CapturedTree, hca_below_switch_port

from nodecheck.assemble.counters import FIRST_SAMPLE, counter_sample
from nodecheck.checks import unmade_checks
from nodecheck.checks.error_counters import aer_findings, ib_findings
from nodecheck.config import Config
from nodecheck.core.pci import Hop
from nodecheck.probes.aer import parse_aer_file, read_aer
from nodecheck.probes.ib_counters import parse_counter, read_port_counters, saturated
from nodecheck.report.events import CounterSample, History
from nodecheck.report.model import IbPort

HEALTH = PUBLIC / "health"
GPUD = HEALTH / "ib" / "gpud-sys-class-infiniband-h100"
NODE_EXPORTER_IB = HEALTH / "ib" / "node_exporter-sys" / "class" / "infiniband"


def aer_device() -> "Path":  # noqa: F821 - a pathlib.Path
    return need(HEALTH / "aer/node_exporter-sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0")


def test_aer_files_as_the_kernel_writes_them():
    counts = read_aer(lambda name: (aer_device() / name).read_text() if (aer_device() / name).exists() else None)
    assert counts == {"correctable": 0, "nonfatal": 0, "fatal": 0}
    text = (aer_device() / "aer_dev_correctable").read_text().replace("RxErr 0", "RxErr 40").replace("TOTAL_ERR_COR 0", "TOTAL_ERR_COR 41")
    assert parse_aer_file(text) == (41, {"RxErr": 40})
    assert parse_aer_file("garbage\nRxErr x\n") == (None, {})  # no total: unknown, not 0
    assert read_aer(lambda name: None) is None  # no AER files: a device without AER


def test_ib_counters_of_the_published_trees():
    gpud = {name: parse_counter(text) for name, text in read_port_counters(CapturedTree(need(GPUD)), "mlx5_1/ports/1").items()}
    assert gpud["link_downed"] == 255 and saturated("link_downed", 255)
    assert gpud["excessive_buffer_overrun_errors"] == 15 and saturated("excessive_buffer_overrun_errors", 15)  # 4 bits
    assert gpud["port_rcv_errors"] == 14 and not saturated("port_rcv_errors", 14)
    no_pma = read_port_counters(CapturedTree(need(NODE_EXPORTER_IB)), "i40iw0/ports/1")
    assert no_pma["symbol_error"].strip() == "N/A (no PMA)" and parse_counter(no_pma["symbol_error"]) is None  # unknown, never 0
    mlx4 = {n: parse_counter(t) for n, t in read_port_counters(CapturedTree(need(NODE_EXPORTER_IB)), "mlx4_0/ports/1").items()}
    assert all(isinstance(v, int) for v in mlx4.values() if v is not None)


def report_with(hop_aer: dict | None = None, ib: dict | None = None, samples=(), uptime: float = 1000.0, **fields):
    gpu = make_gpu(3, pci_bus_id="00000000:9B:00.0")
    hops = {"0000:9b:00.0": [Hop("0000:9b:00.0", 16, 16, "32.0 GT/s PCIe", "32.0 GT/s PCIe", {"correctable": 0}),
                             Hop("0000:16:00.0", 16, 16, "32.0 GT/s PCIe", "32.0 GT/s PCIe", hop_aer)]}
    port = IbPort("mlx5_0", 1, "ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand", ib or {})
    nic = make_nic("ibp12s0", kind="infiniband", rdma_device="mlx5_0", ib_ports=[port])
    return make_report(gpus=[gpu], nics=[nic], pcie_paths=hops, history=History("boot", [], list(samples), uptime), **fields)


def test_correctable_aer_above_the_links_limit_is_named_with_the_limit_and_the_devices_behind():
    before = CounterSample(940.0, {"aer/0000:16:00.0/correctable": 100})
    report = report_with({"correctable": 140, "nonfatal": 0, "fatal": 0}, samples=[before])  # +40 in 60 s: 40/min > 31/min
    (finding,) = aer_findings(report, Config())
    assert (finding.kind, finding.subject, finding.expected) == ("pcie_link_errors", "pci:0000:16:00.0", "<= 31/min")
    assert "(gpu3)" in finding.message and "AER correctable +40 in 60 s" in finding.message and "gen5 x16" in finding.message
    calm = report_with({"correctable": 120, "nonfatal": 0, "fatal": 0}, samples=[before])  # 20/min
    assert aer_findings(calm, Config()) == []


def test_a_fatal_aer_drains_and_a_nonfatal_rise_is_an_error():
    report = report_with({"correctable": 0, "nonfatal": 3, "fatal": 2, "fatal.SDES": 2},
                         samples=[CounterSample(900.0, {"aer/0000:16:00.0/nonfatal": 1})])
    findings = {f.kind: f for f in aer_findings(report, Config())}
    assert findings["pcie_aer_fatal"].severity == "error" and "(SDES)" in findings["pcie_aer_fatal"].message
    assert findings["pcie_link_errors"].measured == "AER nonfatal +2"


def test_rates_need_a_previous_sample_old_enough_and_a_counter_that_did_not_go_down():
    first = report_with({"correctable": 500, "nonfatal": 0, "fatal": 0})
    assert aer_findings(first, Config()) == []
    assert unmade_checks(first)["pcie_link_errors"] == FIRST_SAMPLE
    too_close = report_with({"correctable": 500}, samples=[CounterSample(995.0, {"aer/0000:16:00.0/correctable": 0})])
    assert aer_findings(too_close, Config()) == []  # 5 s apart: below min_rate_interval_s
    reset = report_with({"correctable": 5}, samples=[CounterSample(900.0, {"aer/0000:16:00.0/correctable": 500})])
    assert aer_findings(reset, Config()) == []
    assert "pcie_link_errors" not in unmade_checks(report_with({"correctable": 0}, samples=[
        CounterSample(900.0, {"aer/0000:16:00.0/correctable": 0})]))


def test_ib_link_downed_rising_drains_a_saturated_counter_is_named_and_rates_have_limits():
    before = CounterSample(940.0, {"ib/mlx5_0/1/link_downed": 2, "ib/mlx5_0/1/symbol_error": 0, "ib/mlx5_0/1/port_xmit_discards": 0})
    report = report_with(ib={"link_downed": 3, "symbol_error": 1200, "port_xmit_discards": 600, "excessive_buffer_overrun_errors": 15},
                         samples=[before])
    findings = {(f.kind, f.measured): f for f in ib_findings(report, Config())}
    assert set(findings) == {("ib_link_downed", "link_downed +1"), ("ib_port_errors", "symbol_error 20.0/s"),
                             ("ib_counter_saturated", "excessive_buffer_overrun_errors")}  # discards 10/s: under 100/s
    config = Config()
    config.errors.limits["ib_symbol_error_per_s"] = 50
    assert not [f for f in ib_findings(report, config) if f.measured.startswith("symbol_error")]
    unknown = report_with(ib={"symbol_error": None}, samples=[before])
    assert ib_findings(unknown, Config()) == [] and "ib/mlx5_0/1/symbol_error" not in counter_sample(unknown)


def test_two_real_runs_judge_what_moved_between_them(tmp_path, monkeypatch):
    """The real reader (LiveHost on a /sys tree: gpud's mlx5_0 port and a GPU behind a switch port with AER),
    twice, with the real state file: the first run's rates are unknown; between the runs the clock moves
    60 s, symbol_error +1200 and the bridge's correctable AER +40; the second run names both."""
    from nodecheck.host.live import LiveHost
    from nodecheck.pipeline import build_report

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    root = tmp_path / "root"
    sys_ = root / "sys"
    port = hca_below_switch_port(root, need(GPUD / "mlx5_0/ports/1"))

    first = build_report(LiveHost(root))
    assert "ib_port_errors" in unmade_checks(first) and not [f for f in first.findings if f.kind == "ib_port_errors"]
    kept = json.loads((tmp_path / "state/state.json").read_text())["samples"]
    assert kept[-1]["counters"]["ib/mlx5_0/1/symbol_error"] == int((port / "counters/symbol_error").read_text())

    (root / "proc/uptime").write_text("1060.00 2.00\n")
    symbol = port / "counters/symbol_error"
    symbol.write_text(f"{int(symbol.read_text()) + 1200}\n")
    (sys_ / "devices/pci0000:00/0000:16:00.0/aer_dev_correctable").write_text("RxErr 40\nTOTAL_ERR_COR 40\n")
    second = build_report(LiveHost(root))
    found = {(f.kind, f.subject, f.measured) for f in second.findings}
    assert ("ib_port_errors", "mlx5_0/1", "symbol_error 20.0/s") in found
    assert ("pcie_link_errors", "pci:0000:16:00.0", "AER correctable 40/min") in found
    (root / "proc/sys/kernel/random/boot_id").write_text("3c0ffee0-0000-4000-8000-000000000002\n")  # a reboot
    (root / "proc/uptime").write_text("70.00 2.00\n")
    rebooted = build_report(LiveHost(root))
    assert not [f for f in rebooted.findings if f.kind in ("ib_port_errors", "pcie_link_errors")]
    assert "ib_port_errors" in unmade_checks(rebooted)


@pytest.mark.parametrize("content", ["RxErr 18446744073709551616\nTOTAL_ERR_COR 99999999999999999999999\n", "\x00" * 100, "TOTAL_ERR_COR -1\n"])
def test_hostile_aer_text_is_unknown_not_a_number(content):
    assert parse_aer_file(content) == (None, {})


def test_inspect_says_what_the_counters_cover_and_their_sample():
    from nodecheck.render.kernel_log import counter_lines

    before = CounterSample(940.0, {"aer/0000:16:00.0/correctable": 100, "ib/mlx5_0/1/symbol_error": 0})
    assert counter_lines(report_with({"correctable": 100}, ib={"symbol_error": 0}, samples=[before])) == [
        "Error counters: 2 PCIe devices with AER, 1 InfiniBand ports; rates over the last 60 s"]
    assert counter_lines(report_with({"correctable": 100})) == [
        "Error counters: 2 PCIe devices with AER; " + FIRST_SAMPLE]


def test_an_active_port_whose_counters_are_unreadable_is_unknown_beside_ports_that_read():
    """Two ACTIVE ports, one read and one answering "N/A (no PMA)" for each counter (as node_exporter's i40iw0 does),
    with a previous sample of the first: the InfiniBand family read as judged, and the second port passed unread."""
    read = IbPort("mlx5_0", 1, "ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand", {"link_downed": 0, "symbol_error": 0})
    unread = IbPort("mlx5_1", 1, "ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand", {"link_downed": None, "symbol_error": None})
    nics = [make_nic("ibp12s0", kind="infiniband", rdma_device="mlx5_0", ib_ports=[read]),
            make_nic("ibp13s0", kind="infiniband", rdma_device="mlx5_1", ib_ports=[unread])]
    before = CounterSample(940.0, {"ib/mlx5_0/1/link_downed": 0, "ib/mlx5_0/1/symbol_error": 0})
    report = make_report(nics=nics, history=History("boot", [], [before], 1000.0))
    unmade = unmade_checks(report)
    assert unmade["ib_port_errors"] == unmade["ib_link_downed"] == (
        "mlx5_1/1: its error counters are unreadable (no count in counters/ or hw_counters/)")
    down = IbPort("mlx5_1", 1, "DOWN", "Disabled", None, "InfiniBand", {"link_downed": None})  # nic_down says a down port
    report.nics[1].ib_ports = [down]
    assert "ib_port_errors" not in unmade_checks(report)


def test_paths_without_any_aer_file_leave_the_aer_checks_unknown():
    """A VM's virtual bridges, or a kernel booted with pci=noaer: sysfs lists the paths and no aer_dev_* file on any
    of them. Nothing was read, so the fatal-AER and AER-rate checks are unknown, never healthy."""
    gpu = make_gpu(3, pci_bus_id="00000000:9B:00.0")
    hops = {"0000:9b:00.0": [Hop("0000:9b:00.0", 16, 16, None, None, None), Hop("0000:16:00.0", 16, 16, None, None, None)]}
    unmade = unmade_checks(make_report(gpus=[gpu], pcie_paths=hops))
    assert unmade["pcie_aer_fatal"].startswith("no device on the GPUs' and NICs' PCIe paths has AER counters")
    hops["0000:9b:00.0"][1].aer = {"correctable": 0, "nonfatal": 0, "fatal": 0}  # one device with AER: judged
    assert "pcie_aer_fatal" not in unmade_checks(make_report(gpus=[gpu], pcie_paths=hops))


def test_a_port_whose_firmware_refuses_its_counters_is_asked_once_an_hour(tmp_path, monkeypatch):
    """An HGX B200's Fabric Manager-managed ConnectX-7 ports ("limited PFs"): every counter read fails in firmware
    with EINVAL and logs an mlx5 ACCESS_REG error to the kernel log (node_exporter#3434, gpud#1164), so reading each
    of a port's eleven counters every round flooded the log. gpud's real H100 NDR tree, mlx5_1 refusing as such a port
    does (the kernel's EINVAL, stood in for: no such card here): one read reaches it in the first round, none in the
    next within the hour, and the other ports read as before."""
    import errno
    import shutil
    import time

    from nodecheck.host import files
    from nodecheck.host.live import LiveHost

    shutil.copytree(need(GPUD), tmp_path / "sys/class/infiniband", symlinks=True)
    real, asked = files.read_regular, []

    def firmware(path, limit):
        if "/mlx5_1/ports/1/" in str(path):
            asked.append(str(path))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, limit)

    monkeypatch.setattr(files, "read_regular", firmware)
    host = LiveHost(tmp_path)
    first = read_port_counters(host, "/sys/class/infiniband/mlx5_1/ports/1")
    assert len(asked) == 1 and set(first.values()) == {None}  # unknown, and the port asked once
    other = {n: parse_counter(t) for n, t in read_port_counters(host, "/sys/class/infiniband/mlx5_0/ports/1").items()}
    assert other["link_downed"] is not None and other["symbol_error"] is not None
    read_port_counters(host, "/sys/class/infiniband/mlx5_1/ports/1")
    assert len(asked) == 1
    later = time.monotonic() + files.REFUSED_RETRY_S + 1
    monkeypatch.setattr(files.time, "monotonic", lambda: later)
    read_port_counters(host, "/sys/class/infiniband/mlx5_1/ports/1")
    assert len(asked) == 2  # an hour on, asked again: a card whose firmware lets go is read again
