"""Blackwell's NVLink 5 Xids (144-150) are judged by the severity the driver writes into each line, and an NVLink or
C2C Xid joins only the paths its traffic takes (src/nodecheck/core/xid_catalog.py, src/nodecheck/checks/signals.py, src/nodecheck/verdicts/signal_join.py).

Every one of 144-150 drained the node now, whatever the line said: a GB200 whose driver logged a corrected
("Nonfatal") RLW_RXPIPE event on one of its 18 links was taken out of service. The lines below are real GB200 lines
that gpud's parser is tested on (leptonai/gpud @4a8de33a3f components/accelerator/nvidia/xid/kmsg_extended_test.go,
"From user requirements"; the address changed to gpu3's so NVML names it), and lines of the catalog's format from
its nvlink_logs_test.go."""

import json

from helpers import cli, make_gpu, make_measurement, make_report

from nodecheck.checks.signals import gpu_xids
from nodecheck.config import Config
from nodecheck.core.xid_catalog import xid_entry
from nodecheck.probes.kernel_log import parse_kernel_log
from nodecheck.render.kernel_log import event_record, kernel_log_lines
from nodecheck.report.events import History, KernelLog
from nodecheck.verdicts.bandwidth import with_measurements

GPU3 = "00000000:9B:00.0"
NONFATAL = ("NVRM: Xid (PCI:0000:9b:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 "
            "(0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)")
FATAL_NO_LINK = ("NVRM: Xid (PCI:0000:9b:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 "
                 "0x00000000 0x00000000 0x00000000)")
FATAL_LINK = ("NVRM: Xid (PCI:0000:9b:00): 149, NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 08 (0x01000011 "
              "0x00000000 0x00000000 0x00000000)")
BER_NONFATAL = ("NVRM: Xid (PCI:0000:9b:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 05 (0x00000013 0x00000001 "
                "0x00000000 0x00000000)")
UNSAID = "NVRM: Xid (PCI:0000:9b:00): 149, an NVLink error in a form this parser does not read"


def stamped(lines: list[str], start: float = 100.0) -> list[str]:
    return [f"[{start + n:12.6f}] {line}" for n, line in enumerate(lines)]


def xid_findings(lines: list[str], measurements=(), uptime_s: float = 400.0):
    log = KernelLog(True, None, "/dev/kmsg", parse_kernel_log("\n".join(stamped(lines)) + "\n"), int(uptime_s * 1e6))
    report = make_report(gpus=[make_gpu(3, pci_bus_id=GPU3)], kernel_log=log, history=History("boot", []))
    report.findings = gpu_xids(report, Config())
    return report, {f.kind: f for f in with_measurements(report, list(measurements), 0.0, Config()).findings}


def test_the_parser_reads_the_drivers_severity_and_the_link_of_each_nvlink5_line():
    events = parse_kernel_log("\n".join(stamped([NONFATAL, FATAL_NO_LINK, FATAL_LINK, UNSAID])))
    assert [(e.code, e.driver_word, e.link) for e in events] == [
        (145, "non-fatal", 13), (149, "fatal", None), (149, "fatal", 8), (149, None, None)]
    assert events[0].pci == "0000:9b:00.0" and events[0].message.startswith("pid=876767, name=ray::WorkerDict, RLW_RXPIPE")


def test_a_process_name_cannot_pass_for_the_drivers_word():
    """The word is read where the driver writes it, after the unit: a process named to look like it (the kernel keeps
    15 characters of a name) does not make a fatal line non-fatal."""
    forged = FATAL_LINK.replace("149, NETIR_LINK_EVT", "149, pid=1, name=Nonfatal XC0 i0, NETIR_LINK_EVT")
    (event,) = parse_kernel_log(forged)
    assert (event.driver_word, event.link) == ("fatal", 8)
    assert xid_entry(149).action_of(event.driver_word) == "drain"


def test_a_nonfatal_nvlink5_event_is_watched_not_a_drain():
    _, findings = xid_findings([NONFATAL])
    finding = findings["gpu_xid"]
    assert (finding.severity, finding.expected) == ("warning", "< 5 in 3600 s")
    assert "the driver's line: 0 of 1 fatal, link 13, last: pid=876767" in finding.message and "watched" in finding.message


def test_a_fatal_nvlink5_event_drains_now_and_names_its_links():
    report, _ = xid_findings([NONFATAL, BER_NONFATAL, FATAL_LINK])
    xids = {f.measured: f for f in report.findings if f.kind == "gpu_xid"}  # one finding per code: 145 and 149
    assert [(f.severity, f.expected) for f in xids.values()] == [("warning", "< 5 in 3600 s"), ("error", "no Xid")]
    finding = xids["Xid 149 NVLINK: NETIR Error"]
    assert "1 of 2 fatal, links 5, 8" in finding.message and "drain now" in finding.message


