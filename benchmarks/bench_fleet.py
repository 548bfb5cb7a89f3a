"""`nodecheck fleet DIR` at fleet size: 10,000 Reports (variants of the HGX H100 example snapshot's Report: each
node its own name, an in-node all-reduce around 0.95 of spec, a few out of line, a few on another driver),
judged by the real command in a subprocess; its wall time and peak memory beside the reference, the same
files read and parsed as JSON by Python alone. Run: .venv/bin/python benchmarks/bench_fleet.py [--nodes 10000]"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    entry = str(Path(sys.executable).parent / "nodecheck")
    base = json.loads(subprocess.run([entry, "inspect", "--json", "--from", str(REPO / "examples/hgx-h100-8gpu")],
                                     capture_output=True, text=True, timeout=120, check=True).stdout)
    rng = random.Random(7)
    measurement = {"path": "allreduce:node-8-gpus", "test": "allreduce", "ok": True, "spec_bytes_per_second": 400e9,
                   "payload_bytes": 1 << 30, "method": "nccl", "direction": "busbw", "details": {"path_kind": "nvlink"}}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        for n in range(args.nodes):
            ratio = 0.80 if n % 997 == 0 else rng.gauss(0.95, 0.01)
            node = dict(base["node"], hostname=f"gpu-{n:05d}",
                        driver_version="550.54.15" if n % 1999 == 0 else base["node"]["driver_version"])
            report = dict(base, node=node, measurements=[dict(measurement, ratio=ratio, bytes_per_second=ratio * 400e9)])
            (directory / f"gpu-{n:05d}.json").write_text(json.dumps(report, separators=(",", ":")))
        written = time.perf_counter() - started
        size = sum(p.stat().st_size for p in directory.iterdir()) / 2**20
        print(f"{args.nodes} Reports, {size:.0f} MiB, written in {written:.1f} s")

        started = time.perf_counter()
        reference = subprocess.run([sys.executable, "-c", "import json, pathlib, sys\n"
                                    "for p in sorted(pathlib.Path(sys.argv[1]).glob('*.json')): json.loads(p.read_bytes())",
                                    str(directory)], timeout=3600, check=True)
        reference_s, reference_mib = time.perf_counter() - started, child_peak_mib()
        started = time.perf_counter()
        fleet = subprocess.run([entry, "fleet", str(directory), "--json"], capture_output=True, text=True, timeout=3600)
        fleet_s, fleet_mib = time.perf_counter() - started, child_peak_mib()
        document = json.loads(fleet.stdout)
        print(f"{'':32} {'wall s':>8} {'peak RSS MiB':>13}")
        print(f"{'reference: read + json.loads':32} {reference_s:8.1f} {reference_mib:13.0f}")
        print(f"{'nodecheck fleet DIR --json':32} {fleet_s:8.1f} {fleet_mib:13.0f}  (exit {fleet.returncode}, "
              f"{len(document['out_of_line'])} out of line, {len(document['skipped'])} skipped)")
        print("peak RSS is the largest of the children so far (getrusage): the fleet figure is the larger of the two")
        assert reference.returncode == 0


if __name__ == "__main__":
    main()
