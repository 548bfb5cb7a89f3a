"""The one interface through which probes read a machine: commands, files under /sys and /proc,
NVML, interface addresses. LiveHost reads the real machine (under an injectable root);
snapshot.SnapshotHost replays what a RecordingHost saved. No probe has a test-only path."""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Callable, Protocol, TypeVar

from nodecheck import __version__
from nodecheck.errors import NoData, NodecheckError, ProbeFailed, TimedOut

T = TypeVar("T")


class Host(Protocol):
    label: str

    def command(self, source: str, argv: list[str], timeout: float) -> str:
        """stdout of argv. NoData when the binary is absent, ProbeFailed on timeout or failure."""

    def read_text(self, path: str) -> str | None:
        """Contents of a file under /sys or /proc, None when it does not exist or cannot be read."""

    def read_link(self, path: str) -> str | None: ...

    def list_dir(self, path: str) -> list[str]: ...

    def nvml(self, timeout: float) -> dict:
        """The raw NVML values (probes.nvml.dump_nvml). NoData without a driver."""

    def addresses(self) -> dict[str, list[dict]]:
        """Interface name -> [{family, address, prefixlen}]."""

    def identity(self) -> dict: ...


def call_with_timeout(fn: Callable[[], T], timeout: float, what: str) -> T:
    """Run fn in a daemon thread; a call stuck in a driver cannot hold the caller past timeout."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as error:  # handed back to the caller below
            box["error"] = error

    thread = threading.Thread(target=target, name=f"nodecheck-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimedOut(f"{what} did not answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_command(argv: list[str], timeout: float, env: dict[str, str] | None = None, what: str | None = None,
                ok_returncodes: tuple[int, ...] = (0,)) -> str:
    """Run argv (never through a shell) with a hard timeout that kills its whole process group.
    `what` names the command in messages (default: the command line)."""
    what = what or " ".join(argv)
    env = dict(os.environ if env is None else env, LC_ALL="C")
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, start_new_session=True,
        )
    except FileNotFoundError:
        raise NoData(f"{argv[0]} not found on PATH") from None
    except OSError as error:
        raise ProbeFailed(f"cannot run {argv[0]}: {error}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise TimedOut(f"{what} did not finish within {timeout:g} s and was killed") from None
    stdout = out.decode("utf-8", errors="replace")
    if proc.returncode not in ok_returncodes:
        detail = (err.decode("utf-8", errors="replace").strip() or stdout.strip()).splitlines()
        reason = detail[-1][:200] if detail else "no output"
        raise ProbeFailed(f"{what} exited with {proc.returncode}: {reason}")
    return stdout


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        pass  # stuck in the kernel (D state): leave it, never hang the caller


class LiveHost:
    """The machine nodecheck runs on. root moves /sys and /proc (tests point it at a tree)."""

    def __init__(self, root: str | Path = "/") -> None:
        self.root = Path(root)
        self.label = "live" if str(root) == "/" else f"live:{root}"

    def _path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def command(self, source: str, argv: list[str], timeout: float) -> str:
        return run_command(argv, timeout)

    def read_text(self, path: str) -> str | None:
        try:
            return self._path(path).read_text(errors="replace")
        except OSError:  # absent, or sysfs refusing (speed of a down link: EINVAL)
            return None

    def read_link(self, path: str) -> str | None:
        try:
            return os.readlink(self._path(path))
        except OSError:
            return None

    def list_dir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(path)))
        except OSError:
            return []

    def nvml(self, timeout: float) -> dict:
        from nodecheck.probes.nvml import dump_nvml  # pynvml is imported only when NVML is asked

        return call_with_timeout(dump_nvml, timeout, "NVML")

    def addresses(self) -> dict[str, list[dict]]:
        import psutil

        families = {socket.AF_INET: "inet", socket.AF_INET6: "inet6"}
        out: dict[str, list[dict]] = {}
        for name, entries in psutil.net_if_addrs().items():
            for entry in entries:
                if entry.family in families and entry.netmask:
                    address = entry.address.split("%")[0]  # drop the IPv6 zone (fe80::1%eth0)
                    out.setdefault(name, []).append(
                        {"family": families[entry.family], "address": address, "prefixlen": _prefixlen(entry.netmask)}
                    )
        return out

    def identity(self) -> dict:
        uname = platform.uname()
        return {"hostname": socket.gethostname(), "kernel": uname.release, "machine": uname.machine,
                "nodecheck_version": __version__}


def _prefixlen(netmask: str) -> int:
    """'255.255.255.0' -> 24, 'ffff:ffff:ffff:ffff::' -> 64 (psutil gives masks, not lengths)."""
    import ipaddress

    try:
        return bin(int(ipaddress.ip_address(netmask))).count("1")
    except ValueError:
        raise NodecheckError(f"unreadable netmask {netmask!r}") from None
