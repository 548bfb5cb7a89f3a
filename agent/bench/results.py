"""How a bench worker process hands back its result, or its own error.

A worker that fails writes {"error": {"type", "message"}} to its --out file: the runner reports that
exception, not the last line of stderr (which is often a hint torch prints after the real error, such
as "compile with TORCH_USE_CUDA_DSA", or a destroy_process_group() warning)."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Callable

from nodecheck.errors import NodecheckError
from nodecheck.host import run_command

MAX_MESSAGE = 2000


def guarded(out: str, work: Callable[[], dict]) -> int:
    """In a worker: run `work`, write its result (exit 0) or its exception (exit 1) to `out`."""
    try:
        result = work()
    except BaseException as error:  # whatever it was, the runner is told its type and message
        traceback.print_exc(file=sys.stderr)
        Path(out).write_text(json.dumps({"error": {"type": type(error).__name__, "message": str(error)[:MAX_MESSAGE]}}))
        return 1
    Path(out).write_text(json.dumps(result))
    return 0


def own_error(out: Path) -> str | None:
    """The worker's own exception from its --out file, as 'Type: message', or None."""
    try:
        error = json.loads(out.read_text()).get("error")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(error, dict):
        return None
    return f"{error.get('type', 'Error')}: {str(error.get('message', '')).strip() or '(no message)'}"


def run_worker(argv: list[str], out: Path, timeout: float, env: dict[str, str] | None = None, what: str = "the worker") -> dict:
    """Run a worker that writes to `out`; its result, or NodecheckError naming its own exception when it
    wrote one (else what run_command saw: the exit status and the last line of stderr, a time-out)."""
    try:
        run_command(argv, timeout, env=env, what=what)
    except NodecheckError as error:
        raise NodecheckError(own_error(out) or str(error)) from None
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError) as error:
        raise NodecheckError(f"{what} left no readable result: {error}") from None
    if not isinstance(result, dict) or "error" in result:
        raise NodecheckError(own_error(out) or f"{what} left an unexpected result")
    return result
