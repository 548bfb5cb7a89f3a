"""nodecheck's memory between runs on one boot: the state file (`$STATE_DIRECTORY/state.json`, systemd's
StateDirectory=, else /var/lib/nodecheck). It holds the boot id it was written on, so a reboot starts it
afresh, the operators' acknowledgements (`nodecheck clear`), the last error-counter samples (a rate needs
two) and the NVIDIA events runs read in the kernel log (its ring buffer forgets them). Read like any
untrusted file (bounded, a regular file, JSON of the expected shape: else it is as good as absent); written
atomically under a lock, so a `clear` and a daemon's round never lose each other's writes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from dataclasses import asdict, replace
from pathlib import Path

from nodecheck.core import typed_json
from nodecheck.core.errors import NodecheckError
from nodecheck.host.files import atomic_file, read_bounded, untrusted_why
from nodecheck.report.events import (
    REMEMBERED_EVENTS,
    REMEMBERED_MESSAGE,
    Acknowledgement,
    CounterSample,
    LogMemory,
    XidEvent,
    union_events,
)
from nodecheck.report.model import from_json

DEFAULT_DIR = "/var/lib/nodecheck"
STATE_FILE = "state.json"
MAX_STATE_BYTES = 1024 * 1024
MAX_ACKNOWLEDGEMENTS = 1000  # the oldest go first: a script clearing in a loop cannot grow the file forever
MAX_SAMPLES = 4
MAX_COUNTERS = 20_000  # per sample: a node has a few hundred
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def state_dir() -> Path:
    return Path(os.environ.get("STATE_DIRECTORY", "").split(":")[0] or DEFAULT_DIR)


def boot_id(read=lambda path: read_bounded(Path(path), 4096)) -> str | None:
    text = (read(BOOT_ID) or "").strip()
    return text[:64] or None


def read_state(directory: Path | None = None) -> dict | None:
    """The state file's JSON object; None when absent, unreadable or not an object (a broken file is
    forgotten, never fatal: the worst it costs is an acknowledgement). NodecheckError when another user could
    have written it (_trusted): its remembered Xids would drain and its acknowledgements hide real ones."""
    target = (directory or state_dir()) / STATE_FILE
    _trusted(target)
    try:
        text = read_bounded(target, MAX_STATE_BYTES)
        data = typed_json.loads(text) if text is not None else None
    except (NodecheckError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def this_boot(data: dict | None, current_boot: str | None) -> dict:
    """The state as it holds for this boot: empty when written on another (or the boot is unknown)."""
    if not data or current_boot is None or data.get("boot_id") != current_boot:
        return {"boot_id": current_boot, "acknowledgements": [], "samples": []}
    return data


def _cannot_write(directory: Path, error: OSError) -> NodecheckError:
    return NodecheckError(f"cannot write nodecheck's state in {directory} ({error.strerror or error}): "
                          "run as root, or set STATE_DIRECTORY to a directory you may write")


def _trusted(path: Path) -> None:
    if why := untrusted_why(path):
        raise NodecheckError(f"nodecheck's state {path} is not trusted: {why} (another user could write what it "
                             "remembers; make it root's alone: chown root: and chmod go-w)")


LOCK_WAIT_S = 5.0  # a state update waits this long for the lock, then the round is kept in memory: never for ever
LOCK_POLL_S = 0.05


@contextlib.contextmanager
def _locked(directory: Path, wait_s: float = LOCK_WAIT_S):
    """The state directory's lock, held by one nodecheck process at a time. The lock file is this user's alone
    (0600: no one else may open it, so no one else may hold it); one not had within `wait_s` is a
    NodecheckError (the caller keeps its round in memory), never a wait for ever."""
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        _trusted(directory / ".lock")
        fd = os.open(directory / ".lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as error:
        raise _cannot_write(directory, error) from None
    try:
        held = os.fstat(fd)
        if held.st_uid not in (0, os.geteuid()) or not stat.S_ISREG(held.st_mode):
            raise NodecheckError(f"{directory / '.lock'}: not a file of root's: the state is not updated")
        if held.st_mode & 0o077:  # an older nodecheck made it 0644: anyone could open it and hold it
            os.fchmod(fd, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise NodecheckError(f"nodecheck's state lock {directory / '.lock'} is held by another process "
                                         f"for over {wait_s:g} s: this round is kept in memory") from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)


def acknowledge(ack: Acknowledgement, directory: Path | None = None) -> Path:
    """Add an acknowledgement to this boot's state; returns the file written."""
    def add(data: dict) -> None:
        acks = [a for a in data.get("acknowledgements") or [] if isinstance(a, dict)]
        data["acknowledgements"] = (acks + [asdict(ack)])[-MAX_ACKNOWLEDGEMENTS:]

    return _update(directory or state_dir(), add)


