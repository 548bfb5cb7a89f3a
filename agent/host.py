"""The one interface through which probes read a machine: commands, files under /sys and /proc,
NVML, interface addresses. LiveHost reads the real machine (under an injectable root);
snapshot.SnapshotHost replays what a RecordingHost saved. No probe has a test-only path."""

from __future__ import annotations

import contextlib
import os
import platform
import selectors
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Protocol, TypeVar

from nodecheck import __version__
from nodecheck.errors import NO_DRIVER, NoData, NodecheckError, ProbeFailed, TimedOut
from nodecheck.files import PORT_COUNTER, read_bounded, read_head, read_kmsg, read_port_counter
from nodecheck.limits import MAX_COMMAND_OUTPUT, MAX_CONF_FILE, MAX_DIR_ENTRIES, MAX_SYSFS_FILE, READ_HEAD

T = TypeVar("T")


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
        """{"boot_id": this boot's id, "state": nodecheck's state file as JSON, or None} (agent/state.py)."""

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


_stuck: dict[str, tuple[threading.Thread, float]] = {}  # single-flight key -> the call that has not returned
_stuck_lock = threading.Lock()


def call_with_timeout(fn: Callable[[], T], timeout: float, what: str, single_flight: bool = False) -> T:
    """Run fn in a daemon thread; a call stuck in a driver cannot hold the caller past timeout.
    single_flight: while an earlier call named `what` is still stuck, fail at once instead of starting
    another (a hung NVML would otherwise gain a thread every probe round)."""
    if single_flight:
        with _stuck_lock:
            previous = _stuck.get(what)
            if previous is not None and previous[0].is_alive():
                raise TimedOut(f"{what} has not returned from a call made {time.monotonic() - previous[1]:.0f} s ago; "
                               "not calling it again until it does")
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
        if single_flight:
            with _stuck_lock:
                _stuck[what] = (thread, time.monotonic() - timeout)
        raise TimedOut(f"{what} did not answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_until(tasks: dict[str, Callable[[], T]], deadline: float, workers: int = 32) -> dict[str, T | BaseException]:
    """Run the tasks on at most `workers` daemon threads until the monotonic `deadline`; returns what
    finished by then (a value or the exception raised), by name. Tasks still queued or running at the
    deadline are left out and abandoned: daemon threads never hold the process open past its budget."""
    queue = list(tasks.items())
    done: dict[str, T | BaseException] = {}
    lock = threading.Lock()
    all_done = threading.Event()

    def worker() -> None:
        while time.monotonic() < deadline:
            with lock:
                if not queue:
                    return
                name, task = queue.pop(0)
            try:
                value: T | BaseException = task()
            except Exception as error:  # handed back to the caller, who decides what it means
                value = error
            with lock:
                done[name] = value
                if len(done) == len(tasks):
                    all_done.set()

    if not tasks:
        return {}
    for index in range(min(workers, len(tasks))):
        threading.Thread(target=worker, name=f"nodecheck-task-{index}", daemon=True).start()
    all_done.wait(max(0.0, deadline - time.monotonic()))
    with lock:
        return dict(done)


_probe_clock = threading.local()


@contextlib.contextmanager
def probe_deadline(seconds: float):
    """Within this block (one probe's thread), every read of the host checks the probe's own deadline."""
    previous = getattr(_probe_clock, "deadline", None)
    _probe_clock.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _probe_clock.deadline = previous


def stop_at_deadline(what: str) -> None:
    """TimedOut when this thread's probe is past its deadline: a probe walking a hostile tree stops at its next
    read instead of running on, unseen, after its result was given up (a PCIe walk ran 16 s and was 'ok')."""
    deadline = getattr(_probe_clock, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TimedOut(f"stopped at its deadline, reading {what[:200]}")


def run_command(argv: list[str], timeout: float, env: dict[str, str] | None = None, what: str | None = None,
                ok_returncodes: tuple[int, ...] = (0,), max_output: int = MAX_COMMAND_OUTPUT,
                explain: Callable[[str], str | None] | None = None) -> str:
    """Run argv (never through a shell) with a hard timeout that kills its whole process group, and
    at most max_output bytes of stdout (and of stderr) kept: a command printing more is killed.
    `what` names the command in messages (default: the command line). A failure says the last line of
    stderr, or what `explain` picks from the whole of it (the line that names the cause)."""
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
    with _running_lock:
        _running.add(proc)
    try:
        out, err = _bounded_communicate(proc, timeout, max_output)
    except subprocess.TimeoutExpired as expired:
        _kill_group(proc)  # what it said before, where `explain` finds the cause there (PyTorch's watchdog line)
        said = explain((expired.stderr or b"").decode("utf-8", errors="replace")) if explain else None
        raise TimedOut(f"{what} did not finish within {timeout:g} s and was killed" + (f"; it had said: {said}" if said else "")) from None
    except OverflowError:
        _kill_group(proc)
        raise ProbeFailed(f"{what} printed more than {max_output >> 20} MiB and was killed") from None
    finally:
        with _running_lock:
            _running.discard(proc)
    stdout = out.decode("utf-8", errors="replace")
    if proc.returncode not in ok_returncodes:
        text = err.decode("utf-8", errors="replace").strip() or stdout.strip()
        detail = text.splitlines()
        reason = (explain(text) if explain else None) or (detail[-1][:200] if detail else "no output")
        raise ProbeFailed(f"{what} exited with {proc.returncode}: {reason}")
    return stdout


def _bounded_communicate(proc: subprocess.Popen, timeout: float, limit: int) -> tuple[bytes, bytes]:
    """proc.communicate() with a cap on what is kept: OverflowError past `limit` bytes on a pipe; TimeoutExpired past
    `timeout` carries what it had said by then (run_command's `explain` reads it)."""
    deadline = time.monotonic() + timeout
    buffers = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    try:
        with selectors.DefaultSelector() as selector:
            for pipe in buffers:
                selector.register(pipe, selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(proc.args, timeout)
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    buffers[key.fileobj] += chunk
                    if len(buffers[key.fileobj]) > limit:
                        raise OverflowError
        for pipe in buffers:
            pipe.close()
        proc.wait(max(0.01, deadline - time.monotonic()))  # its pipes closed, it may still run
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(proc.args, timeout, bytes(buffers[proc.stdout]), bytes(buffers[proc.stderr])) from None
    return bytes(buffers[proc.stdout]), bytes(buffers[proc.stderr])


_running: set[subprocess.Popen] = set()  # commands started by run_command that have not ended
_running_lock = threading.Lock()


def kill_running_commands() -> None:
    """End every command still running (each in its own process group), as a daemon stops: a hung
    nvidia-smi must not outlive the nodecheck that started it."""
    with _running_lock:
        procs = list(_running)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    from nodecheck.process_tree import kill_tree

    kill_tree(proc.pid)  # its group, and its children that left it with setsid()
    try:
        proc.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        pass  # stuck in the kernel (D state): leave it, never hang the caller


# ---- other nodes, for the prolog's proximity check ---------------------------------------------

CONNECT_ATTEMPTS = 3  # the fastest of these is the round trip: one slow SYN is noise, not distance


def resolve_name(name: str, port: int) -> str:
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise NodecheckError(f"{name} does not resolve ({error.strerror})") from None
    return infos[0][4][0]


def route_to(address: str, interface: str | None) -> tuple[str, str | None, list[str]]:
    """(interface, gateway, the interface's networks) the kernel would use to reach `address`; with
    `interface` given, that interface's networks (the route is still the kernel's, for the gateway)."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        try:
            route = ipr.route("get", dst=address)[0]
        except NetlinkError as error:
            raise NodecheckError(f"no route to {address} ({error})") from None
        gateway = route.get_attr("RTA_GATEWAY")
        if interface is not None:
            links = ipr.link_lookup(ifname=interface)
            if not links:
                raise NodecheckError(f"interface {interface} (config [proximity] interface) does not exist")
            index = links[0]
        else:
            index = route.get_attr("RTA_OIF")
            interface = ipr.get_links(index)[0].get_attr("IFLA_IFNAME")
        networks = [f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.get_addr(index=index)]
    return interface, gateway, networks


def connect_rtt_ms(address: str, port: int, timeout: float) -> float:
    """The fastest of a few TCP connects (SYN -> SYN-ACK or RST), in milliseconds."""
    best = None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    for _ in range(CONNECT_ATTEMPTS):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            started = time.perf_counter()
            try:
                sock.connect((address, port))
            except ConnectionRefusedError:
                pass  # the RST came back: a round trip all the same
            except socket.timeout:
                raise NodecheckError(f"no answer from {address}:{port} within {timeout:g} s") from None
            except OSError as error:
                raise NodecheckError(f"cannot reach {address}:{port} ({error.strerror or error})") from None
            elapsed = (time.perf_counter() - started) * 1000
        best = elapsed if best is None else min(best, elapsed)
    return round(best, 3)


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
        from nodecheck.state import boot_id, read_state, this_boot

        state = read_state()  # nodecheck's own file: never under root
        if self._memory:  # the state directory cannot be written: this process's memory of the boot fills in
            state = this_boot(state, self._memory["boot_id"])
            state = dict(state, **{k: v for k, v in self._memory.items() if not state.get(k)})
        return {"boot_id": boot_id(self.read_text), "state": state}

    def remember(self, sample, min_interval_s: float, log=None) -> str | None:
        """Into the state file; where it cannot be written (not root, no StateDirectory), in this process's
        memory, which serves a daemon's next round."""
        from nodecheck.state import boot_id, record_round, remember_round, this_boot

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
        from nodecheck.netif import interface_addresses

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
