"""NVIDIA error events in the kernel log: `NVRM: Xid (PCI:dddd:bb:dd): N, ...` lines, NVSwitch `SXid` lines,
"fallen off the bus" without an Xid line (the driver's multi-line or single-line message: an Xid 79 by
NVIDIA's catalog, as gpud and NVSentinel count it), and a ConnectX (mlx5) NIC's own events: a port module
(cable or transceiver) error and its PCIe slot short of power. Reads what people and tools hand over: raw /dev/kmsg
records (`prio,seq,usec,-;msg`), `dmesg` with or without `--ctime`, `journalctl -k` lines. Every pattern is
linear (anchored or literal-led), so a hostile megabyte line is read, not stuck on.

Read from /dev/kmsg (root, or CAP_SYSLOG where kernel.dmesg_restrict is 1), else `journalctl -k -b` (the
journal: root or the systemd-journal group), else `dmesg`; when none answers the log is a named unknown,
never "no errors". The kernel's ring buffer overwrites its oldest records: when /dev/kmsg no longer reaches
back to boot the journal is read too, and the log says from when it is whole (src/nodecheck/assemble/open_events.py adds what
earlier runs of this boot read). src/nodecheck/checks/signals.py judges the events.
"""

from __future__ import annotations

import re
from collections import deque

from nodecheck.core.errors import NoData, NotRecorded, ParseError, ProbeFailed, TimedOut
from nodecheck.core.limits import MAX_COMMAND_OUTPUT
from nodecheck.core.pci import normal_pci
from nodecheck.probes.base import Probe
from nodecheck.probes.kernel_lines import NIC_MESSAGE, kernel_message
from nodecheck.report.events import NVLINK5_XID, KernelLog, XidEvent

KMSG = "/dev/kmsg"
# after /dev/kmsg, (the file a snapshot records it in, the command), tried in order
COMMANDS = (("journalctl-k.txt", ["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic", "--lines", "200000"]),
            ("dmesg.txt", ["dmesg"]))

MAX_EVENTS = 10_000  # the newest kept: a log that repeats one Xid forever costs bounded memory
_KMSG_SEQ = re.compile(r"^\d{1,3},(\d{1,20}),(\d{1,20}),")
_ADDRESS = r"([0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2})"  # the driver drops the function: 0000:9b:00
# on a MIG GPU the driver names the GPU instance, and the compute instance, it attributes the Xid to (open-gpu-kernel-modules
# src/nvidia/src/kernel/gpu/rc/kernel_rc.c: "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=..."; NVIDIA's
# A100 memory error management guide: "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: ...")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?" + _ADDRESS + r"(?:\.[0-7])?(?: (?P<instance>GPU-I:\d{1,3}(?: GPU-CI:\d{1,3})?))?\): "
                  r"(?P<code>\d{1,6}),")
_SXID = re.compile(r"nvidia-nvswitch(\d{1,4}): SXid \(PCI:" + _ADDRESS + r"(?:\.[0-7])?\): (\d{1,6}),")
_OFF_BUS_ONE_LINE = re.compile(r"NVRM: GPU " + _ADDRESS + r"\.[0-7]: GPU has fallen off the bus")
# older drivers' one line: "NVRM: GPU at 0000:01:00.0 has fallen off the bus." (also "GPU at PCI:0000:01:00")
_OFF_BUS_OLD = re.compile(r"NVRM: GPU at (?:PCI:)?" + _ADDRESS + r"(?:\.[0-7])?:? has fallen off the bus")
_OFF_BUS_FIRST = re.compile(r"NVRM: The NVIDIA GPU " + _ADDRESS + r"\.[0-7]")
_CAUSED_BY = re.compile(r"caused by previous Xid (\d{1,6})")
_SXID_LINK = re.compile(r"\s{0,4}(?:Fatal|Non-fatal), Link (\d{1,4})\b")
_SXID_MORE = re.compile(r"\s{0,4}(?:Severity \d|Data \{)")  # the driver's 2nd and 3rd lines of one SXid event
SXID_LINES_WITHIN = 8  # the lines of one SXid event lie this close (other switches' lines between them)
OFF_BUS_WITHIN = 5  # lines between "The NVIDIA GPU ..." and "... fallen off the bus" of one message
# MULTI_LINE: the driver prints some messages as one record of several lines (the fallen-off-the-bus one is one
# nv_printf of three "NVRM: " lines, open-gpu-kernel-modules rm_is_supported_device); dmesg and journalctl print the
# record's further lines unstamped, indented to the message's column (NVIDIA/NVSentinel#155, dmesg of driver
# 570.158.01). An indented line right after an NVRM line is read as that message's next line, with its stamp.
XID_FALLEN_OFF_THE_BUS = 79
# a ConnectX NIC's events, as mlx5_core prints them after the device's address (drivers/net/ethernet/mellanox/mlx5/
# core/events.c; gpud's infiniband kmsg matcher reads the same): "mlx5_core 0000:5c:00.0: port_module:254:(pid 0): Port
# module event[error]: module 0, Cable error, High Temperature", "... mlx5_pcie_event:299:(pid 268269): Detected
# insufficient power on the PCIe slot (27W)."
_MLX5 = re.compile(r"mlx5_core ([0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}\.[0-7]): ")
_MODULE_ERROR = re.compile(r"Port module event\[error\]: module (\d{1,3}), [^,]{0,40}, ([^\r\n]{1,80})")
_SLOT_POWER = re.compile(r"Detected insufficient power on the PCIe slot \((\d{1,4})W\)")
NIC_MODULE_ERROR, NIC_SLOT_POWER = 1, 2  # a "nic" event's code: which of the two the NIC logged


