"""Wall time of `nodecheck prolog` without bandwidth tests on this machine (goal: median of 10 <= 2 s),
started as slurmd starts a prolog: a bare environment (SLURMD_NODENAME, the job's node list, no PATH).
Cases: passing checks, and failing checks (a config expecting GPUs this node lacks; --dry-run, so
no scontrol). Run: .venv/bin/python benchmarks/bench_prolog.py [--runs 10]"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(argv: list[str], env: dict[str, str], runs: int) -> tuple[list[float], int]:
    times, code = [], None
    for _ in range(runs):
        started = time.perf_counter()
        code = subprocess.run(argv, env=env, capture_output=True, timeout=120).returncode
        times.append(time.perf_counter() - started)
    return times, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    entry = str(Path(sys.executable).parent / "nodecheck")
    name = socket.gethostname().split(".")[0]
    with tempfile.TemporaryDirectory() as tmp:
        # the state file goes to a folder of the run's own: on a node the prolog keeps it in /var/lib/nodecheck, but
        # a benchmark run on a workstation must not leave that folder behind
        env = {"SLURMD_NODENAME": name, "SLURM_NODELIST": name, "SLURM_JOB_ID": "1", "SLURM_JOB_PARTITION": "debug",
               "STATE_DIRECTORY": str(Path(tmp) / "state")}
        passing, failing = Path(tmp) / "passing.toml", Path(tmp) / "failing.toml"
        passing.write_text("[prolog]\ntimeout_s = 30\n")
        failing.write_text("[prolog]\ntimeout_s = 30\n[gpus]\ncount = 8\n")
        cases = {"prolog --dry-run, checks pass": [entry, "prolog", "--dry-run", "--config", str(passing)],
                 "prolog --dry-run, checks fail (would drain)": [entry, "prolog", "--dry-run", "--config", str(failing)]}
        print(f"{'case':45} {'median':>8} {'min':>8} {'max':>8}  exit  ({args.runs} runs, s)")
        for label, argv in cases.items():
            times, code = wall(argv, env, args.runs)
            print(f"{label:45} {statistics.median(times):8.3f} {min(times):8.3f} {max(times):8.3f}  {code}")


if __name__ == "__main__":
    main()
