"""A command's whole tree of processes, to end it: a hung tool's children that called setsid() left its process
group, and killpg() missed them (they outlived every kill, holding what they held). The tree is read from /proc
before anything is killed: once the parent dies its children are reparented and the link is gone."""

from __future__ import annotations

import contextlib
import os
import signal

MAX_PROCESSES = 65_536  # /proc entries read at most


def descendants(pid: int, proc: str = "/proc") -> list[int]:
    """Every process below `pid` (children, theirs, ...), by each process's parent in /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError), os.scandir(proc) as entries:
        for entry, _ in zip(entries, range(MAX_PROCESSES), strict=False):
            if not entry.name.isascii() or not entry.name.isdigit():
                continue
            try:
                with open(f"{proc}/{entry.name}/stat", "rb") as stat:
                    fields = stat.read(4096).rpartition(b")")[2].split()  # the name may hold spaces and ')'
                children.setdefault(int(fields[1]), []).append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    found, seen, pending = [], {pid}, [pid]
    while pending and len(found) < MAX_PROCESSES:
        for child in children.get(pending.pop(), []):
            if child not in seen:
                seen.add(child)
                found.append(child)
                pending.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL the process group `pid` leads and every process below `pid`, wherever its session."""
    below = descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
