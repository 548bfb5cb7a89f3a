"""The kernel log as nodecheck judges it: what the log holds now, plus the NVIDIA events that earlier runs of this
boot read in it (the state file's LogMemory). The kernel's ring buffer is small (256 KiB on most distributions),
so on a busy node an Xid from this morning is overwritten by the afternoon; read only from the log, a node
that logged a drain-now Xid would pass once the line scrolled away. Remembered, it fails until it is
cleared (`nodecheck clear`) or the node reboots. Also the names events are told by: a NIC event's, the NIC a PCI
address is, the recovery action an Xid 154 asks."""

from __future__ import annotations

import re
from dataclasses import replace

from nodecheck.core.pci import normal_pci
from nodecheck.probes.kernel_log import NIC_MODULE_ERROR, NIC_SLOT_POWER
from nodecheck.report.events import History, KernelLog, LogMemory, XidEvent, unseen
from nodecheck.report.model import Report


def with_memory(log: KernelLog | None, history: History | None) -> KernelLog | None:
    """The log with the remembered events it no longer holds, in time order, and from when it is complete:
    from boot when the log is, or when the remembered stretch reaches back to boot and joins the log without
    a gap; else from the later of the two starts."""
    memory = history.kernel_log if history is not None else None
    if log is None or not log.known or memory is None:
        return log  # an unreadable log stays unknown: its checks are not made, remembered events or not
    lost = [replace(e, remembered=True) for e in unseen(memory.events, log.events)]
    lost_before = log.lost_before_usec
    if lost_before is not None and memory.upto_usec is not None and memory.upto_usec >= lost_before:
        lost_before = memory.from_usec  # the runs before this one read what the ring buffer has lost since
    if not lost:
        return replace(log, lost_before_usec=lost_before)
    timed = sorted(lost + [e for e in log.events if e.usec is not None], key=lambda e: e.usec)
    return replace(log, events=timed + [e for e in log.events if e.usec is None], lost_before_usec=lost_before)


def to_remember(log: KernelLog | None) -> LogMemory | None:
    """What this run read in the kernel log, for the runs after it: None when it read none."""
    if log is None or not log.known:
        return None
    return LogMemory([e for e in log.events if e.usec is not None], log.lost_before_usec, log.uptime_usec)


NIC_EVENT_NAMES = {NIC_MODULE_ERROR: "port module error", NIC_SLOT_POWER: "PCIe slot short of power"}


def nic_names(report: Report) -> dict[str | None, str]:
    """PCI address -> the netdev that names it: a physical netdev over a child interface sharing its address."""
    return {normal_pci(n.pci_address): n.name for n in sorted(report.nics, key=lambda n: not n.virtual) if n.pci_address}


RECOVERY_XID = 154  # "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
_RECOVERY_TO = re.compile(r"changed from 0x[0-9a-fA-F]{1,8} \([^)]{0,60}\) to 0x([0-9a-fA-F]{1,8}) \(([^)]{1,60})\)")


def recovery_asked(event: XidEvent) -> tuple[int, str] | None:
    """(action, the driver's words for it) an Xid 154 line changes to; None for another event or words not read."""
    match = _RECOVERY_TO.search(event.message) if event.kind == "xid" and event.code == RECOVERY_XID else None
    return (int(match[1], 16), match[2]) if match else None
