"""GPU copy tests in their own process (the only other place torch is imported).

    python -m nodecheck.bench.gpu_worker copy --gpus '[{"index": 0, "uuid": ..., "pci": ..., "cpus": "0-15"}, ...]' --sizes ... --out FILE
    python -m nodecheck.bench.gpu_worker copy --device 0 --sizes ... --out FILE      (one GPU by index)
    python -m nodecheck.bench.gpu_worker p2p --sizes ... --out FILE

One process for all GPUs of the node: torch is imported and CUDA started once.
copy: host<->device with pinned host memory (and pageable in full mode), for each GPU in turn: the
process first binds itself to that GPU's CPUs (its NUMA node), so the host buffers are first-touched
there. Timing as nvbandwidth and cuda-samples do it: the stream is held by a short GPU sleep while
the copies of a sample are queued, so they run back to back with no launch gap in the window; a
sample is N copies between two CUDA events (N larger for small payloads); the figure is the median of
the samples. The link is first warmed at the largest payload (an idle GPU's link idles at a low
PCIe generation). A GPU that fails is reported as such; the others are still measured.
p2p: every ordered GPU pair one way, and every unordered pair both ways at once (one stream per
device, joined by events), timed by CUDA events on the source device's stream.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from nodecheck.bench.binding import bind_to_gpu_cpus, buffer_numa_node
from nodecheck.bench.identity import pick_cuda_device
from nodecheck.bench.lifeline import hold
from nodecheck.bench.results import essential, guarded

MiB = 1 << 20
HOLD_CYCLES = 2_000_000  # ~1 ms of GPU sleep: long enough to queue a sample's copies behind it
SAMPLE_BYTES = 256 * MiB  # a sample moves at least this much (at most 64 copies): small payloads are timed in bulk


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nodecheck.bench.gpu_worker")
    parser.add_argument("test", choices=("copy", "p2p"))
    parser.add_argument("--gpus", default=None, help='JSON list of {"index", "uuid", "pci", "cpus"}: the GPUs to measure, in turn')
    parser.add_argument("--device", type=int, default=0, help="with no --gpus: one GPU by NVML index")
    parser.add_argument("--uuid", default=None, help="with no --gpus: the GPU's UUID (NVML), matched first")
    parser.add_argument("--pci", default=None, help="with no --gpus: the GPU's PCI bus id, matched when the UUID is not known")
    parser.add_argument("--cpus", default="", help="with no --gpus: cpulist to bind to (the GPU's NUMA node)")
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="samples per figure (median)")
    parser.add_argument("--pageable", action="store_true", help="also measure pageable host memory")
    parser.add_argument("--pair-timeout", type=float, default=None, help="p2p: seconds one pair may take before it counts as hung")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def copies_per_sample(size: int) -> int:
    return max(1, min(64, SAMPLE_BYTES // max(1, size)))


def _events_seconds(torch, copy, warmup: int, samples: int, per_sample: int, stream=None) -> float:
    """Seconds per copy: median over `samples` of (one sample's `per_sample` back-to-back copies) / per_sample."""
    stream = stream or torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            copy()
    stream.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(HOLD_CYCLES)  # the copies below are queued while the stream sleeps
            start.record(stream)
            for _ in range(per_sample):
                copy()
            end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / per_sample)
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


def _gpus(args) -> list[dict]:
    if args.gpus is None:
        return [{"index": args.device, "uuid": args.uuid, "pci": args.pci, "cpus": args.cpus}]
    gpus = json.loads(args.gpus)
    if not isinstance(gpus, list) or not all(isinstance(g, dict) and isinstance(g.get("index"), int) for g in gpus):
        raise ValueError('--gpus: expected a JSON list of {"index": N, ...}')
    return gpus


def copy_test(torch, args) -> dict:
    devices = cuda_devices(torch)
    allowed = os.sched_getaffinity(0)  # each GPU's binding starts from what this process may use
    out = []
    for gpu in _gpus(args):
        os.sched_setaffinity(0, allowed)
        try:
            out.append(_copy_gpu(torch, args, devices, gpu))
        except Exception as error:  # this GPU's failure, named; the next GPU is still measured
            out.append({"index": gpu["index"], "error": {"type": type(error).__name__, "message": essential(str(error))}})
        torch.cuda.empty_cache()
        free_host_cache(torch)  # else GPU 0's pinned blocks, placed near GPU 0, come back for GPUs 4-7
    return {"gpus": out}


def free_host_cache(torch) -> bool:
    """Give PyTorch's cached pinned host blocks back to the system (torch.accelerator.empty_host_cache, or the
    older private call); False when this torch offers neither."""
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None) or getattr(torch._C, "_host_emptyCache", None)
    if empty is None:
        return False
    empty()
    return True


