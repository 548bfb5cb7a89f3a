"""Scaffolding several tests share: free ports, a private network namespace, waiting for a condition,
and stand-in executables."""

from __future__ import annotations

import socket
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's pick: never a fixed number)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def in_private_network(argv: list[str]) -> list[str]:
    """argv run in a network namespace of its own with loopback up (root): a fixed port there cannot
    meet another test suite's."""
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def wait_until(condition, seconds: float, what: str, pause: float = 0.1, tolerate: tuple = ()):
    """Poll `condition` until it returns something true, and return that; TimeoutError naming `what` once
    `seconds` have passed. An exception in `tolerate` counts as "not yet" (a server still starting)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            value = condition()
        except tolerate:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"waited {seconds:g} s for {what}")
        time.sleep(pause)


def fake_executable(path: Path, script: str) -> Path:
    """A stand-in for a real binary (nvidia-smi, a hung nodecheck): a shell script at `path`."""
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path
