"""Tests of the GPU itself, one GPU per process (torch imported here, never in the runner).

    python -m nodecheck.bench.gpu_itself_worker hbm --gpu '{"index": 0, "uuid": ..., "pci": ...}' --seconds 3 --out FILE

hbm: the GPU's memory bandwidth as STREAM-style tools count it: a device-to-device copy of a buffer far larger than
the L2 cache (at least 1 GiB where the GPU's free memory allows), the bytes read plus the bytes written over the time
the copies took. Copies are queued back to back between two CUDA events (a sample of about 50 ms); the figure is the
median of the samples taken in --seconds after a warm-up, so the memory clock has left its idle state. The buffers
take at most --memory-share of the memory free when the test starts (never memory a job holds), and go with the
process. `--device cpu` runs the same steps on the host's memory with torch's CPU tensors, timed by the wall clock:
how the test suite runs this code without a GPU; its figure judges nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from nodecheck.bench.identity import pick_cuda_device
from nodecheck.bench.lifeline import hold
from nodecheck.bench.results import guarded

MiB = 1 << 20
BUFFER_BYTES = 1 << 30  # each of the two buffers: far past the largest L2 (B200: 126 MB) so the copy reads HBM
MIN_BUFFER_BYTES = 64 * MiB
SAMPLE_S = 0.05  # one sample's copies take about this long: the events' resolution is a microsecond
WARMUP = 3
CPU_FREE_BYTES = 512 * MiB  # --device cpu: buffers of 64 MiB at the default share, for a test suite on small machines


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nodecheck.bench.gpu_itself_worker")
    parser.add_argument("test", choices=("hbm",))
    parser.add_argument("--gpu", required=True, help='JSON {"index", "uuid", "pci"}: the GPU to test')
    parser.add_argument("--seconds", type=float, default=3.0, help="how long the timed samples run")
    parser.add_argument("--memory-share", type=float, default=0.25, help="the share of the free memory the buffers may take")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not 0 < args.memory_share <= 0.5 or not 0 < args.seconds <= 3600:
        parser.error("--memory-share must be in (0, 0.5] and --seconds in (0, 3600]")
    return args


def buffer_bytes(free_bytes: int, share: float) -> int:
    """Each of the two buffers: BUFFER_BYTES, or the share of the free memory both may take, whichever is less;
    ValueError when that is below MIN_BUFFER_BYTES (a copy that fits in L2 measures the cache, not the memory)."""
    size = min(BUFFER_BYTES, int(free_bytes * share) // 2) // MiB * MiB
    if size < MIN_BUFFER_BYTES:
        raise ValueError(f"{free_bytes / MiB:.0f} MiB free: too little for two buffers of {MIN_BUFFER_BYTES // MiB} MiB "
                         "(the GPU's memory is someone's: not tested)")
    return size


class Timer:
    """Seconds for `count` calls of a function: by CUDA events on the device's stream, else by the wall clock."""

    def __init__(self, torch, device: str):
        self.torch, self.cuda = torch, device.startswith("cuda")

    def seconds(self, work, count: int) -> float:
        if not self.cuda:
            started = time.perf_counter()
            for _ in range(count):
                work()
            return time.perf_counter() - started
        start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def hbm(torch, device: str, share: float, seconds: float) -> dict:
    """The copy's figure on `device` ("cuda:N" or "cpu"): bytes read + written per second, median of the samples."""
    free = torch.cuda.mem_get_info(device)[0] if device.startswith("cuda") else CPU_FREE_BYTES
    size = buffer_bytes(free, share)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    src.fill_(0x5A)
    timer = Timer(torch, device)

    def copy():
        dst.copy_(src)

    once = max(timer.seconds(copy, WARMUP) / WARMUP, 1e-6)
    per_sample = max(1, min(200, round(SAMPLE_S / once)))
    samples, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline or len(samples) < 3:
        samples.append(timer.seconds(copy, per_sample) / per_sample)
    wrong = int((dst != 0x5A).sum().item())  # what the copies wrote is what was read
    median = statistics.median(samples)
    return {"size_bytes": size, "copies_per_sample": per_sample, "samples": len(samples), "seconds_per_copy": median,
            "bytes_per_second": 2 * size / median, "best_bytes_per_second": 2 * size / min(samples),
            "wrong_bytes": wrong, "free_bytes": free}


def run(torch, args) -> dict:
    gpu = json.loads(args.gpu)
    if not isinstance(gpu, dict) or not isinstance(gpu.get("index"), int):
        raise ValueError('--gpu: expected a JSON object {"index": N, ...}')
    if args.device == "cpu":
        return {"index": gpu["index"], "device": "cpu", "hbm": hbm(torch, "cpu", args.memory_share, args.seconds)}
    from nodecheck.bench.gpu_worker import cuda_devices, hidden_by_environment

    if not torch.cuda.is_available():
        raise RuntimeError(f"CUDA is not available to torch {torch.__version__} (built for CUDA {torch.version.cuda})"
                           + hidden_by_environment(os.environ))
    devices = cuda_devices(torch)
    ordinal, how = pick_cuda_device(devices, gpu.get("uuid"), gpu.get("pci"), gpu["index"])
    torch.cuda.set_device(ordinal)
    return {"index": gpu["index"], "device": f"cuda:{ordinal}", "measured": dict(devices[ordinal], matched=how),
            "hbm": hbm(torch, f"cuda:{ordinal}", args.memory_share, args.seconds)}


def main(argv: list[str] | None = None) -> int:
    hold()  # dies with the runner, before torch takes seconds to import
    args = _args(sys.argv[1:] if argv is None else argv)
    import torch

    return guarded(args.out, lambda: run(torch, args))


if __name__ == "__main__":
    sys.exit(main())