def pinned_blocks_created(torch) -> int | None:
    """How many pinned host blocks PyTorch's caching allocator has asked CUDA for so far (a block handed back
    from its cache is not counted); None when this torch does not say (torch.cuda.host_memory_stats)."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    try:
        created = stats().get("num_host_alloc") if stats else None
    except RuntimeError:  # CUDA not initialised in some versions
        return None
    return created if isinstance(created, int) else None


def _copy_gpu(torch, args, devices: list[dict], gpu: dict) -> dict:
    binding = bind_to_gpu_cpus(gpu.get("cpus") or "")  # before the host buffers are touched: their pages land near the GPU
    ordinal, how = pick_cuda_device(devices, gpu.get("uuid"), gpu.get("pci"), gpu["index"])
    torch.cuda.set_device(ordinal)
    sizes = [int(s) for s in args.sizes.split(",")]
    created_before = pinned_blocks_created(torch)
    _warm_link(torch, ordinal, max(sizes))
    rows = []
    for size in sizes:
        for memory in ("pinned", "pageable") if args.pageable else ("pinned",):
            rows.append(_copy_row(torch, args, ordinal, size, memory))
            torch.cuda.empty_cache()  # give the device buffer back before the next (larger) payload
    created_after = pinned_blocks_created(torch)
    fresh = created_after - created_before if created_before is not None and created_after is not None else None
    # fresh > 0: this GPU's pinned buffers were allocated (and first touched) under its own binding, not
    # handed back from the cache of a GPU measured before it
    return {"index": gpu["index"], "device": ordinal, "cpus": binding["cpus"], "binding": binding, "rows": rows,
            "measured": dict(devices[ordinal], matched=how), "pinned_blocks_created": fresh}


def _warm_link(torch, ordinal: int, size: int) -> None:
    device_buffer = torch.empty(size, dtype=torch.uint8, device=f"cuda:{ordinal}")
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    for _ in range(2):
        device_buffer.copy_(host, non_blocking=True)
        host.copy_(device_buffer, non_blocking=True)
    torch.cuda.synchronize(ordinal)


def _copy_row(torch, args, ordinal: int, size: int, memory: str) -> dict:
    device_buffer = torch.empty(size, dtype=torch.uint8, device=f"cuda:{ordinal}")
    host = torch.empty(size, dtype=torch.uint8, pin_memory=memory == "pinned")
    host.fill_(1)  # first touch, on the bound CPUs
    n = copies_per_sample(size)
    h2d = _events_seconds(torch, lambda: device_buffer.copy_(host, non_blocking=True), args.warmup, args.repeats, n)
    d2h = _events_seconds(torch, lambda: host.copy_(device_buffer, non_blocking=True), args.warmup, args.repeats, n)
    return {"size_bytes": size, "memory": memory, "h2d": size / h2d, "d2h": size / d2h, "copies_per_sample": n,
            "host_numa_node": buffer_numa_node(host.data_ptr()), "host_address": f"0x{host.data_ptr():x}"}


def pair_rates(torch, a: int, b: int, size: int, warmup: int, samples: int, both_ways: bool) -> dict:
    """GPU a -> GPU b one way, and (both_ways) a <-> b at once, in bytes/s.
    One way: events on a's stream, where torch runs a cross-device copy. Both ways: a->b on a's stream,
    b->a on b's, b's stream joined to a's start and a's end waiting for b's last copy."""
    src, dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{a}"), torch.empty(size, dtype=torch.uint8, device=f"cuda:{b}")
    stream_a, stream_b = torch.cuda.Stream(device=a), torch.cuda.Stream(device=b)
    n = copies_per_sample(size)
    with torch.cuda.device(a):
        one_way = _events_seconds(torch, lambda: dst.copy_(src, non_blocking=True), warmup, samples, n, stream_a)
    rates = {"unidirectional": size / one_way}
    if not both_ways:
        return rates
    back_src, back_dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{b}"), torch.empty(size, dtype=torch.uint8, device=f"cuda:{a}")
    times = []
    for sample in range(warmup + samples):
        with torch.cuda.device(a):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream_a):
                torch.cuda._sleep(HOLD_CYCLES)
                start.record(stream_a)
        stream_b.wait_event(start)
        for _ in range(n):
            with torch.cuda.stream(stream_a):
                dst.copy_(src, non_blocking=True)
            with torch.cuda.stream(stream_b):
                back_dst.copy_(back_src, non_blocking=True)
        b_done = torch.cuda.Event()
        b_done.record(stream_b)
        stream_a.wait_event(b_done)
        end.record(stream_a)
        end.synchronize()
        if sample >= warmup:
            times.append(start.elapsed_time(end) / 1e3 / n)
    rates["bidirectional"] = 2 * size / statistics.median(times)
    return rates


