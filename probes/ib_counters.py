"""InfiniBand (and RoCE) port error counters from sysfs: /sys/class/infiniband/DEV/ports/N/counters/NAME, else
hw_counters/NAME where a driver keeps it there. Only the counters a rule judges (agent/data/specs.toml
[ib_counters]); node_exporter publishes the rest. Their widths are the InfiniBand PortCounters attribute's:
a counter at its maximum (the 8-bit link_downed at 255) has saturated and no longer shows increases."""

from __future__ import annotations

import re

COUNTER_BITS = {  # InfiniBand Architecture Specification, PortCounters attribute
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_xmit_discards": 16,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
}
MAX_COUNT = (1 << 64) - 1
_COUNT = re.compile(r"[0-9]{1,20}")


def read_port_counters(host, base: str) -> dict[str, str | None]:
    """The raw text of each judged counter of the port at `base` (…/ports/N)."""
    out = {}
    for name in COUNTER_BITS:
        text = host.read_text(f"{base}/counters/{name}")
        out[name] = text if text is not None else host.read_text(f"{base}/hw_counters/{name}")
    return out


def parse_counter(text: str | None) -> int | None:
    """A counter's value; None for "N/A (no PMA)" (the port has no Performance Management Agent), an absent
    file or anything but a plain count."""
    value = (text or "").strip()
    if not _COUNT.fullmatch(value) or int(value) > MAX_COUNT:  # ASCII digits: str.isdigit() takes "²"
        return None
    return int(value)


def saturated(name: str, value: int | None) -> bool:
    bits = COUNTER_BITS.get(name)
    return value is not None and bits is not None and value >= (1 << bits) - 1
