"""PCIe Advanced Error Reporting counters of one device, from sysfs (Linux >= 4.17):
/sys/bus/pci/devices/ADDRESS/aer_dev_correctable, aer_dev_nonfatal, aer_dev_fatal, one `Name count` per line
and `TOTAL_ERR_COR` / `TOTAL_ERR_NONFATAL` / `TOTAL_ERR_FATAL` last. The counts run since boot (or since the
driver bound the device); a device without AER (or an older kernel) has none of the files."""

from __future__ import annotations

import re

FAMILIES = {"correctable": ("aer_dev_correctable", "TOTAL_ERR_COR"),
            "nonfatal": ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
            "fatal": ("aer_dev_fatal", "TOTAL_ERR_FATAL")}
_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9_]{0,40}) ([0-9]{1,20})$")
MAX_COUNT = (1 << 64) - 1
MAX_LINES = 64  # the kernel prints about 20 a file


def parse_aer_file(text: str) -> tuple[int | None, dict[str, int]]:
    """(the TOTAL_ERR_* line's count, the other lines' nonzero counts by name); the total is None when the
    file does not end with one (garbled, cut)."""
    total, named = None, {}
    for line in text.splitlines()[:MAX_LINES]:
        match = _LINE.match(line.strip())
        if not match or int(match[2]) > MAX_COUNT:
            continue
        if match[1].startswith("TOTAL_ERR_"):
            total = int(match[2])
        elif int(match[2]):
            named[match[1]] = int(match[2])
    return total, named


def read_aer(read) -> dict[str, int] | None:
    """{"correctable": n, "nonfatal": n, "fatal": n, "correctable.RxErr": n ...} (the nonzero named counts
    under their family) from `read(file name) -> text or None`; None when the device has no AER files."""
    counts: dict[str, int] = {}
    found = False
    for family, (name, _) in FAMILIES.items():
        text = read(name)
        if text is None:
            continue
        found = True
        total, named = parse_aer_file(text)
        if total is not None:
            counts[family] = total
        counts.update({f"{family}.{key}": value for key, value in named.items()})
    return counts if found else None
