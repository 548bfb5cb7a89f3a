"""A bench worker dies with the nodecheck that started it, and takes its temporary directory along.

Workers run in a session of their own (run_command kills a timed-out worker's whole group), so when the
prolog's budget or `serve --bench-timeout` kills the bench itself, nothing reaches them: they kept
running (seen with gloo) and on a GPU node would hold GPU memory inside the user's job. The runner
names itself and its temporary directory in the worker's environment; the worker's first act is to
start a watchdog thread that, once that parent is gone or the worker's own deadline has passed,
removes the directory and kills the worker's process group. A thread rather than PR_SET_PDEATHSIG:
the signal would kill the worker before it could remove the directory, and the runner's waiting
thread (serve's bench thread) is the one the kernel would watch. torch and NCCL release the GIL
while they wait, so the thread runs beside a hung collective.

A program with no lifeline of its own (nccl-tests' all_reduce_perf) runs under this module's main:
`python -m nodecheck.bench.lifeline PROGRAM ARGS...` holds the runner's lifeline and starts the program in
its own process group (the one run_command made for it), which the watchdog kills.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PARENT = "NODECHECK_PARENT_PID"
DEADLINE = "NODECHECK_WORKER_DEADLINE"  # seconds since the epoch
TEMPORARY = "NODECHECK_WORKER_TMP"
POLL_S = 0.2
GRACE_S = 10.0  # past the runner's own time limit: the runner kills first when it is alive to


def environment(out: Path | None, timeout: float) -> dict[str, str]:
    """What a runner adds to a worker's environment: itself, the worker's deadline, and the directory
    to remove (the --out file's, when it is one of nodecheck's temporary directories)."""
    env = {PARENT: str(os.getpid()), DEADLINE: f"{time.time() + timeout + GRACE_S:.3f}"}
    folder = out.parent.resolve() if out is not None else None
    if folder and folder.name.startswith("nodecheck-") and folder.parent == Path(tempfile.gettempdir()).resolve():
        env[TEMPORARY] = str(folder)
    return env


def runner_deadline(environ: dict[str, str] | None = None) -> float | None:
    """In a worker: when (seconds since the epoch) its runner kills it, or None when no runner said."""
    try:
        return float((os.environ if environ is None else environ)[DEADLINE]) - GRACE_S
    except (KeyError, ValueError):
        return None


def hold(environ: dict[str, str] | None = None) -> threading.Thread | None:
    """In a worker, first thing: watch the parent named in the environment (None when not started by a runner)."""
    environ = os.environ if environ is None else environ
    try:
        parent = int(environ[PARENT])
        deadline = float(environ.get(DEADLINE, "inf"))
    except (KeyError, ValueError):
        return None
    folder = environ.get(TEMPORARY)
    if os.getppid() != parent:  # the runner died while this process was starting
        _end(folder)
    watchdog = threading.Thread(target=_watch, args=(parent, deadline, folder), name="nodecheck-lifeline", daemon=True)
    watchdog.start()
    return watchdog


def _watch(parent: int, deadline: float, folder: str | None) -> None:
    while os.getppid() == parent and time.time() < deadline:
        time.sleep(POLL_S)
    _end(folder)


def _end(folder: str | None) -> None:
    if folder and Path(folder).name.startswith("nodecheck-"):
        shutil.rmtree(folder, ignore_errors=True)
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the worker is its group's leader (its own session)
    finally:
        os._exit(137)


def main(argv: list[str] | None = None) -> int:
    """Run a program under the runner's lifeline: it shares this process's group (a session of its own, as
    run_command starts it), so the watchdog's kill takes it along. Its output is its own; its exit status
    is this one's (128 + N for a signal)."""
    hold()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m nodecheck.bench.lifeline PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    try:
        child = subprocess.Popen(argv)
    except OSError as error:
        print(f"{argv[0]}: {error.strerror or error}", file=sys.stderr)
        return 127 if isinstance(error, FileNotFoundError) else 126
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
