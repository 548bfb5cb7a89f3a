"""Wall time of `nodecheck inspect` on this machine and of `inspect --from` an 8-GPU, 8-NIC snapshot
(the HGX H100 capture with NVML values for 8 GPUs), median of N runs, each beside its reference: a bare
`python -c pass` of the same interpreter, timed in the same run (goal: `inspect --json` <= 6x). Also checks
that torch is never imported on that path. Run: .venv/bin/python benchmarks/bench_inspect.py [--runs 10]"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def wall(argv: list[str], runs: int) -> list[float]:
    """Seconds from start to exit of each run. A blocking wait, with a timer to kill a run past 60 s:
    subprocess.run(timeout=...) polls with sleeps of up to 50 ms, which rounded every figure up to them."""
    import threading

    times = []
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        killer = threading.Timer(60, proc.kill)
        killer.start()
        proc.wait()
        times.append(time.perf_counter() - started)
        killer.cancel()
    return times


def imports_torch(argv: list[str]) -> bool:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"PYTHONPROFILEIMPORTTIME": "1"})
    return any(line.split("|")[-1].strip().split(".")[0] == "torch" for line in result.stderr.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    from helpers import hgx_nvml, make_snapshot  # the same snapshot the tests use

    entry = str(Path(sys.executable).parent / "nodecheck")
    with tempfile.TemporaryDirectory() as tmp:
        snap = make_snapshot(Path(tmp) / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
        cases = {
            "inspect (live, this machine)": [entry, "inspect"],
            "inspect --json (live)": [entry, "inspect", "--json"],
            "inspect --from 8-GPU 8-NIC snapshot": [entry, "inspect", "--from", str(snap)],
            "inspect --json --from 8-GPU 8-NIC snapshot": [entry, "inspect", "--json", "--from", str(snap)],
        }
        wall(cases["inspect (live, this machine)"], 2)  # warm the page cache
        bare = statistics.median(wall([sys.executable, "-c", "pass"], args.runs))
        print(f"reference: bare `python -c pass` {bare:.3f} s (median of {args.runs})")
        print(f"{'case':45} {'median':>8} {'min':>8} {'max':>8} {'x bare':>7}  (s, {args.runs} runs)  torch imported")
        for name, argv in cases.items():
            times = wall(argv, args.runs)
            print(f"{name:45} {statistics.median(times):8.3f} {min(times):8.3f} {max(times):8.3f} "
                  f"{statistics.median(times) / bare:7.1f}  {'YES' if imports_torch(argv) else 'no'}")


if __name__ == "__main__":
    main()
