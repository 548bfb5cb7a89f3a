"""Issue 21 (1): no line freezes the agent. Every text parser reads a hostile one-megabyte line (its own
keywords repeated) and returns. Each parser runs in its own process with a hard limit: a quadratic
pattern holds the interpreter lock and no deadline inside the process could stop it (210 KB of LnkSta
took 49.5 s; a megabyte would take hours). The limit is a hang detector, generous for a loaded CI
machine; the figures (each well under a second) are benchmarks/bench_parsers.py's to print."""

import json
import subprocess
import sys

import pytest
from helpers import REPO
from hostile_lines import names

LIMIT_S = 300  # all of one parser's inputs; linear parsers take seconds in all (NCCL: 20 s of 69), quadratic ones hours


@pytest.mark.parametrize("parser", names())
def test_a_megabyte_line_is_read_not_stuck_on(parser):
    code = ("import json, sys; sys.path.insert(0, 'tests'); from hostile_lines import run_all; "
            f"print(json.dumps(run_all({parser!r})))")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=LIMIT_S)
    assert run.returncode == 0, run.stderr
    assert len(json.loads(run.stdout)) >= 2  # every line was read
