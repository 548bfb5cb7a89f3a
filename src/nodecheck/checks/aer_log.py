"""Uncorrectable PCIe errors a pasted kernel log holds (probes/kernel_aer.py), judged for `nodecheck kernel-log`, where
no sysfs counter stands beside the log (a live node's AER counters are judged by error_counters, under the same
kinds). A fatal error is an error where the log ties it to what nodecheck judges, a GPU or a ConnectX NIC (the device's
driver is theirs, or one of theirs logged it could not recover); elsewhere on the node it is a warning. A GPU that
could not recover stays lost: NVIDIA's driver has no AER callbacks, so the kernel cannot bring it back (its words:
"can't recover (no error_detected callback)"). Pure: reads the events only."""

from __future__ import annotations

from nodecheck.core.units import first_of
from nodecheck.probes.kernel_aer import AER_FATAL, AER_NO_RECOVERY, JUDGED_DRIVERS, driver_of, unrecovered
from nodecheck.report.events import XidEvent
from nodecheck.report.findings import Finding

NEAR = 20  # lines between a link's fatal error and a device's "can't recover" that the kernel's recovery prints for it


def aer_log_findings(events: list[XidEvent]) -> list[Finding]:
    aer = [e for e in events if e.kind == "aer"]
    lost_here = [e for e in aer if unrecovered(e)]
    by_device: dict[str, list[XidEvent]] = {}
    for event in aer:
        if event.code != AER_NO_RECOVERY:
            by_device.setdefault(event.pci, []).append(event)
    findings, explained = [], set()
    for pci, logged in by_device.items():
        fatal, last = [e for e in logged if e.code == AER_FATAL], logged[-1]
        what = last.message.split(": ", 1)[-1]
        if fatal:
            # the GPUs and NICs the kernel's recovery of this error reached: their lines near its own
            lost = list(dict.fromkeys(e.pci for e in lost_here if any(abs(e.line - f.line) <= NEAR for f in fatal)))
            explained.update(lost)
            gone = (f"; {first_of([f'pci:{p}' for p in lost], 4)} could not recover (its driver has no AER recovery): "
                    "lost until the node is reset") if lost else ""
            tied = driver_of(last) in JUDGED_DRIVERS or bool(lost)
            findings.append(Finding("pcie_aer_fatal", "error" if tied else "warning", f"pci:{pci}",
                                    f"AER fatal x{len(fatal)} (kernel log)", "none",
                                    f"pci:{pci} ({driver_of(last)}) logged {len(fatal)} uncorrectable fatal PCIe error(s) "
                                    f"in this log, last: {what}: the link or the device failed{gone}; reseat or replace "
                                    "it" + ("" if tied else " (the log ties it to no GPU or ConnectX NIC)")))
        else:
            findings.append(Finding("pcie_link_errors", "warning", f"pci:{pci}", f"AER nonfatal x{len(logged)} (kernel log)",
                                    "none", f"pci:{pci} ({driver_of(last)}) logged {len(logged)} uncorrectable non-fatal "
                                    f"PCIe error(s) in this log, last: {what}: errors the link recovered from; check the "
                                    "card's seating and the riser"))
    # a GPU or NIC whose recovery failed far from any fatal line the log holds (a paste cut before the port's lines)
    alone = [pci for pci in dict.fromkeys(e.pci for e in lost_here) if pci not in explained]
    findings += [Finding("pcie_aer_fatal", "error", f"pci:{pci}", "no AER recovery (kernel log)", "none",
                         f"pci:{pci} could not recover from an uncorrectable PCIe error on its link (the kernel's AER "
                         "recovery, which its driver cannot join): lost until the node is reset; reseat or replace it, "
                         "and read the port's lines before these") for pci in alone]
    return findings
