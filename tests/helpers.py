"""Scaffolding several tests share: free ports and a private network namespace."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's pick: never a fixed number)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def in_private_network(argv: list[str]) -> list[str]:
    """argv run in a network namespace of its own with loopback up (root): a fixed port there cannot
    meet another test suite's."""
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
