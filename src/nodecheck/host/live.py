"""The one interface through which probes read a machine: commands, files under /sys and /proc,
NVML, interface addresses. LiveHost reads the real machine (under an injectable root);
snapshot.SnapshotHost replays what a RecordingHost saved. No probe has a test-only path."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Callable, Protocol

from nodecheck import __version__
from nodecheck.core.errors import NO_DRIVER, NoData, NodecheckError
from nodecheck.core.limits import MAX_COMMAND_OUTPUT, MAX_CONF_FILE, MAX_DIR_ENTRIES, MAX_SYSFS_FILE, READ_HEAD
from nodecheck.host.commands import call_with_timeout, run_command, stop_at_deadline
from nodecheck.host.files import PORT_COUNTER, read_bounded, read_head, read_kmsg, read_port_counter
from nodecheck.host.network import connect_rtt_ms, resolve_name, route_to


class Host(Protocol):
    label: str

    def command(self, source: str, argv: list[str], timeout: float) -> str:
        """stdout of argv. NoData when the binary is absent, ProbeFailed on timeout or failure."""

    def read_text(self, path: str) -> str | None:
        """Contents of a file under /sys or /proc (and /etc/nccl.conf), None when it does not exist or cannot be read."""

    def read_link(self, path: str) -> str | None: ...

    def kernel_messages(self, timeout: float) -> str:
        """The kernel's ring buffer as /dev/kmsg records. NoData when it cannot be read (CAP_SYSLOG)."""

    def history(self) -> dict:
        """{"boot_id": this boot's id, "state": nodecheck's state file as JSON, or None} (src/nodecheck/host/state.py)."""

    def remember(self, sample, min_interval_s: float, log=None) -> str | None:
        """Keep this run's error counters (for the next run's rates) and what it read in the kernel log (a
        LogMemory); why not, when they could not be kept."""

    def list_dir(self, path: str) -> list[str]: ...

    def nvml(self, timeout: float, dump: Callable[[], dict]) -> dict:
        """The raw NVML values, as `dump` (the NVML probe's reader) returns them. NoData without a driver."""

    def addresses(self) -> dict[str, list[dict]]:
        """Interface name -> [{family, address, prefixlen}]."""

    def resolve(self, name: str, port: int, timeout: float) -> str:
        """Another node's address (NodecheckError when it does not resolve; NoData from a snapshot)."""

    def route(self, address: str, interface: str | None, timeout: float) -> tuple[str, str | None, list[str]]:
        """(interface, gateway, that interface's networks) the kernel would use to reach `address`."""

    def connect_rtt_ms(self, address: str, port: int, timeout: float) -> float:
        """The round trip of a TCP connect to `address:port`, in milliseconds."""

    def identity(self) -> dict: ...


class LiveHost:
    """The machine nodecheck runs on. root moves /sys and /proc (tests point it at a tree)."""

    def __init__(self, root: str | Path = "/") -> None:
        self.root = Path(root)
        self.label = "live" if str(root) == "/" else f"live:{root}"
        self._memory: dict | None = None  # this boot's state, kept when the state file cannot be written
        self._refused: dict[str, float] = {}  # InfiniBand ports whose firmware refused a counter (read_port_counter)

    def _path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def command(self, source: str, argv: list[str], timeout: float) -> str:
        return run_command(argv, timeout)

    def read_text(self, path: str) -> str | None:
        stop_at_deadline(path)
        if counter := PORT_COUNTER.match(path):
            return read_port_counter(self._path(path), counter[1], self._refused, MAX_SYSFS_FILE)
        if path in READ_HEAD:  # NCCL reads /etc/nccl.conf whole: one past 64 KiB is still read, not a failed probe
            return read_head(self._path(path), MAX_CONF_FILE)
        return read_bounded(self._path(path), MAX_SYSFS_FILE)

    def read_link(self, path: str) -> str | None:
        stop_at_deadline(path)
        try:
            return os.readlink(self._path(path))
        except OSError:
            return None

    def kernel_messages(self, timeout: float) -> str:
        return read_kmsg(self._path("/dev/kmsg"), MAX_COMMAND_OUTPUT, timeout)

    def history(self) -> dict:
        from nodecheck.host.state import boot_id, read_state, this_boot

        state = read_state()  # nodecheck's own file: never under root
        if self._memory:  # the state directory cannot be written: this process's memory of the boot fills in
            state = this_boot(state, self._memory["boot_id"])
            state = dict(state, **{k: v for k, v in self._memory.items() if not state.get(k)})
        return {"boot_id": boot_id(self.read_text), "state": state}

    def remember(self, sample, min_interval_s: float, log=None) -> str | None:
        """Into the state file; where it cannot be written (not root, no StateDirectory), in this process's
        memory, which serves a daemon's next round."""
        from nodecheck.host.state import boot_id, record_round, remember_round, this_boot

        boot = boot_id(self.read_text)
        try:
            record_round(sample, min_interval_s, log, boot)
            return None
        except NodecheckError as error:
            self._memory = this_boot(self._memory, boot)
            remember_round(self._memory, sample, min_interval_s, log)
            return str(error)

    def list_dir(self, path: str) -> list[str]:
        stop_at_deadline(path)
        try:
            with os.scandir(self._path(path)) as entries:  # bounded like a file: a hostile listing has millions
                return sorted(entry.name for entry, _ in zip(entries, range(MAX_DIR_ENTRIES), strict=False))
        except OSError:
            return []

    def nvml(self, timeout: float, dump: Callable[[], dict]) -> dict:
        if not self._path("/dev/nvidiactl").exists():  # NVML cannot start: spare its import (20 ms) on every CPU node
            raise NoData(f"{NO_DRIVER}: no /dev/nvidiactl (the NVIDIA driver is not loaded, or its devices are not "
                         "passed to this container)")
        return call_with_timeout(dump, timeout, "NVML", single_flight=True)

    def addresses(self) -> dict[str, list[dict]]:
        from nodecheck.host.netif import interface_addresses

        return interface_addresses()

    def resolve(self, name: str, port: int, timeout: float) -> str:
        return call_with_timeout(lambda: resolve_name(name, port), timeout, f"resolving {name}")

    def route(self, address: str, interface: str | None, timeout: float) -> tuple[str, str | None, list[str]]:
        return call_with_timeout(lambda: route_to(address, interface), timeout, f"route to {address}")

    def connect_rtt_ms(self, address: str, port: int, timeout: float) -> float:
        return connect_rtt_ms(address, port, timeout)

    def identity(self) -> dict:
        uname = platform.uname()
        return {"hostname": socket.gethostname(), "kernel": uname.release, "machine": uname.machine,
                "nodecheck_version": __version__}
