"""On a GPU node: `nodecheck bench --tests hbm` beside a plain reference timed in the same run, each GPU's figure
against its model's spec (issue 50, item 8: goal 0.98-1.02 of the reference). The reference: a torch copy loop of
two 1 GiB buffers on the GPU, timed by CUDA events, bytes read + written over time, best of 5 samples of 20
copies; then `nvbandwidth -t device_local_copy` where it is on PATH (it counts the copied bytes once: x2 here).
Run: python3 benchmarks/bench_hbm.py [--full]"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true")
    args = parser.parse_args()
    import torch

    refs = {i: reference(i) for i in range(torch.cuda.device_count())}
    torch.cuda.empty_cache()
    run = subprocess.run([sys.executable, "-m", "nodecheck", "bench", "--tests", "hbm", "--json",
                          "--full" if args.full else "--quick"], capture_output=True, text=True, timeout=600)
    report = json.loads(run.stdout)
    print(f"nodecheck bench --tests hbm exit {run.returncode}")
    print(f"{'GPU':6} {'model':16} {'spec TB/s':>10} {'reference TB/s':>15} {'nodecheck TB/s':>15} {'x reference':>12} {'x spec':>7}")
    gpus = {g["index"]: g for g in report["gpus"]}
    for m in report["measurements"]:
        index = int(m["path"].split(":")[0].removeprefix("gpu"))
        spec = (gpus[index].get("spec") or {})
        ref = refs.get(index)
        got = m["bytes_per_second"]
        print(f"gpu{index:<3} {str(spec.get('model')):16} {(spec.get('memory_bytes_per_second') or 0) / 1e12:10.3f} "
              f"{(ref or 0) / 1e12:15.3f} {(got or 0) / 1e12:15.3f} {(got / ref if got and ref else 0):12.3f} "
              f"{m['ratio'] or 0:7.3f}  {m.get('error') or ''}")
    if shutil.which("nvbandwidth"):
        out = subprocess.run(["nvbandwidth", "-t", "device_local_copy"], capture_output=True, text=True, timeout=300).stdout
        print("nvbandwidth -t device_local_copy (copied bytes once; read + written is twice it):")
        print("\n".join(line for line in out.splitlines() if line.strip()[:1].isdigit() or "SUM" in line))
    print("findings:", [(f["kind"], f["subject"], f["measured"]) for f in report["findings"] if f["subject"].endswith(":memory")])


if __name__ == "__main__":
    main()
