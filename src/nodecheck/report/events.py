"""Error events a node logged, as the Report carries them: the NVIDIA Xid and SXid events of the kernel log
(src/nodecheck/probes/kernel_log.py) and whether that log could be read at all."""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass, field

from nodecheck.core.typed_json import ESSENTIAL

# the rest of a Blackwell NVLink 5 Xid line (144-150) after "Xid (PCI:...): 149,": the unit, the driver's severity,
# the containment, injection and link ("NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 08 (0x...)"), as gpud
# reads it (components/accelerator/nvidia/xid/kmsg.go RegexNVRMXidExtended); anchored: a process name (at most 15
# characters in the kernel) cannot pass for the severity
NVLINK5_XID = re.compile(r"\s{0,4}(?:pid=\d{1,10}, name=[^,]{0,80}, )?[A-Z0-9_]{1,40}(?:/[A-Z0-9_]{1,40})? (Fatal|Nonfatal) "
                         r"XC[01] i\d{1,3} Link (-?\d{1,4})\b")


@dataclass
class XidEvent:
    """One `NVRM: Xid` / `SXid` line of the kernel log (or the driver's "fallen off the bus" message)."""

    kind: str = field(metadata=ESSENTIAL)  # "xid" (a GPU, NVRM), "sxid" (an NVSwitch) or "nic" (a ConnectX NIC, mlx5)
    pci: str | None  # the device's address as sysfs writes it, function 0 ("0000:9b:00.0")
    code: int = field(metadata=ESSENTIAL)  # the Xid or SXid number; a NIC's: 1 module error, 2 slot power (kernel_log)
    message: str  # the message after the code, cut at 200 characters
    line: int  # its line in the log, from 1
    usec: int | None = None  # microseconds since boot (a /dev/kmsg record's, a monotonic dmesg line's); None: --ctime
    caused_by: int | None = None  # "caused by previous Xid N": a sympathetic event, N's fault
    switch: int | None = None  # nvidia-nvswitchN
    implied: bool = False  # "fallen off the bus" without an Xid line: counted as Xid 79
    printed: str | None = None  # the address as the line prints it ("0000:9b:00", "00000000:3B:00.0")
    link: int | None = None  # the port an SXid's first line names ("Fatal, Link 30 LTSSM Fault Up"), an NVLink 5 Xid's link
    remembered: bool = False  # read by an earlier run of this boot: the log no longer holds it (src/nodecheck/assemble/open_events.py)
    instance: str | None = None  # a MIG GPU's instance the driver attributes an Xid to, as printed ("GPU-I:05 GPU-CI:02")

    @property
    def driver_word(self) -> str | None:
        """How the driver called the event: "fatal", "non-fatal", or None where its line does not say. An SXid says
        it first ("Fatal, Link 30 ..."), an NVLink 5 Xid after its unit ("NETIR_LINK_EVT Nonfatal XC0 ...")."""
        if self.kind == "xid":
            said = NVLINK5_XID.match(self.message)
            return {"Fatal": "fatal", "Nonfatal": "non-fatal"}[said[1]] if said else None
        word = self.message.split(",", 1)[0].strip().lower()
        return word if word in ("fatal", "non-fatal") else None


@dataclass
class KernelLog:
    """The kernel log since boot, as /dev/kmsg, `journalctl -k -b` or `dmesg` gave it."""

    known: bool  # a source answered; False: nodecheck cannot say whether the GPUs logged errors
    why: str | None = None  # why it is unknown ("needs CAP_SYSLOG", no journal access ...)
    source: str | None = None  # what answered: /dev/kmsg, journalctl, dmesg
    events: list[XidEvent] = field(default_factory=list)
    uptime_usec: int | None = None  # /proc/uptime when it was read: the look-back and repeat window count from it
    # Events before this time since boot (microseconds) may be missing: the kernel's ring buffer overwrote them
    # and neither the journal nor nodecheck's memory of this boot (History.kernel_log) holds them. None: from boot.
    lost_before_usec: int | None = None


