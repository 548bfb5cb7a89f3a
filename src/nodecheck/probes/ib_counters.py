"""InfiniBand (and RoCE) port error counters from sysfs: /sys/class/infiniband/DEV/ports/N/counters/NAME, else
hw_counters/NAME where a driver keeps it there, and the transport retransmission counters of hw_counters/. Only
the counters a rule judges (src/nodecheck/checks/error_counters.py); node_exporter publishes the rest. Their widths are the
InfiniBand PortCounters attribute's: a counter at its maximum (the 8-bit link_downed at 255) has saturated and
no longer shows increases."""

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
# Transport retransmissions, per port in hw_counters/ only (mlx5's queue-pair counters; the kernel's words, IB/mlx5
# "Add port protocol stats" and RDMA/mlx5 "Add Qcounters req_transport_retries_exceeded"): packets lost between this
# port and its peers, on RoCE and InfiniBand alike. No PortCounters width: mlx5 keeps them in 32 bits, and a wrap
# reads as a reset (unknown for that run).
TRANSPORT_COUNTERS = {
    "local_ack_timeout_err": "a sending queue pair's ack timer expired (a packet or its ack lost, resent after a timeout)",
    "packet_seq_err": "NAK sequence errors received (the peer saw a gap)",
    "out_of_sequence": "packets received out of sequence (a gap)",
    "req_transport_retries_exceeded": "a sending queue pair ran out of retries (its connection failed)",
}
JUDGED = (*COUNTER_BITS, *TRANSPORT_COUNTERS)
MAX_COUNT = (1 << 64) - 1
_COUNT = re.compile(r"[0-9]{1,20}")


def read_port_counters(host, base: str) -> dict[str, str | None]:
    """The raw text of each judged counter of the port at `base` (…/ports/N); a transport counter a driver
    does not keep is left out (not unknown: there is nothing to read)."""
    out = {}
    for name in COUNTER_BITS:
        text = host.read_text(f"{base}/counters/{name}")
        out[name] = text if text is not None else host.read_text(f"{base}/hw_counters/{name}")
    for name in TRANSPORT_COUNTERS:
        text = host.read_text(f"{base}/hw_counters/{name}")
        if text is not None:
            out[name] = text
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
