"""A pasted kernel log's uncorrectable PCIe (AER) lines (probes/kernel_aer.py, checks/aer_log.py), on published logs
(tests/fixtures/kernel-log/SOURCES.md): a fatal error on a GPU's root port whose GPU could not recover is an error,
with or without the Xid 79 after it; corrected errors alone are no finding."""

import json
import subprocess
import sys

from helpers import REPO

from nodecheck.checks.aer_log import aer_log_findings
from nodecheck.probes.kernel_aer import AER_FATAL, AER_NO_RECOVERY, parse_aer_events

LOGS = REPO / "tests" / "fixtures" / "kernel-log"
HANG = LOGS / "returnn1500-dmesg-h-aer-fatal-no-recovery.txt"
SURPRISE_DOWN = LOGS / "gpuburn1-aer-surprise-down-then-xid79.txt"
CORRECTED = LOGS / "popos3363-aer-corrected-only.txt"


def kernel_log(path, *args):
    return subprocess.run([sys.executable, "-m", "nodecheck", "kernel-log", str(path), *args], capture_output=True,
                          text=True, timeout=120)


def test_a_hang_whose_gpu_could_not_recover_from_a_fatal_error_is_an_error():
    """rwth-i6/returnn#1500: no Xid line at all; kernel-log read it as a log with nothing wrong."""
    events = parse_aer_events(HANG.read_text())
    assert [(e.pci, e.code) for e in events] == [("0000:03:00.0", AER_NO_RECOVERY), ("0000:03:00.1", AER_NO_RECOVERY),
                                                 ("0000:00:03.0", AER_FATAL), ("0000:03:00.0", AER_NO_RECOVERY),
                                                 ("0000:03:00.1", AER_NO_RECOVERY)]
    assert events[2].message == "pcieport: Uncorrected (Fatal), type=Transaction Layer [SDES] [CmpltTO]"
    (finding,) = aer_log_findings(events)
    assert (finding.kind, finding.severity, finding.subject) == ("pcie_aer_fatal", "error", "pci:0000:00:03.0")
    assert "pci:0000:03:00.0 could not recover" in finding.message and "0000:03:00.1" not in finding.message
    result = kernel_log(HANG)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "0 NVIDIA event(s) since boot, and 5 uncorrectable PCIe (AER) line(s)" in result.stdout


def test_a_surprise_down_before_xid_79_and_an_older_kernels_words():
    """wilicc/gpu-burn#1: "id=0010" and no "AER: " before "PCIe Bus Error" (older kernels); the corrected Replay
    Timer Timeout before it is no event, and its bit is not the fatal error's."""
    events = parse_aer_events(SURPRISE_DOWN.read_text())
    assert [(e.pci, e.code, e.message) for e in events] == [
        ("0000:00:02.0", AER_FATAL, "pcieport: Uncorrected (Fatal), type=Transaction Layer [Surprise Down Error]"),
        ("0000:02:00.0", AER_NO_RECOVERY, "nvidia: device has no AER-aware driver")]
    result = kernel_log(SURPRISE_DOWN, "--json")
    assert result.returncode == 1
    out = json.loads(result.stdout)
    assert [(e["kind"], e["severity"]) for e in out["events"]] == [("aer", "error"), ("aer", "error"), ("xid", "error")]
    assert sorted(f["kind"] for f in out["findings"]) == ["gpu_xid", "pcie_aer_fatal"]


def test_corrected_errors_alone_and_a_fatal_error_tied_to_no_gpu_or_nic():
    """pop-os#3363's corrected Data Link Layer errors: nothing uncorrectable, exit 0. The hang's fatal error without
    the GPU's lines is tied to no GPU or NIC: a warning, not a drain."""
    assert parse_aer_events(CORRECTED.read_text()) == []
    result = kernel_log(CORRECTED)
    assert result.returncode == 0 and "no finding" in result.stdout, result.stdout + result.stderr
    port_only = "\n".join(line for line in HANG.read_text().splitlines() if "pcieport" in line)
    (finding,) = aer_log_findings(parse_aer_events(port_only))
    assert (finding.severity, finding.subject) == ("warning", "pci:0000:00:03.0") and "ties it to no GPU" in finding.message
    gpu_only = "\n".join(line for line in HANG.read_text().splitlines() if " nvidia " in line)
    (finding,) = aer_log_findings(parse_aer_events(gpu_only))
    assert (finding.kind, finding.severity, finding.subject) == ("pcie_aer_fatal", "error", "pci:0000:03:00.0")


def test_a_non_fatal_error_is_a_warning():
    nonfatal = HANG.read_text().replace("severity=Uncorrected (Fatal)", "severity=Uncorrectable (Non-Fatal)")
    nonfatal = "\n".join(line for line in nonfatal.splitlines() if "recover" not in line)
    (finding,) = aer_log_findings(parse_aer_events(nonfatal))
    assert (finding.kind, finding.severity, finding.measured) == ("pcie_link_errors", "warning", "AER nonfatal x1 (kernel log)")


def test_a_lost_gpu_is_named_by_the_fatal_error_its_recovery_followed():
    """Two ports' fatal errors far apart in one log: the GPU whose recovery failed beside the first is that one's; the
    other port, tied to no GPU or NIC by the log, is a warning."""
    hang = HANG.read_text()
    other = "\n".join(line.replace("0000:00:03.0", "0000:00:01.0") for line in hang.splitlines() if "pcieport" in line)
    findings = {f.subject: f for f in aer_log_findings(parse_aer_events(hang + "\n" * 40 + other))}
    assert (findings["pci:0000:00:03.0"].severity, findings["pci:0000:00:01.0"].severity) == ("error", "warning")
    assert "0000:03:00.0 could not recover" in findings["pci:0000:00:03.0"].message
    assert "could not recover" not in findings["pci:0000:00:01.0"].message
