"""How a bench worker process hands back its result, or its own error.

A worker that fails writes {"error": {"type", "message"}} to its --out file: the runner reports that
exception, not the last line of stderr (which is often a hint torch prints after the real error, such
as "compile with TORCH_USE_CUDA_DSA", or a destroy_process_group() warning)."""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Callable

from nodecheck.bench.heartbeat import where_it_was
from nodecheck.core import typed_json
from nodecheck.core.errors import NodecheckError
from nodecheck.host.commands import run_command

MAX_MESSAGE = 2000
# Lines torch appends to every CUDA error (seen on an H100 node: "CUDA error: invalid device ordinal"
# followed by these three): advice to the developer of the program, not news about the node.
TORCH_HINTS = ("CUDA kernel errors might be asynchronously reported", "For debugging consider passing CUDA_LAUNCH_BLOCKING",
               "Compile with `TORCH_USE_CUDA_DSA`", "Search for `cudaErrorInvalidDeviceOrdinal'")


# torch's wording of an NCCL failure: where in torch, then NCCL's code, then NCCL's own "Last error"
NCCL_FAILURE = re.compile(r"NCCL version (?P<version>[\d.]+).*?(?P<code>nccl[A-Z]\w*):.*?Last error:\s*(?P<last>\S.*)", re.S)


def essential(message: str) -> str:
    """The error on one line without torch's developer hints ("CUDA error: invalid device ordinal;
    GPU device may be out of range, do you have enough GPUs?"); for an NCCL failure, NCCL's own last
    error first ("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60 (ncclInvalidUsage,
    NCCL 2.28.9)"), not torch's source file."""
    nccl = NCCL_FAILURE.search(message)
    if nccl:
        return f"{' '.join(nccl['last'].split())} ({nccl['code']}, NCCL {nccl['version']})"
    lines = [line.strip() for line in message.splitlines()]
    return "; ".join(line for line in lines if line and not line.startswith(TORCH_HINTS))


# PyTorch's NCCL watchdog, when a collective outlives its timeout, logs this line and then aborts the process
# (SIGABRT): stderr ends in the C++ stack ("frame #6: clone + 0x44 ..."), which names nothing.
WATCHDOG = re.compile(r"\[Rank \d+\] Watchdog caught collective operation timeout[^\n]*")


def cause_in_stderr(text: str) -> str | None:
    """The line of a dead worker's stderr that names why it died (PyTorch's watchdog), else None."""
    found = WATCHDOG.search(text)
    if found is None:
        return None
    return found[0].strip()[:400] + " (the collective hung: a rank stopped or a link stalled; PyTorch's watchdog aborted it)"


def guarded(out: str, work: Callable[[], dict]) -> int:
    """In a worker: run `work`, write its result (exit 0) or its exception (exit 1) to `out`."""
    try:
        result = work()
    except BaseException as error:  # whatever it was, the runner is told its type and message
        traceback.print_exc(file=sys.stderr)
        Path(out).write_text(json.dumps({"error": {"type": type(error).__name__, "message": essential(str(error))[:MAX_MESSAGE]}}))
        return 1
    Path(out).write_text(json.dumps(result))
    return 0


def own_error(out: Path) -> str | None:
    """The worker's own exception from its --out file, as 'Type: message', or None."""
    try:
        error = typed_json.loads(out.read_text()).get("error")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(error, dict):
        return None
    return f"{error.get('type', 'Error')}: {str(error.get('message', '')).strip() or '(no message)'}"


def run_worker(argv: list[str], out: Path, timeout: float, env: dict[str, str] | None = None, what: str = "the worker") -> dict:
    """Run a worker that writes to `out`; its result, or NodecheckError naming its own exception when it
    wrote one (else what run_command saw: the exit status and the last line of stderr, a time-out)."""
    from nodecheck.bench.lifeline import environment

    try:
        run_command(argv, timeout, env=dict(os.environ if env is None else env, **environment(out, timeout)), what=what,
                    explain=cause_in_stderr)
    except NodecheckError as error:
        own = own_error(out)
        where = where_it_was(out, killed=own is None)  # an all-reduce rank's last step, and who stopped beating
        raise NodecheckError("; ".join(part for part in (own or str(error), where) if part)) from None
    try:
        result = typed_json.loads(out.read_text())
    except (OSError, ValueError) as error:
        raise NodecheckError(f"{what} left no readable result: {error}") from None
    if not isinstance(result, dict) or "error" in result:
        raise NodecheckError(own_error(out) or f"{what} left an unexpected result")
    return result