def record_round(sample: CounterSample | None, min_interval_s: float, log: LogMemory | None, boot: str | None,
                 directory: Path | None = None) -> Path:
    """Add this run's counters and what it read in the kernel log to this boot's state (one write)."""
    return _update(directory or state_dir(), lambda data: remember_round(data, sample, min_interval_s, log), boot)


def remember_round(data: dict, sample: CounterSample | None, min_interval_s: float, log: LogMemory | None) -> None:
    """This run's part of a boot's state (a state file's, or a daemon's memory where none can be written)."""
    if sample is not None:
        _add_sample(data, sample, min_interval_s)
    if log is not None:
        _add_log(data, log)


def _add_sample(data: dict, sample: CounterSample, min_interval_s: float) -> None:
    """Keep what a later run needs for its rate: the newest sample at least min_interval_s older than this
    one, and those newer than that."""
    kept = [s for s in data.get("samples") or [] if isinstance(s, dict) and isinstance(s.get("uptime_s"), (int, float))]
    kept = sorted((s for s in kept if s["uptime_s"] < sample.uptime_s), key=lambda s: s["uptime_s"])
    old_enough = [s for s in kept if sample.uptime_s - s["uptime_s"] >= min_interval_s]
    recent = [s for s in kept if sample.uptime_s - s["uptime_s"] < min_interval_s]
    data["samples"] = (old_enough[-1:] + recent + [asdict(sample)])[-MAX_SAMPLES:]


def _add_log(data: dict, log: LogMemory) -> None:
    """The union of the events every run read (another process may have written between this run's read and
    now), and the gap-free stretch of the log of whichever run read it last."""
    stored = log_memory_from(data.get("kernel_log"))
    events = [replace(e, message=e.message[:REMEMBERED_MESSAGE]) for e in union_events(stored.events, log.events)]
    latest = log if (log.upto_usec or 0) >= (stored.upto_usec or 0) else stored
    data["kernel_log"] = {"events": [asdict(e) for e in events], "from_usec": latest.from_usec, "upto_usec": latest.upto_usec}


def log_memory_from(raw) -> LogMemory:
    """A state file's kernel-log memory, read as untrusted input: events not of their shape are left out, and
    no more than a state file keeps are read."""
    raw = raw if isinstance(raw, dict) else {}
    events = []
    for entry in raw.get("events")[-REMEMBERED_EVENTS:] if isinstance(raw.get("events"), list) else []:
        try:
            event = from_json(XidEvent, entry) if isinstance(entry, dict) else None
        except ValueError:
            continue
        if event is not None and event.usec is not None and event.kind in ("xid", "sxid", "nic"):
            events.append(event)
    stretch = [raw.get(k) if isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool) else None
               for k in ("from_usec", "upto_usec")]
    return LogMemory(sorted(events, key=lambda e: e.usec), *stretch)


def fitted(data: dict) -> bytes:
    """The state as its reader will read it: within MAX_STATE_BYTES, the oldest counter samples dropped first,
    then the oldest remembered events; never an acknowledgement (a file over the bound is forgotten whole, and
    with it every acknowledgement). Compact: 7,000 counters a sample already filled 1 MiB indented."""
    def encoded() -> bytes:
        return json.dumps(data, separators=(",", ":")).encode()

    out = encoded()
    while len(out) > MAX_STATE_BYTES and data.get("samples"):
        data["samples"] = data["samples"][1:]
        out = encoded()
    events = (data.get("kernel_log") or {}).get("events") if isinstance(data.get("kernel_log"), dict) else None
    while len(out) > MAX_STATE_BYTES and events:
        del events[:max(1, len(events) // 4)]
        out = encoded()
    return out


def _update(directory: Path, change, boot: str | None = None) -> Path:
    with _locked(directory):
        data = this_boot(read_state(directory), boot or boot_id())
        change(data)
        target = directory / STATE_FILE
        try:  # a lock anyone may open does not make the directory writable (root made it; this run is not root)
            with atomic_file(target) as out:
                out.write(fitted(data))
        except OSError as error:
            raise _cannot_write(directory, error) from None
    return target
