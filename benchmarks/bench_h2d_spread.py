"""On a GPU node: how much h2d/d2h vary between runs, to tell a slow link from a slow sample.
(1) nodecheck's --quick copy worker in N fresh processes; (2) in one process, N pinned 256 MiB buffers
allocated one after another, each timed (CUDA events, 5 copies after 2). A spread across fresh
allocations but not within one points at where the pinned pages landed (host NUMA), not the link.
Run: .venv/bin/python benchmarks/bench_h2d_spread.py [--runs 8] [--device 0]"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SIZE = 256 << 20


def fresh_processes(device: int, runs: int) -> list[tuple[float, float]]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            argv = [sys.executable, "-m", "nodecheck.bench.gpu_worker", "copy", "--device", str(device), "--sizes", str(SIZE),
                    "--out", f"{tmp}/{i}.json"]
            subprocess.run(argv, check=True, timeout=120, capture_output=True)
            row = json.loads(Path(f"{tmp}/{i}.json").read_text())["gpus"][0]["rows"][0]
            out.append((row["h2d"], row["d2h"]))
    return out


def fresh_buffers(device: int, runs: int) -> list[tuple[float, float]]:
    import torch

    out = []
    with torch.cuda.device(device):
        dev = torch.empty(SIZE, dtype=torch.uint8, device=f"cuda:{device}")
        keep = []  # every buffer stays allocated: the next one gets other pages
        for _ in range(runs):
            host = torch.empty(SIZE, dtype=torch.uint8, pin_memory=True)
            keep.append(host)
            rates = []
            for dst, src in ((dev, host), (host, dev)):
                for _ in range(2):
                    dst.copy_(src, non_blocking=True)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(5):
                    dst.copy_(src, non_blocking=True)
                end.record()
                end.synchronize()
                rates.append(5 * SIZE / (start.elapsed_time(end) / 1e3))
            out.append((rates[0], rates[1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    for name, rows in (("fresh processes (nodecheck worker)", fresh_processes(args.device, args.runs)),
                       ("fresh pinned buffers, one process", fresh_buffers(args.device, args.runs))):
        h2d = [r[0] / 1e9 for r in rows]
        d2h = [r[1] / 1e9 for r in rows]
        print(f"{name}: h2d GB/s {' '.join(f'{x:.1f}' for x in h2d)} (min {min(h2d):.1f} max {max(h2d):.1f}); "
              f"d2h GB/s {' '.join(f'{x:.1f}' for x in d2h)} (min {min(d2h):.1f} max {max(d2h):.1f})")


if __name__ == "__main__":
    main()
