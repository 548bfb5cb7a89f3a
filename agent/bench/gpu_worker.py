"""GPU copy tests in their own process (the only other place torch is imported).

    python -m nodecheck.bench.gpu_worker copy --device 0 --cpus 0-15 --sizes ... --out FILE
    python -m nodecheck.bench.gpu_worker p2p --sizes ... --out FILE

copy: host<->device with pinned host memory (and pageable in full mode), timed with CUDA events
around each copy; median of the repeats after warm-up. The process first binds itself to the GPU's
CPUs (its NUMA node), so the pinned buffer is first-touched on that node.
p2p: every ordered GPU pair, unidirectional (one copy) and bidirectional (both directions at once,
on one stream per device), timed by the wall clock between device synchronisations.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from nodecheck.bench.results import guarded
from nodecheck.bench.binding import bind_to_gpu_cpus
from nodecheck.bench.identity import pick_cuda_device


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nodecheck.bench.gpu_worker")
    parser.add_argument("test", choices=("copy", "p2p"))
    parser.add_argument("--device", type=int, default=0, help="NVML index (the last resort for finding the GPU)")
    parser.add_argument("--uuid", default=None, help="the GPU's UUID (NVML), matched first")
    parser.add_argument("--pci", default=None, help="the GPU's PCI bus id, matched when the UUID is not known")
    parser.add_argument("--cpus", default="", help="cpulist to bind to (the GPU's NUMA node)")
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pageable", action="store_true", help="also measure pageable host memory")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def _events_seconds(torch, fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def cuda_devices(torch) -> list[dict]:
    """What CUDA calls each visible device: ordinal, UUID and PCI bus id where this torch reports them."""
    devices = []
    for ordinal in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(ordinal)
        pci = None
        if hasattr(props, "pci_bus_id"):
            pci = f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
        devices.append({"ordinal": ordinal, "uuid": str(getattr(props, "uuid", "") or "") or None, "pci": pci})
    return devices


def copy_test(torch, args) -> dict:
    binding = bind_to_gpu_cpus(args.cpus)  # before the host buffers are touched: their pages land near the GPU
    bound = binding["cpus"]
    devices = cuda_devices(torch)
    args.device, how = pick_cuda_device(devices, args.uuid, args.pci, args.device)
    torch.cuda.set_device(args.device)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        for memory in ("pinned", "pageable") if args.pageable else ("pinned",):
            rows.append(_copy_row(torch, args, size, memory))
            torch.cuda.empty_cache()  # give the device buffer back before the next (larger) payload
    return {"device": args.device, "cpus": bound, "binding": binding, "rows": rows,
            "measured": dict(devices[args.device], matched=how)}


def _copy_row(torch, args, size: int, memory: str) -> dict:
    device_buffer = torch.empty(size, dtype=torch.uint8, device=f"cuda:{args.device}")
    host = torch.empty(size, dtype=torch.uint8, pin_memory=memory == "pinned")
    host.fill_(1)  # first touch, on the bound CPUs
    h2d = _events_seconds(torch, lambda: device_buffer.copy_(host, non_blocking=True), args.warmup, args.repeats)
    d2h = _events_seconds(torch, lambda: host.copy_(device_buffer, non_blocking=True), args.warmup, args.repeats)
    return {"size_bytes": size, "memory": memory, "h2d": size / h2d, "d2h": size / d2h}


def _wall_seconds(torch, devices: list[int], fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    for d in devices:
        torch.cuda.synchronize(d)
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    for d in devices:
        torch.cuda.synchronize(d)
    return (time.perf_counter() - started) / repeats


def p2p_test(torch, args) -> dict:
    size = max(int(s) for s in args.sizes.split(","))
    count = torch.cuda.device_count()
    buffers = {d: torch.empty(size, dtype=torch.uint8, device=f"cuda:{d}") for d in range(count)}
    spare = {d: torch.empty(size, dtype=torch.uint8, device=f"cuda:{d}") for d in range(count)}
    streams = {d: torch.cuda.Stream(device=d) for d in range(count)}
    pairs = []
    for a in range(count):
        for b in range(count):
            if a == b:
                continue
            one_way = _wall_seconds(torch, [a, b], lambda: spare[b].copy_(buffers[a], non_blocking=True), args.warmup, args.repeats)

            def both_ways():
                with torch.cuda.stream(streams[a]):
                    spare[b].copy_(buffers[a], non_blocking=True)
                with torch.cuda.stream(streams[b]):
                    spare[a].copy_(buffers[b], non_blocking=True)

            two_ways = _wall_seconds(torch, [a, b], both_ways, args.warmup, args.repeats)
            pairs.append({"src": a, "dst": b, "p2p_access": bool(torch.cuda.can_device_access_peer(a, b)),
                          "unidirectional": size / one_way, "bidirectional": 2 * size / two_ways})
    return {"size_bytes": size, "pairs": pairs}


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    import torch


    def work() -> dict:
        if not torch.cuda.is_available():
            raise RuntimeError(f"CUDA is not available to torch {torch.__version__} (built for CUDA {torch.version.cuda})")
        return copy_test(torch, args) if args.test == "copy" else p2p_test(torch, args)

    return guarded(args.out, work)


if __name__ == "__main__":
    sys.exit(main())
