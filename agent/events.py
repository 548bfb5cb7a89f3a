"""Error events a node logged, as the Report carries them: the NVIDIA Xid and SXid events of the kernel log
(probes/kernel_log.py) and whether that log could be read at all."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class XidEvent:
    """One `NVRM: Xid` / `SXid` line of the kernel log (or the driver's "fallen off the bus" message)."""

    kind: str  # "xid" (a GPU, NVRM) or "sxid" (an NVSwitch)
    pci: str | None  # the device's address as sysfs writes it, function 0 ("0000:9b:00.0")
    code: int  # the Xid or SXid number
    message: str  # the message after the code, cut at 200 characters
    line: int  # its line in the log, from 1
    usec: int | None = None  # microseconds since boot (a /dev/kmsg record's, a monotonic dmesg line's); None: --ctime
    caused_by: int | None = None  # "caused by previous Xid N": a sympathetic event, N's fault
    switch: int | None = None  # nvidia-nvswitchN
    implied: bool = False  # "fallen off the bus" without an Xid line: counted as Xid 79


@dataclass
class KernelLog:
    """The kernel log since boot, as `dmesg` (which reads /dev/kmsg) or `journalctl -k -b` gave it."""

    known: bool  # a source answered; False: nodecheck cannot say whether the GPUs logged errors
    why: str | None = None  # why it is unknown (dmesg restricted to root, no journal access ...)
    source: str | None = None  # the command that answered
    events: list[XidEvent] = field(default_factory=list)