def test_a_line_that_does_not_say_drains_as_the_catalog_row_does():
    _, findings = xid_findings([UNSAID])
    assert (findings["gpu_xid"].severity, findings["gpu_xid"].expected) == ("error", "no Xid")
    assert "(1 without it)" in findings["gpu_xid"].message


def test_nonfatal_events_that_repeat_become_an_error():
    _, findings = xid_findings([BER_NONFATAL] * 5)
    finding = findings["gpu_xid"]
    assert (finding.severity, finding.expected) == ("error", "< 5 in 3600 s") and "repeated" in finding.message


def test_an_nvlink_xid_is_named_on_the_gpus_nvlink_paths_not_its_host_link():
    """gpu3 logged a fatal NVLink 5 Xid: a slow pair with gpu3 names it; gpu3's slow host copy does not (its traffic
    never crosses an NVLink); the drain is not tempered by a host copy that passed."""
    pair = make_measurement("gpu3<->gpu5", "p2p", rate=0.3 * 900e9, spec=900e9, direction="unidirectional",
                            details={"path_kind": "nvlink"})
    host = make_measurement("gpu3:host", "h2d", rate=0.41 * 50e9, spec=50e9, direction="unidirectional",
                            details={"path_kind": "pcie"})
    assert findings_of(pair)["bandwidth_below_spec"].message.endswith(
        "; error signals on this path: gpu3 Xid 149 NVLINK: NETIR Error")
    assert "error signals" not in findings_of(host)["bandwidth_below_spec"].message
    assert findings_of(host)["gpu_xid"].severity == "error"


def findings_of(measurement):
    return xid_findings([FATAL_LINK], [measurement])[1]


def test_a_c2c_xid_joins_the_host_copies_only():
    """Xid 121 (corrected C2C errors) is watched; repeated, an error that a passing host copy over C2C tempers to a
    warning, and that a slow one names; a GPU pair's verdict does not carry it."""
    c2c = "NVRM: Xid (PCI:0000:9b:00): 121, C2C link corrected error"
    assert xid_findings([c2c])[1]["gpu_xid"].severity == "warning"
    fine = make_measurement("gpu3:host", "h2d", rate=0.9 * 447e9, spec=447e9, direction="unidirectional",
                            details={"path_kind": "c2c"})
    slow = make_measurement("gpu3:host", "h2d", rate=0.3 * 447e9, spec=447e9, direction="unidirectional",
                            details={"path_kind": "c2c"})
    pair = make_measurement("gpu3<->gpu5", "p2p", rate=0.3 * 900e9, spec=900e9, direction="unidirectional",
                            details={"path_kind": "nvlink"})
    assert xid_findings([c2c] * 5)[1]["gpu_xid"].severity == "error"
    assert xid_findings([c2c] * 5, [fine])[1]["gpu_xid"].severity == "warning"
    assert xid_findings([c2c] * 5, [slow])[1]["bandwidth_below_spec"].message.endswith(
        "; error signals on this path: gpu3 Xid 121 C2C Error")
    assert "error signals" not in xid_findings([c2c] * 5, [pair])[1]["bandwidth_below_spec"].message
    assert xid_findings([c2c] * 5, [pair])[1]["gpu_xid"].severity == "error"  # not its path: nothing tempers it


def test_kernel_log_says_each_event_by_the_drivers_word(tmp_path):
    """`kernel-log --json`: the nonfatal line a warning, the fatal one an error; inspect's line per code says drain
    when one of its events drains."""
    log = tmp_path / "kern.log"
    log.write_text("\n".join(stamped([NONFATAL, BER_NONFATAL, FATAL_LINK])) + "\n")
    result = cli("kernel-log", str(log), "--json")
    records = json.loads(result.stdout)["events"]
    assert [(r["xid"], r["severity"], r["link"]) for r in records] == [(145, "warning", 13), (149, "warning", 5),
                                                                       (149, "error", 8)]
    events = parse_kernel_log(log.read_text())
    assert [event_record(e)["severity"] for e in events] == ["warning", "warning", "error"]
    lines = kernel_log_lines(make_report(gpus=[make_gpu(3, pci_bus_id=GPU3)]), KernelLog(True, None, "dmesg", events))
    assert lines[1:] == ["  gpu3 (0000:9b:00.0): Xid 145 NVLINK: RLW Error x1 (watch)",
                         "  gpu3 (0000:9b:00.0): Xid 149 NVLINK: NETIR Error x2 (drain)"]
