"""Wall time of `nodecheck inspect` on this machine and of `inspect --from` an 8-GPU, 8-NIC snapshot
(the HGX H100 capture with NVML values for 8 GPUs), median of N runs, each beside its reference: a bare
`python -c pass` of the same interpreter, timed in the same run (goal: `inspect --json` <= 6x). Also checks
that torch is never imported on that path. With --against REV, the same cases of nodecheck as it was at git
revision REV, run from a copy of that tree by the same interpreter in the same run: the reference a change's
cost is read against (issue 23: inspect within 0.05 s of its time before the error signals).
Run: .venv/bin/python benchmarks/bench_inspect.py [--runs 10] [--against 6b0556c]"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


# bytecode written once and then used, as an installed package's is: with PYTHONDONTWRITEBYTECODE set (some
# sandboxes set it) every run compiled every module, and a larger tree looked slower by its compile time
BYTECODE_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall(argv: list[str], runs: int, env: dict | None = BYTECODE_ENV) -> list[float]:
    """Seconds from start to exit of each run. A blocking wait, with a timer to kill a run past 60 s:
    subprocess.run(timeout=...) polls with sleeps of up to 50 ms, which rounded every figure up to them."""
    import threading

    times = []
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        killer = threading.Timer(60, proc.kill)
        killer.start()
        proc.wait()
        times.append(time.perf_counter() - started)
        killer.cancel()
    return times


def tree_at(revision: str | None, into: Path) -> Path:
    """nodecheck's package as it was at `revision` (None: this working tree), laid out as it installs: both
    sides of the comparison import the same way. A revision from before src/nodecheck had its three folders
    mapped by pyproject's package-dir."""
    import io
    import shutil
    import tarfile

    if revision is None:
        shutil.copytree(REPO / "src/nodecheck", into / "nodecheck", ignore=shutil.ignore_patterns("__pycache__"))
        return into
    src_layout = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", revision, "src/nodecheck"],
                                capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    parts = ["src/nodecheck"] if src_layout else ["agent", "probes", "exporters"]
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, *parts],
                             capture_output=True, timeout=60, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into / "src", filter="data")
    package = into / "nodecheck"
    if src_layout:
        (into / "src/src/nodecheck").rename(package)
        return into
    (into / "src/agent").rename(package)
    (into / "src/probes").rename(package / "probes")
    (into / "src/exporters").rename(package / "exporters")
    return into


def imports_torch(argv: list[str]) -> bool:
    env = {"PYTHONPROFILEIMPORTTIME": "1", **{k: v for k, v in os.environ.items() if k == "STATE_DIRECTORY"}}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    return any(line.split("|")[-1].strip().split(".")[0] == "torch" for line in result.stderr.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--against", help="a git revision to time beside this tree")
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
        framework = statistics.median(wall([sys.executable, "-c", "import typer"], args.runs))
        print(f"reference: `python -c 'import typer'` {framework:.3f} s = {framework / bare:.1f}x bare: the floor of "
              "any command line built on it")
        print(f"{'case':45} {'median':>8} {'min':>8} {'max':>8} {'x bare':>7}  (s, {args.runs} runs)  torch imported")
        for name, argv in cases.items():
            times = wall(argv, args.runs)
            print(f"{name:45} {statistics.median(times):8.3f} {min(times):8.3f} {max(times):8.3f} "
                  f"{statistics.median(times) / bare:7.1f}  {'YES' if imports_torch(argv) else 'no'}")
        if args.against:
            _against(args.against, cases, entry, args.runs, Path(tmp))


def _against(revision: str, cases: dict, entry: str, runs: int, tmp: Path) -> None:
    """Each case now and at `revision`, alternating run by run so both see the same machine load."""
    old, new = tree_at(revision, tmp / "old"), tree_at(None, tmp / "new")
    print(f"\nthis tree vs {revision} (median of {runs} alternating runs each; both copied out and run by {sys.executable})")
    print(f"{'case':45} {'now':>8} {revision[:10]:>10} {'difference':>11}")
    for name, argv in cases.items():
        module = [sys.executable, "-m", "nodecheck", *argv[1:]]
        env_old, env_new = dict(BYTECODE_ENV, PYTHONPATH=str(old)), dict(BYTECODE_ENV, PYTHONPATH=str(new))
        wall(module, 1, env_old), wall(module, 1, env_new)  # each tree compiles its bytecode once
        now, before = [], []
        for _ in range(runs):
            now += wall(module, 1, env_new)
            before += wall(module, 1, env_old)
        a, b = statistics.median(now), statistics.median(before)
        print(f"{name:45} {a:8.3f} {b:10.3f} {a - b:+10.3f} s")


if __name__ == "__main__":
    main()
