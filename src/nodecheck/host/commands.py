"""Commands and calls with deadlines: an argv run with a timeout and bounded output, its process group killed
at the deadline; a call that may hang (NVML, a name lookup) run in a thread the caller stops waiting for; a set of
tasks run in parallel until one deadline; the probe deadline that file reads check."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from typing import Callable, TypeVar

from nodecheck.core.errors import NoData, ProbeFailed, TimedOut
from nodecheck.core.limits import MAX_COMMAND_OUTPUT

T = TypeVar("T")

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
        # started and registered under the lock: a command that has started (and may already have done something
        # visible) is one kill_running_commands sees, never one it misses between Popen and the registration
        with _running_lock:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, start_new_session=True,
            )
            _running.add(proc)
    except FileNotFoundError:
        raise NoData(f"{argv[0]} not found on PATH") from None
    except OSError as error:
        raise ProbeFailed(f"cannot run {argv[0]}: {error}") from None
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
    from nodecheck.host.process_tree import kill_tree

    kill_tree(proc.pid)  # its group, and its children that left it with setsid()
    try:
        proc.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        pass  # stuck in the kernel (D state): leave it, never hang the caller
