"""What nodecheck remembers on this boot (src/nodecheck/host/state.py's file): the operators' acknowledgements, the last
error-counter samples and the NVIDIA events earlier runs read in the kernel log, read as untrusted input, and
/proc/uptime (now). A file from another boot, or one not of its shape, is as good as none."""

from __future__ import annotations

from dataclasses import fields

from nodecheck.core.errors import NodecheckError
from nodecheck.host.state import MAX_ACKNOWLEDGEMENTS, MAX_COUNTERS, MAX_SAMPLES, log_memory_from, this_boot
from nodecheck.probes.base import Probe
from nodecheck.report.events import Acknowledgement, CounterSample, History
from nodecheck.report.model import from_json

FIELDS = {f.name for f in fields(Acknowledgement)}
MAX_COUNT = 1 << 64  # counters are at most 64-bit: a sample of -10**300 or 10**300 is garbage, not a rate
MAX_UPTIME_S = 1e10  # three centuries


def history_from(raw: dict) -> History:
    current = raw.get("boot_id") if isinstance(raw.get("boot_id"), str) else None
    state = raw.get("state") if isinstance(raw.get("state"), dict) else None
    data = this_boot(state, current)
    acks = []
    for entry in (data.get("acknowledgements") or [])[-MAX_ACKNOWLEDGEMENTS:] if isinstance(data.get("acknowledgements"), list) else []:
        if not isinstance(entry, dict) or not FIELDS <= set(entry):
            continue  # one broken entry costs itself, not the others
        try:
            ack = from_json(Acknowledgement, entry)
        except ValueError:
            continue
        if isinstance(ack.kind, str) and isinstance(ack.count, int):
            acks.append(ack)
    return History(current, acks, _samples(data.get("samples")),
                   kernel_log=log_memory_from(data["kernel_log"]) if "kernel_log" in data else None)


def _samples(raw) -> list[CounterSample]:
    """The samples of a state file, oldest first; entries not of their shape (or holding more than a node
    has) are left out."""
    out = []
    for entry in raw[-MAX_SAMPLES:] if isinstance(raw, list) else []:
        counters = entry.get("counters") if isinstance(entry, dict) else None
        uptime = entry.get("uptime_s") if isinstance(entry, dict) else None
        if (isinstance(uptime, (int, float)) and not isinstance(uptime, bool) and 0 <= uptime < MAX_UPTIME_S
                and isinstance(counters, dict) and len(counters) <= MAX_COUNTERS
                and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_COUNT
                        for k, v in counters.items())):
            out.append(CounterSample(float(uptime), dict(counters)))
    return sorted(out, key=lambda s: s.uptime_s)


def uptime_seconds(host) -> float | None:
    """/proc/uptime's first figure: now, on the clock the samples (and the kernel log) are stamped with."""
    try:
        return float((host.read_text("/proc/uptime") or "").split()[0])
    except (IndexError, ValueError):
        return None


def collect(host, timeout: float) -> History:
    try:
        history = history_from(host.history())
        history.uptime_s = uptime_seconds(host)
        return history
    except NodecheckError:
        raise
    except (TypeError, AttributeError) as error:  # a snapshot's document of another shape
        raise NodecheckError(f"nodecheck's state: not its shape ({error})") from None


def fill(report, facts: History) -> None:
    report.history = facts


PROBE = Probe("history", collect, 2.0, fill)
