"""The cost of nodecheck's data checks beside the measurement each follows (issue 26, item 4).

    python benchmarks/bench_data_check.py [--sizes 64MiB,256MiB,1GiB] [--repeats 3] [--json FILE]

Each check runs once after its figure is timed, and its time is the bench's overhead:
  copy       gpu_worker.verify_pair: a pattern (each int32 its own index) copied GPU -> GPU and compared on the
             device with the same pattern made there (as nvbandwidth verifies). The bench checks 64 MiB; here
             it is timed at each payload, GPU 0 -> GPU 1, or GPU 0 with itself on a one-GPU node, beside that
             payload's quick p2p measurement (pair_rates one way, `bench --quick`'s warm-ups and samples)
  allreduce  worker._check_data: one all-reduce of ones, every element compared with the world size (as
             nccl-tests' -c 1), beside that payload's timed all-reduces (the quick plan's warm-ups and
             iterations): NCCL in a world of one on a GPU, gloo on a machine without one
Each figure is wall clock with the device synchronised, the median of --repeats runs. Printed as a table,
and with --json FILE also written there for benchmarks/one_gpu_node.py.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "": 1}


def parse_sizes(text: str) -> list[int]:
    sizes = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d{1,6})\s*(KiB|MiB|GiB|)\s*", part)
        if not match:
            raise argparse.ArgumentTypeError(f"{part!r}: expected a size such as 256MiB or 1GiB")
        sizes.append(int(match[1]) * UNITS[match[2]])
    return sizes


def timed(torch, device, fn, *args, **kwargs) -> tuple[float, object]:
    """(seconds fn(*args, **kwargs) takes, the device's queued work included; what it returned)."""
    from nodecheck.bench.worker import _sync

    _sync(torch, device)
    started = time.perf_counter()
    value = fn(*args, **kwargs)
    _sync(torch, device)
    return time.perf_counter() - started, value


def copy_rows(torch, sizes: list[int], repeats: int) -> list[dict]:
    from nodecheck.bench.gpu import COPY_LEVELS
    from nodecheck.bench.gpu_worker import pair_rates, verify_pair

    if not torch.cuda.is_available():
        return [{"check": "copy", "size_bytes": size, "why": "no CUDA GPU here"} for size in sizes]
    quick = COPY_LEVELS["quick"]
    device = torch.device("cuda:0")
    b = 1 if torch.cuda.device_count() > 1 else 0
    return _sweep("copy", f"gpu0->gpu{b}", sizes, repeats,
                  lambda size: timed(torch, device, pair_rates, torch, 0, b, size, quick["warmup"], quick["repeats"], both_ways=False)[0],
                  lambda size: timed(torch, device, verify_pair, torch, 0, b, size // 4), torch.cuda.empty_cache)


def allreduce_rows(torch, sizes: list[int], repeats: int) -> list[dict]:
    import torch.distributed as dist

    from nodecheck.bench.distributed import LEVELS
    from nodecheck.bench.worker import _check_data, _time_allreduce

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cuda:0" if backend == "nccl" else "cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    quick = LEVELS[backend]["quick"]
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    def check(size: int) -> tuple[float, int]:
        seconds, found = timed(torch, device, _check_data, dist, torch, device, 1, size)
        return seconds, found["wrong_elements"]

    try:
        return _sweep("allreduce", f"{backend}, world of 1", sizes, repeats,
                      lambda size: timed(torch, device, _time_allreduce, dist, torch, device, size, quick["warmup"], quick["iters"])[0],
                      check)
    finally:
        dist.destroy_process_group()


def _sweep(check: str, where: str, sizes: list[int], repeats: int, measure, verify, tidy=lambda: None) -> list[dict]:
    """Per size, `repeats` times: the timed measurement (measure(size) -> seconds), then its data check
    (verify(size) -> (seconds, wrong elements)), then tidy(); one row of medians per size."""
    rows = []
    for size in sizes:
        measured, checked, wrong = [], [], 0
        for _ in range(repeats):
            measured.append(measure(size))
            seconds, wrong_now = verify(size)
            checked.append(seconds)
            wrong += wrong_now
            tidy()
        rows.append(_row(check, size, where, checked, measured, wrong))
    return rows


def _row(check: str, size: int, where: str, checked: list[float], measured: list[float], wrong: int) -> dict:
    check_s, measured_s = statistics.median(checked), statistics.median(measured)
    return {"check": check, "size_bytes": size, "where": where, "check_s": check_s, "measurement_s": measured_s,
            "ratio": check_s / measured_s if measured_s else None, "wrong_elements": wrong, "runs": len(checked)}


def render(rows: list[dict]) -> str:
    lines = [f"{'check':<10} {'payload':>9} {'where':<18} {'check':>9} {'measurement':>12} {'check/measurement':>18}"]
    for r in rows:
        payload = f"{r['size_bytes'] >> 20} MiB"
        if "why" in r:
            lines.append(f"{r['check']:<10} {payload:>9} n/a ({r['why']})")
            continue
        lines.append(f"{r['check']:<10} {payload:>9} {r['where']:<18} {r['check_s'] * 1e3:>7.1f} ms {r['measurement_s'] * 1e3:>9.1f} ms "
                     f"{r['ratio']:>18.3f}" + (f"  WRONG ELEMENTS: {r['wrong_elements']}" if r["wrong_elements"] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes("64MiB,256MiB,1GiB"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    import torch

    rows = copy_rows(torch, args.sizes, args.repeats) + allreduce_rows(torch, args.sizes, args.repeats)
    print(render(rows))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"torch": torch.__version__, "rows": rows}, file, indent=1)
    return 1 if any(r.get("wrong_elements") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
