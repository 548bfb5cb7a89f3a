"""On a GPU node: `nodecheck bench --tests hbm,gemm` beside plain references timed in the same run, each GPU's figure
against its model's spec (goal 0.98-1.02 of each reference), and what the silent-data-corruption check costs.
References: a torch copy loop of two 1 GiB buffers on the GPU, timed by CUDA events, bytes read + written over time,
best of 5 samples of 20 copies; a torch.matmul loop of 8192 x 8192 BF16, 2n^3 per multiply, best of 5 samples of 20;
then `nvbandwidth -t device_local_copy` where it is on PATH (it counts the copied bytes once: x2 here).
Run: python3 benchmarks/bench_gpu_itself.py [--full]"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time


def reference(ordinal: int) -> float:
    import torch

    size = 1 << 30
    src = torch.empty(size, dtype=torch.uint8, device=f"cuda:{ordinal}").fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / 20)
    return 2 * size / best


def gemm_reference(ordinal: int) -> float:
    import torch

    n = 8192
    a, b = (torch.randn(n, n, dtype=torch.bfloat16, device=f"cuda:{ordinal}") for _ in range(2))
    c = torch.empty_like(a)
    for _ in range(10):
        torch.matmul(a, b, out=c)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / 20)
    return 2 * n**3 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true")
    args = parser.parse_args()
    import torch

    from nodecheck.bench.gpu_itself import LEVELS

    timed = LEVELS["full" if args.full else "quick"]["seconds"]  # each test's timed samples, as the bench runs them
    refs = {f"gpu{i}:memory": reference(i) for i in range(torch.cuda.device_count())}
    refs.update({f"gpu{i}:compute": gemm_reference(i) for i in range(torch.cuda.device_count())})
    torch.cuda.empty_cache()
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "nodecheck", "bench", "--tests", "hbm,gemm", "--json",
                          "--full" if args.full else "--quick"], capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    report = json.loads(run.stdout)
    print(f"nodecheck bench --tests hbm,gemm {'--full' if args.full else '--quick'}: exit {run.returncode}, {wall:.1f} s wall")
    print(f"{'path':14} {'test':5} {'spec (TB/s, TFLOPS)':>20} {'reference':>10} {'nodecheck':>10} {'x reference':>12} {'x spec':>7}")
    for m in report["measurements"]:
        got = m.get("flops_per_second") or m.get("bytes_per_second")
        spec = m.get("spec_flops_per_second") or m.get("spec_bytes_per_second")
        ref = refs.get(m["path"])
        print(f"{m['path']:14} {m['test']:5} {(spec or 0) / 1e12:20.3f} {(ref or 0) / 1e12:10.3f} {(got or 0) / 1e12:10.3f} "
              f"{(got / ref if got and ref else 0):12.3f} {m['ratio'] or 0:7.3f}  {m.get('error') or ''}")
        details = m.get("details") or {}
        for name in ("data check", "result check"):
            check = details.get(name.replace(" ", "_"))
            if check:  # the silent-data-corruption checks' cost, beside the run they follow
                print(f"  {name}: {check.get('seconds')} s after a {timed:g} s run; {check}")
    if shutil.which("nvbandwidth"):
        out = subprocess.run(["nvbandwidth", "-t", "device_local_copy"], capture_output=True, text=True, timeout=300).stdout
        print("nvbandwidth -t device_local_copy (copied bytes once; read + written is twice it):")
        print("\n".join(line for line in out.splitlines() if line.strip()[:1].isdigit() or "SUM" in line))
    print("findings:", [(f["kind"], f["subject"], f["measured"]) for f in report["findings"] if f["subject"].startswith("gpu")])


if __name__ == "__main__":
    main()
