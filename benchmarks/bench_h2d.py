"""On a GPU node: nodecheck's host<->device test against a plain reference in the same run
(a PyTorch pinned 1 GiB copy timed with CUDA events, as in ../shared/captures/h100-pcie-vm), the
payload-size table, and the wall time of each direction. Goal: nodecheck >= 0.98x the reference,
each direction <= 1 s. Where nvcc is installed, a second reference without PyTorch
(benchmarks/h2d_reference.cu: cudaMemcpyAsync timed with CUDA events) runs in the same run.
Run: .venv/bin/python benchmarks/bench_h2d.py [--device 0]"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GiB = 1 << 30


def reference(device: int) -> dict[str, float]:
    import torch

    # events and copies on device N's current stream: without this the events would time device 0's
    with torch.cuda.device(device):
        host = torch.empty(GiB, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(GiB, dtype=torch.uint8, device=f"cuda:{device}")
        out = {}
        for name, (dst, src) in {"h2d": (dev, host), "d2h": (host, dev)}.items():
            for _ in range(3):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            out[name] = 10 * GiB / (start.elapsed_time(end) / 1e3)
    return out


def cuda_reference(device: int) -> dict[str, float] | None:
    """benchmarks/h2d_reference.cu built with nvcc and run; None without nvcc."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        binary = f"{tmp}/h2d_reference"
        subprocess.run([nvcc, "-O2", "-o", binary, str(Path(__file__).with_name("h2d_reference.cu"))], check=True, timeout=300)
        out = subprocess.run([binary, str(device)], check=True, timeout=120, capture_output=True, text=True).stdout
    return {name: float(value) * 1e9 for name, value in (line.split() for line in out.splitlines())}


def nodecheck_copy(device: int, sizes: list[int], pageable: bool) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "nodecheck.bench.gpu_worker", "copy", "--device", str(device),
                "--sizes", ",".join(map(str, sizes)), "--out", f"{tmp}/r.json"] + (["--pageable"] if pageable else [])
        started = time.perf_counter()
        subprocess.run(argv, check=True, timeout=300)
        return json.loads(Path(f"{tmp}/r.json").read_text()), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    ref = reference(args.device)
    cuda_ref = cuda_reference(args.device)
    quick, quick_wall = nodecheck_copy(args.device, [256 << 20], pageable=False)
    sweep, _ = nodecheck_copy(args.device, [1 << 20, 16 << 20, 256 << 20, GiB], pageable=True)
    print(f"reference (pinned 1 GiB, events, 10 copies after 3): h2d {ref['h2d'] / 1e9:.1f} GB/s  d2h {ref['d2h'] / 1e9:.1f} GB/s")
    if cuda_ref:
        print(f"reference without torch (h2d_reference.cu, cudaMemcpyAsync 1 GiB): h2d {cuda_ref['h2d'] / 1e9:.1f} GB/s  "
              f"d2h {cuda_ref['d2h'] / 1e9:.1f} GB/s")
    row = quick["gpus"][0]["rows"][0]
    for d in ("h2d", "d2h"):
        print(f"nodecheck --quick {d}: {row[d] / 1e9:.1f} GB/s = {row[d] / ref[d]:.3f} x reference"
              + (f", {row[d] / cuda_ref[d]:.3f} x the CUDA reference" if cuda_ref else ""))
    print(f"nodecheck --quick worker wall time, both directions incl. torch import and CUDA init: {quick_wall:.2f} s")
    print(f"\n{'size':>10} {'memory':>9} {'h2d GB/s':>9} {'d2h GB/s':>9}")
    for r in sweep["gpus"][0]["rows"]:
        print(f"{r['size_bytes'] >> 20:>7} MiB {r['memory']:>9} {r['h2d'] / 1e9:9.1f} {r['d2h'] / 1e9:9.1f}")


if __name__ == "__main__":
    main()