def _device(address: str) -> str | None:
    return normal_pci(f"{address}.0")


def parse_kernel_log(text: str) -> list[XidEvent]:
    """Every Xid and SXid event in a kernel log, in order; [] when it holds none. An event is a kernel message
    that starts with the driver's words (src/nodecheck/probes/kernel_lines.py): the same words mid-sentence are not one."""
    if len(text) > MAX_COMMAND_OUTPUT:
        raise ParseError(f"kernel log: more than {MAX_COMMAND_OUTPUT >> 20} MiB: not read")
    events: deque[XidEvent] = deque(maxlen=MAX_EVENTS)  # the newest: the last events are the ones that matter now
    # (line, GPU) of the last "The NVIDIA GPU ..." lines awaiting "fallen off the bus"
    off_bus_started: deque[tuple[int, str]] = deque(maxlen=OFF_BUS_WITHIN + 1)
    continues, began = 0, None  # the line an indented NVRM line must be to continue a message, and that message's stamp
    for number, raw in enumerate(text.splitlines(), start=1):
        if "NVRM" not in raw and "SXid" not in raw and "mlx5" not in raw:
            continue
        message, usec, stamped = kernel_message(raw)
        if not stamped and number == continues and raw[:1] in " \t":
            message, usec = message.lstrip(" \t"), began  # a further line of one multi-line message (MULTI_LINE)
        if message.startswith("NVRM: "):
            continues, began = number + 1, usec
        if NIC_MESSAGE.match(message):
            if nic := _nic_event(message, number, usec):
                events.append(nic)
        elif xid := _XID.match(message):
            nvlink5 = NVLINK5_XID.match(message, xid.end())
            link = int(nvlink5[2]) if nvlink5 and int(nvlink5[2]) >= 0 else None  # -1: an error of no one link
            events.append(_event("xid", xid[1], xid["code"], message, xid.end(), number, usec, link=link,
                                 instance=xid["instance"]))
        elif sxid := _SXID.match(message):
            if _SXID_MORE.match(message, sxid.end()) and _continues(events, int(sxid[1]), int(sxid[3]), number):
                continue
            link = _SXID_LINK.match(message, sxid.end())
            events.append(_event("sxid", sxid[2], sxid[3], message, sxid.end(), number, usec, switch=int(sxid[1]),
                                 link=int(link[1]) if link else None))
        elif not message.startswith("NVRM: "):
            continue
        elif one := _OFF_BUS_ONE_LINE.match(message) or _OFF_BUS_OLD.match(message):
            events.append(_event("xid", one[1], str(XID_FALLEN_OFF_THE_BUS), message, one.end(), number, usec, implied=True))
        elif first := _OFF_BUS_FIRST.match(message):
            if "fallen off the bus" in message[first.end():]:
                events.append(_event("xid", first[1], str(XID_FALLEN_OFF_THE_BUS), message, first.end(), number, usec, implied=True))
            else:  # at most one a line, the last few kept: a log of a million distinct GPUs costs a million steps
                off_bus_started.append((number, first[1]))
        elif "fallen off the bus" in message:
            begun = {address: None for line, address in off_bus_started if number - line <= OFF_BUS_WITHIN}
            for address in begun:
                events.append(_event("xid", address, str(XID_FALLEN_OFF_THE_BUS), message, 0, number, usec, implied=True))
            off_bus_started.clear()
    return _without_echoes(list(events))


def _nic_event(raw: str, number: int, usec: int | None) -> XidEvent | None:
    """A ConnectX NIC's module error or slot power event (a message that starts `mlx5_core ADDRESS: `)."""
    device = _MLX5.match(raw)
    pci, printed, at = (normal_pci(device[1]), device[1], device.end()) if device else (None, None, 0)
    if module := _MODULE_ERROR.search(raw, at):
        return XidEvent("nic", pci, NIC_MODULE_ERROR, f"module {module[1]}: {module[2].strip()}"[:200], number, usec,
                        printed=printed)
    if power := _SLOT_POWER.search(raw, at):
        return XidEvent("nic", pci, NIC_SLOT_POWER, f"insufficient power on the PCIe slot ({power[1]} W)", number, usec,
                        printed=printed)
    return None


