"""Uncorrectable PCIe errors in a kernel log, as the kernel's AER driver prints them (drivers/pci/pcie/aer.c and err.c):
"pcieport 0000:00:03.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)"
("Uncorrectable" in newer kernels, without "AER: " in older ones), the error bits after it ("[14] CmpltTO (First)"),
and a device whose driver cannot take part in the recovery ("nvidia 0000:03:00.0: AER: can't recover (no
error_detected callback)", older kernels "device has no AER-aware driver"): NVIDIA's GPU driver has no AER callbacks,
so a GPU below a link that failed stays lost. Corrected errors are left to the sysfs counters a live node reads.

Read for `nodecheck kernel-log` (a pasted log), where no sysfs counter stands beside it. Kind "aer" events: code 1
fatal, 2 non-fatal (on the device whose line it is), 3 a device that could not recover. Linear and bounded: each line
is tried once, anchored."""

from __future__ import annotations

import re
from collections import deque

from nodecheck.core.pci import normal_pci
from nodecheck.probes.kernel_lines import kernel_message
from nodecheck.report.events import XidEvent

AER_FATAL, AER_NONFATAL, AER_NO_RECOVERY = 1, 2, 3
MAX_AER_EVENTS = 1_000
JUDGED_DRIVERS = ("nvidia", "mlx5_core")  # the drivers of the devices nodecheck judges: GPUs and ConnectX NICs
_DEVICE = r"(?P<driver>[\w.-]{1,32}) (?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): "
_BUS_ERROR = re.compile(_DEVICE + r"(?:AER: )?PCIe Bus Error: severity=Uncorrect(?:ed|able) \((?P<severity>Fatal|Non-Fatal)\), "
                        r"type=(?P<type>[A-Za-z ]{1,40}?),")
_ANY_BUS_ERROR = re.compile(_DEVICE + r"(?:AER: )?PCIe Bus Error: ")  # a corrected one too: later bits are its
_BIT = re.compile(_DEVICE + r"(?:AER: )?\s{1,8}\[\s{0,2}\d{1,2}\] (?P<name>[A-Za-z][\w ]{0,40}?)\s*(?:\(First\))?\s*$")
_NO_RECOVERY = re.compile(_DEVICE + r"(?:AER: )?(?P<what>can't recover \(no error_detected callback\)|device has no AER-aware driver)")
BITS_WITHIN = 8  # lines after its "PCIe Bus Error" line in which an error bit line of the same device is its


def parse_aer_events(text: str) -> list[XidEvent]:
    """The uncorrectable AER events of a kernel log, in order (the newest MAX_AER_EVENTS)."""
    events: deque[XidEvent] = deque(maxlen=MAX_AER_EVENTS)
    opened: XidEvent | None = None  # the uncorrected error whose bit lines may follow
    for number, raw in enumerate(text.splitlines(), start=1):
        if "PCIe Bus Error" not in raw and "recover" not in raw and "AER-aware" not in raw and "] " not in raw:
            continue  # an error bit's line holds "[14] CmpltTO"
        message, usec, stamped = kernel_message(raw)
        if not stamped:
            continue
        if error := _BUS_ERROR.match(message):
            code = AER_FATAL if error["severity"] == "Fatal" else AER_NONFATAL
            events.append(opened := _event(error, code, f"Uncorrected ({error['severity']}), type={error['type']}", number, usec))
        elif _ANY_BUS_ERROR.match(message):
            opened = None  # a corrected error's bits are not the uncorrected one's
        elif bit := _BIT.match(message):
            if opened and opened.printed == bit["bdf"] and number - opened.line <= BITS_WITHIN:
                opened.message = f"{opened.message} [{bit['name'].strip()}]"[:200]
        elif gone := _NO_RECOVERY.match(message):
            events.append(_event(gone, AER_NO_RECOVERY, gone["what"], number, usec))
    return list(events)


def driver_of(event: XidEvent) -> str:
    """The driver an AER event's line was printed by (its message starts "pcieport: ...", "nvidia: ...")."""
    return event.message.split(":", 1)[0]


def unrecovered(event: XidEvent) -> bool:
    """A GPU or ConnectX NIC that could not recover from an uncorrectable error on its link."""
    return event.code == AER_NO_RECOVERY and driver_of(event) in JUDGED_DRIVERS


def _event(match: re.Match, code: int, said: str, line: int, usec: int | None) -> XidEvent:
    return XidEvent("aer", normal_pci(match["bdf"]), code, f"{match['driver']}: {said}"[:200], line, usec,
                    printed=match["bdf"])