@dataclass
class Acknowledgement:
    """An operator's `nodecheck clear KIND [--gpu N]`: the events of that kind on that subject up to the last
    one seen then are known and dealt with; a later one fails the node again. Kept in the state file, for
    this boot only."""

    kind: str = field(metadata=ESSENTIAL)  # the finding kind cleared (gpu_xid, ...)
    subject: str | None  # gpu3, pci:0000:9b:00.0; None: every subject of that kind
    upto_usec: int | None  # the last cleared event's time since boot
    count: int  # how many events it cleared (the measure for a log without time stamps)
    by: str  # who cleared it (the user, SUDO_USER when through sudo)
    at: float  # when (Unix time)


@dataclass
class CounterSample:
    """The error counters of one run (src/nodecheck/checks/error_counters.py counter_sample): key -> count, and when."""

    uptime_s: float  # /proc/uptime when they were read
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class LogMemory:
    """The NVIDIA events that nodecheck's runs of this boot read in the kernel log (time-stamped ones), kept in
    the state file so that one the kernel's ring buffer has overwritten since is still judged
    (src/nodecheck/assemble/open_events.py), and the stretch of the log those runs read without a gap."""

    events: list[XidEvent] = field(default_factory=list)  # oldest first
    from_usec: int | None = None  # the stretch's start, microseconds since boot; None: from boot
    upto_usec: int | None = None  # its end: /proc/uptime when the last run read the log; None: unknown


@dataclass
class History:
    """What nodecheck remembers between its runs on this boot (the state file, src/nodecheck/host/state.py): the
    operators' acknowledgements and the last counter samples, from which rates are taken. None in a Report
    made without it (a snapshot from before nodecheck kept state)."""

    boot_id: str | None
    acknowledgements: list[Acknowledgement] = field(default_factory=list)
    samples: list[CounterSample] = field(default_factory=list)  # oldest first
    uptime_s: float | None = None  # /proc/uptime now: the rates end here
    kernel_log: LogMemory | None = None  # what earlier runs of this boot read in the kernel log


REMEMBERED_EVENTS = 500  # the newest a state file keeps (its acknowledgements must stay within its 1 MiB)
REMEMBERED_PER_CODE = 64  # the newest per device and code: a repeat window's count past it reads as 64
REMEMBERED_MESSAGE = 120  # characters of each remembered event's message
# One event read from /dev/kmsg and from the journal can differ in time: `journalctl -o short-monotonic` shows
# the kernel's stamp, but systemd 256.1 and later shift it by seconds (systemd issue 34250: 7.6 s at boot).
SAME_EVENT_USEC = 30_000_000


def unseen(older: list[XidEvent], newer: list[XidEvent]) -> list[XidEvent]:
    """older's time-stamped events that newer does not hold, oldest first. Each of newer's events stands for at
    most one of older's: the same device, code and message, at most SAME_EVENT_USEC apart. So a burst of one
    Xid read by two runs counts as often as the run that read more of it, never as their sum."""
    pool: dict[tuple, list[int]] = {}
    for event in newer:
        if event.usec is not None:
            pool.setdefault(_identity(event), []).append(event.usec)
    for stamps in pool.values():
        stamps.sort()
    out = []
    for event in sorted((e for e in older if e.usec is not None), key=lambda e: e.usec):
        stamps = pool.get(_identity(event), [])
        at = bisect.bisect_left(stamps, event.usec - SAME_EVENT_USEC)
        if at < len(stamps) and stamps[at] <= event.usec + SAME_EVENT_USEC:
            del stamps[at]
        else:
            out.append(event)
    return out


def _identity(event: XidEvent) -> tuple:
    return (event.kind, event.pci, event.switch, event.code, event.message[:REMEMBERED_MESSAGE])


def union_events(older: list[XidEvent], newer: list[XidEvent]) -> list[XidEvent]:
    """The time-stamped events of both, each once (see unseen), oldest first, bounded as a state file keeps
    them: the newest REMEMBERED_PER_CODE per device and code, REMEMBERED_EVENTS in all."""
    both = unseen(older, newer) + [e for e in newer if e.usec is not None]
    kept, per_code = [], Counter()
    for event in sorted(both, key=lambda e: e.usec, reverse=True):
        code = (event.kind, event.pci, event.switch, event.code)
        per_code[code] += 1
        if per_code[code] <= REMEMBERED_PER_CODE:
            kept.append(event)
    return kept[:REMEMBERED_EVENTS][::-1]