def _continues(events: deque[XidEvent], switch: int, code: int, number: int) -> bool:
    """Whether a "Severity ..." or "Data {...}" SXid line belongs to an event already counted: the same switch
    logged the same SXid a few lines before. One event, not three; alone (its first line lost) it counts."""
    for event in reversed(events):
        if event.line < number - SXID_LINES_WITHIN:
            return False
        if event.kind == "sxid" and event.switch == switch and event.code == code:
            return True
    return False


def _event(kind: str, address: str, code: str, raw: str, end: int, line: int, usec: int | None, **more) -> XidEvent:
    message = raw[end:end + 800].replace("\\x0a", " ").strip()[:200]  # /dev/kmsg escapes a record's inner newlines
    caused = _CAUSED_BY.search(raw)
    return XidEvent(kind, _device(address), int(code), message, line, usec, int(caused[1]) if caused else None,
                    printed=address, **more)


def _without_echoes(events: list[XidEvent]) -> list[XidEvent]:
    """An implied Xid 79 is dropped where the driver also printed the Xid 79 line for that GPU: one event."""
    printed = {e.pci for e in events if e.code == XID_FALLEN_OFF_THE_BUS and not e.implied}
    return [e for e in events if not (e.implied and e.pci in printed)]


def collect(host, timeout: float) -> KernelLog:
    """The first source that answers and reaches back to boot, parsed; where the kernel's ring buffer has
    overwritten the oldest messages, the source that reaches back furthest (`lost_before_usec` says from when).
    A snapshot from before nodecheck read the kernel log gives no data."""
    reads = [(KMSG, lambda share: host.kernel_messages(share))]
    reads += [(argv[0], lambda share, source=source, argv=argv: host.command(source, argv, share)) for source, argv in COMMANDS]
    why, recorded, partial = [], False, []
    for name, read in reads:
        try:
            text = read(timeout / len(reads))
        except NotRecorded as error:
            why.append(str(error))
            continue
        except (NoData, TimedOut, ProbeFailed) as error:
            why.append(str(error))
            recorded = True
            continue
        recorded = True
        if not _has_messages(text):  # a booted kernel has logged something: none means none could be read
            why.append(f"{name} gave no kernel messages (journalctl: no journal file it may read)")
            continue
        lost_before = _lost_before(name, text)
        if lost_before is None:
            return KernelLog(True, None, name, parse_kernel_log(text), _uptime_usec(host))
        partial.append((lost_before, name, text))  # a later source may hold what the ring buffer lost
    if partial:
        lost_before, name, text = min(partial, key=lambda p: p[0])
        return KernelLog(True, None, name, parse_kernel_log(text), _uptime_usec(host), lost_before)
    if not recorded:
        raise NotRecorded("the kernel log is not in the snapshot")
    needs = " (needs CAP_SYSLOG)" if any("CAP_SYSLOG" in w for w in why) else ""
    return KernelLog(False, f"unknown{needs}: the kernel log could not be read (" + "; ".join(why)[:400] + ")")


FROM_BOOT_USEC = 1_000_000  # the kernel's first lines are stamped 0.000000: a log whose oldest is later lost some
BOOT_LINE = "Linux version "  # the kernel's first message (systemd 256.1+'s journal may stamp it seconds late)


def _lost_before(source: str, text: str) -> int | None:
    """None when the log reaches back to boot, else the time since boot (us) of its oldest message. /dev/kmsg
    numbers its records from 0 at boot, so a first record past 0 means the ring buffer overwrote the older
    ones; journalctl's and dmesg's log starts at boot when it holds the kernel's first message or its oldest
    line is stamped within the first second (a log without any stamp is taken whole)."""
    oldest = None
    for line in text.split("\n", 200)[:200]:  # not splitlines(): the log may be 16 MiB
        if source == KMSG and (record := _KMSG_SEQ.match(line)):
            return None if int(record[1]) == 0 else int(record[2])
        if source != KMSG and BOOT_LINE in line:
            return None
        if source != KMSG and oldest is None:
            oldest = kernel_message(line)[1]
    return None if oldest is None or oldest < FROM_BOOT_USEC else oldest


def _has_messages(text: str) -> bool:
    """Whether a source handed over any kernel message: journalctl prints "-- No entries --" and exits 0 when
    it found no journal file it may read (a user outside the systemd-journal group, a container)."""
    return any(line.strip() and line.strip() != "-- No entries --" for line in text.split("\n", 50)[:50])


def _uptime_usec(host) -> int | None:
    from nodecheck.probes.history import uptime_seconds

    seconds = uptime_seconds(host)
    return int(seconds * 1_000_000) if seconds is not None and seconds < 1e12 else None


def fill(report, facts: KernelLog) -> None:
    report.kernel_log = facts


PROBE = Probe("kernel_log", collect, 10.0, fill)