VERIFY_ELEMENTS = 16 << 20  # 64 MiB of int32: each element its own index, so a lost or misplaced block shows


def verify_pair(torch, a: int, b: int, elements: int = VERIFY_ELEMENTS) -> int:
    """After timing, copy a pattern from GPU a to GPU b and compare it on b with the same pattern made there,
    as nvbandwidth verifies its copies: the number of elements that arrived wrong."""
    src = torch.arange(elements, dtype=torch.int32, device=f"cuda:{a}")
    dst = torch.empty(elements, dtype=torch.int32, device=f"cuda:{b}")
    dst.copy_(src)
    return int((dst != torch.arange(elements, dtype=torch.int32, device=f"cuda:{b}")).sum().item())


def p2p_test(torch, args, on_hang=None) -> dict:
    """Every ordered pair of the GPUs named by --gpus (NVML index, UUID, PCI bus id), each found among the CUDA
    devices this process sees and named by its NVML index; without --gpus, every CUDA device by ordinal. The
    GPUs CUDA does not see are listed in "missing" with why, beside "cuda_count". Each pair's copies are
    verified ("wrong_elements") and have --pair-timeout seconds: a pair that hangs (a wedged link blocks
    inside CUDA, where no exception comes) makes a watchdog hand `on_hang` the result so far, the pairs
    that finished and the one that hung; by default it is written to --out and the process ends."""
    size = max(int(s) for s in args.sizes.split(","))
    devices = cuda_devices(torch)
    found, missing = [], []
    for gpu in (_gpus(args) if args.gpus is not None else [{"index": d["ordinal"]} for d in devices]):
        try:
            found.append((gpu["index"], pick_cuda_device(devices, gpu.get("uuid"), gpu.get("pci"), gpu["index"])[0]))
        except LookupError as error:
            missing.append({"index": gpu["index"], "why": str(error)})
    result = {"size_bytes": size, "pairs": [], "missing": missing, "cuda_count": len(devices)}
    current: dict = {}
    done = threading.Event()
    limit = getattr(args, "pair_timeout", None)
    if limit:
        threading.Thread(target=_pair_watchdog, args=(result, current, done, limit, on_hang or _write_and_end(args.out)),
                         name="nodecheck-pair-watchdog", daemon=True).start()
    try:
        for a, ordinal_a in found:
            for b, ordinal_b in found:
                if a == b:
                    continue
                current.update(src=a, dst=b, started=time.monotonic())
                rates = pair_rates(torch, ordinal_a, ordinal_b, size, args.warmup, args.repeats, both_ways=a < b)  # once per unordered pair
                rates["wrong_elements"] = verify_pair(torch, ordinal_a, ordinal_b)
                result["pairs"].append({"src": a, "dst": b, "p2p_access": bool(torch.cuda.can_device_access_peer(ordinal_a, ordinal_b)),
                                        **rates})
                current.clear()
    finally:
        done.set()
    return result


def _pair_watchdog(result: dict, current: dict, done, limit: float, on_hang) -> None:
    while not done.wait(0.2):
        started = current.get("started")
        if started is not None and time.monotonic() - started > limit:
            on_hang(dict(result, pairs=list(result["pairs"]), hung={"src": current.get("src"), "dst": current.get("dst"),
                                                                   "limit_s": limit}))
            return


def _write_and_end(out: str):
    def end(partial: dict) -> None:
        Path(out).write_text(json.dumps(partial))
        os._exit(0)  # the main thread is blocked inside CUDA: nothing else can end it
    return end


def hidden_by_environment(environ) -> str:
    """Why CUDA may see no GPU where NVML names some: CUDA_VISIBLE_DEVICES set to nothing (or to -1, or to
    names that match no device); "" when it is unset."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return ""
    if not visible.strip() or visible.strip().startswith("-1"):
        return f": CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from this process"
    return f" (CUDA_VISIBLE_DEVICES={visible!r}: check that it names this node's GPUs)"


def main(argv: list[str] | None = None) -> int:
    hold()  # dies with the runner, before torch takes seconds to import
    args = _args(sys.argv[1:] if argv is None else argv)
    import torch

    def work() -> dict:
        if not torch.cuda.is_available():
            raise RuntimeError(f"CUDA is not available to torch {torch.__version__} (built for CUDA {torch.version.cuda})"
                               + hidden_by_environment(os.environ))
        return copy_test(torch, args) if args.test == "copy" else p2p_test(torch, args)

    return guarded(args.out, work)


if __name__ == "__main__":
    sys.exit(main())
