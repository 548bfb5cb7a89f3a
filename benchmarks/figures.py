"""What the GPU-node scripts share (benchmarks/multi_gpu_node.py, benchmarks/one_gpu_node.py): a figure beside its
reference with a verdict (a Row), the table they print, and each step run under a timeout with its output
kept in the run's folder, so that `--replay DIR` can judge again from what a run (or a paste) left there."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MAX_READ = 16 * 1024 * 1024
MISSES = ("LOW", "HIGH", "FAILED", "MISMATCH")  # a verdict's first word that fails the run


@dataclass
class Row:
    figure: str
    value: str
    reference: str
    ratio: float | None
    goal: str
    verdict: str  # ok, LOW, HIGH, FAILED, n/a (why)


def measurements(report_json: dict) -> list[dict]:
    found = report_json.get("measurements") if isinstance(report_json, dict) else None
    return [m for m in found or [] if isinstance(m, dict)]


def gbps(measurement: dict | None) -> float | None:
    """A measurement's figure in GB/s; None when it is absent, failed or has no figure."""
    if not measurement or not measurement.get("ok") or not measurement.get("bytes_per_second"):
        return None
    return measurement["bytes_per_second"] / 1e9


def judge(figure: str, value: float | None, reference: float | None, goal: tuple[float, float], unit: str = "GB/s",
          missing: str = "") -> Row:
    shown = f"{value:.2f} {unit}" if value is not None else "-"
    ref = f"{reference:.2f} {unit}" if reference is not None else "-"
    if value is None or not reference:
        return Row(figure, shown, ref, None, f"{goal[0]:.2f}-{goal[1]:.2f}", f"n/a ({missing or 'no figure'})")
    ratio = value / reference
    verdict = "ok" if goal[0] <= ratio <= goal[1] else "LOW" if ratio < goal[0] else "HIGH"
    return Row(figure, shown, ref, ratio, f"{goal[0]:.2f}-{goal[1]:.2f}", verdict)


def wall_time_row(figure: str, step: dict, goal_s: float) -> Row:
    """A timed step's wall time against its goal: ok or HIGH when the command succeeded, FAILED when it did not."""
    ok = step.get("rc") == 0
    verdict = ("ok" if step["wall_s"] <= goal_s else "HIGH") if ok else f"FAILED (exit {step.get('rc')})"
    return Row(figure, f"{step['wall_s']:.1f} s", "-", None, f"<= {goal_s:g} s", verdict)


def read_text(path: Path) -> str | None:
    """A file of the run's folder; None when absent or unreadable (its row says n/a). ValueError, which a replay
    names (judge_folder), for what no run writes: a FIFO or device in its place (an open would wait forever for a
    writer) or a file past MAX_READ (cut short, it would give a figure from part of the output)."""
    from nodecheck.host.files import read_regular

    try:
        data = read_regular(path, MAX_READ)
    except OSError as error:
        if error.errno == errno.EINVAL:  # read_regular: not a regular file
            raise ValueError(f"{path.name}: not a regular file") from None
        return None
    if len(data) > MAX_READ:
        raise ValueError(f"{path.name}: larger than {MAX_READ >> 20} MiB")
    return data.decode("utf-8", "replace")


def read_json(path: Path) -> dict:
    text = read_text(path)
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def render(rows: list[Row], value_width: int = 22) -> str:
    """One line per figure; a value or reference wider than its column is cut there and written whole on the
    next line, so that no figure pasted from the output is a truncated one."""
    w = value_width
    lines = [f"{'figure':<48} {'value':>{w}} {'reference':>{w}} {'ratio':>6}  {'goal':<15} verdict"]
    for r in rows:
        ratio = f"{r.ratio:.3f}" if r.ratio is not None else "-"
        value, reference = (text if len(text) <= w else text[:w - 1] + "~" for text in (r.value, r.reference))
        lines.append(f"{r.figure[:48]:<48} {value:>{w}} {reference:>{w}} {ratio:>6}  {r.goal:<15} {r.verdict}")
        lines += [f"    {name}: {text}" for name, text in (("value", r.value), ("reference", r.reference)) if len(text) > w]
    return "\n".join(lines)


def run_step(folder: Path, steps: dict, name: str, argv: list[str], timeout: float, out: str | None = None,
             env: dict | None = None) -> None:
    """Run argv (never a shell) under a timeout; its stdout goes to DIR/out, its status and wall time to steps."""
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, env={**os.environ, **(env or {})}, check=False)
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except FileNotFoundError as error:
        rc, stdout, stderr = 127, b"", str(error).encode()
    except subprocess.TimeoutExpired as expired:
        rc, stdout, stderr = 124, expired.stdout or b"", f"timed out after {timeout:g} s".encode()
    steps[name] = {"argv": argv, "rc": rc, "wall_s": round(time.monotonic() - started, 3), "stderr": stderr.decode("utf-8", "replace")[-2000:]}
    if out:
        (folder / out).write_bytes(stdout)
    (folder / "steps.json").write_text(json.dumps(steps, indent=1))
    print(f"  {name}: exit {rc}, {steps[name]['wall_s']:.1f} s", file=sys.stderr, flush=True)


def exit_status(rows: list[Row]) -> int:
    """1 when a figure misses its goal, else 2 when a figure could not be made, else 0."""
    if any(r.verdict.split()[0] in MISSES for r in rows):
        return 1
    return 2 if any(r.verdict.startswith("n/a") for r in rows) else 0


def judge_folder(compare, folder: Path) -> list[Row] | None:
    """compare(folder), or None after saying why when what the folder holds is not the shape a run writes (a
    hand-edited paste): a replay names the problem, never a traceback."""
    try:
        return compare(folder)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as error:
        print(f"cannot judge {folder}: {type(error).__name__}: {str(error)[:200]} (not what a run writes there)", file=sys.stderr)
        return None
