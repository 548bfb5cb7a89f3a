"""What nodecheck remembers on this boot (agent/state.py's file): the operators' acknowledgements, read as
untrusted input. A file from another boot, or one not of its shape, is as good as none."""

from __future__ import annotations

from dataclasses import fields

from nodecheck.errors import NodecheckError
from nodecheck.events import Acknowledgement, History
from nodecheck.model import from_json
from nodecheck.probes.base import Probe
from nodecheck.state import MAX_ACKNOWLEDGEMENTS, this_boot

FIELDS = {f.name for f in fields(Acknowledgement)}


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
    return History(current, acks)


def collect(host, timeout: float) -> History:
    try:
        return history_from(host.history())
    except NodecheckError:
        raise
    except (TypeError, AttributeError) as error:  # a snapshot's document of another shape
        raise NodecheckError(f"nodecheck's state: not its shape ({error})") from None


def fill(report, facts: History) -> None:
    report.history = facts


PROBE = Probe("history", collect, 2.0, fill)
