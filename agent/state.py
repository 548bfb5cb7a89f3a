"""nodecheck's memory between runs on one boot: the state file (`$STATE_DIRECTORY/state.json`, systemd's
StateDirectory=, else /var/lib/nodecheck). It holds the boot id it was written on, so a reboot starts it
afresh, the operators' acknowledgements (`nodecheck clear`) and the last error-counter samples (a rate
needs two). Read like any untrusted file (bounded, a regular file, JSON of the expected shape: else it is as
good as absent); written atomically under a lock, so a `clear` and a daemon's round never lose each other's
writes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import asdict
from pathlib import Path

from nodecheck.errors import NodecheckError
from nodecheck.events import Acknowledgement, CounterSample
from nodecheck.files import atomic_file, read_bounded

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
    forgotten, never fatal: the worst it costs is an acknowledgement)."""
    try:
        text = read_bounded((directory or state_dir()) / STATE_FILE, MAX_STATE_BYTES)
        data = json.loads(text) if text is not None else None
    except (NodecheckError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def this_boot(data: dict | None, current_boot: str | None) -> dict:
    """The state as it holds for this boot: empty when written on another (or the boot is unknown)."""
    if not data or current_boot is None or data.get("boot_id") != current_boot:
        return {"boot_id": current_boot, "acknowledgements": [], "samples": []}
    return data


@contextlib.contextmanager
def _locked(directory: Path):
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(directory / ".lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)  # root and the units share it
    except OSError as error:
        raise NodecheckError(f"cannot write nodecheck's state in {directory} ({error.strerror or error}): "
                             "run as root, or set STATE_DIRECTORY to a directory you may write") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def acknowledge(ack: Acknowledgement, directory: Path | None = None) -> Path:
    """Add an acknowledgement to this boot's state; returns the file written."""
    def add(data: dict) -> None:
        acks = [a for a in data.get("acknowledgements") or [] if isinstance(a, dict)]
        data["acknowledgements"] = (acks + [asdict(ack)])[-MAX_ACKNOWLEDGEMENTS:]

    return _update(directory or state_dir(), add)


def record_sample(sample: CounterSample, min_interval_s: float, boot: str | None, directory: Path | None = None) -> Path:
    """Add this run's counters to this boot's state, keeping what a later run needs for its rate: the newest
    sample at least min_interval_s older than this one, and those newer than that."""
    def add(data: dict) -> None:
        kept = [s for s in data.get("samples") or [] if isinstance(s, dict) and isinstance(s.get("uptime_s"), (int, float))]
        kept = sorted((s for s in kept if s["uptime_s"] < sample.uptime_s), key=lambda s: s["uptime_s"])
        old_enough = [s for s in kept if sample.uptime_s - s["uptime_s"] >= min_interval_s]
        recent = [s for s in kept if sample.uptime_s - s["uptime_s"] < min_interval_s]
        data["samples"] = (old_enough[-1:] + recent + [asdict(sample)])[-MAX_SAMPLES:]

    return _update(directory or state_dir(), add, boot)


def _update(directory: Path, change, boot: str | None = None) -> Path:
    with _locked(directory):
        data = this_boot(read_state(directory), boot or boot_id())
        change(data)
        target = directory / STATE_FILE
        with atomic_file(target) as out:
            out.write(json.dumps(data, indent=1).encode())
    return target
