"""How long each text parser takes on hostile input (a megabyte line, a keyword then a megabyte run, many lines of
distinct names), beside the target (under 1 s each).

    .venv/bin/python benchmarks/bench_parsers.py

The lines are tests/hostile_lines.py's: each parser's own keywords repeated, the shapes that make a
backtracking regular expression quadratic. The suite only checks that each parser returns
(tests/system/test_linear_parsers.py); the figures are here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hostile_lines import names, run_all  # noqa: E402

TARGET_S = 1.0


def main() -> int:
    worst = 0.0
    print(f"{'parser':<22} {'input':<34} {'seconds':>8}  target")
    for name in names():
        for unit, seconds in run_all(name):
            worst = max(worst, seconds)
            print(f"{name:<22} {unit[:40]:<40} {seconds:8.3f}  < {TARGET_S:g} s {'ok' if seconds < TARGET_S else 'SLOW'}")
    print(f"slowest: {worst:.3f} s (target {TARGET_S:g} s)")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
