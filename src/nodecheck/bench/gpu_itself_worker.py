"""Tests of the GPU itself, one GPU per process (torch imported here, never in the runner).

    python -m nodecheck.bench.gpu_itself_worker hbm|gemm --gpu '{"index": 0, "uuid": ..., "pci": ...}' --seconds 3 --out FILE

hbm: the GPU's memory bandwidth as STREAM-style tools count it: a device-to-device copy of a buffer far larger than
the L2 cache (at least 1 GiB where the GPU's free memory allows), the bytes read plus the bytes written over the time
the copies took. Copies are queued back to back between two CUDA events (a sample of about 50 ms); the figure is the
median of the samples taken in --seconds after a warm-up, so the memory clock has left its idle state. The buffers
take at most --memory-share of the memory free when the test starts (never memory a job holds), and go with the
process. The copies move a pattern (each 32-bit word its own index, then its complement), read back after timing:
a word that arrives wrong is counted, every bit tried both ways.
gemm: dense BF16 matrix multiplies (torch.matmul, cuBLAS) of 8192 x 8192, 2 n^3 floating-point operations each,
queued back to back between CUDA events, median of the samples over --seconds after a warm-up long enough to reach
steady clocks. Then the silent-data-corruption check: one multiply of inputs made from a fixed seed on the CPU (the
same on every GPU), with deterministic cuBLAS settings (CUBLAS_WORKSPACE_CONFIG, set by the runner, and
torch.use_deterministic_algorithms), done twice: both results must be bit-identical (their SHA-256 is kept for the
runner to compare across the GPUs of one model). It sees a GPU that computes wrong or unsteadily on these inputs;
it cannot see a fault other inputs or kernels would meet, nor one that corrupts the same way every time on every GPU.
`--device cpu` runs the same steps on the host's memory with torch's CPU tensors, timed by the wall clock:
how the test suite runs this code without a GPU; its figure judges nothing.
"""

from __future__ import annotations

import argparse
import hashlib
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
GEMM_N = 8192  # long enough per multiply (1.1 TFLOP) that launch gaps vanish, small enough (384 MiB) for any GPU
CHECK_N = 4096  # the silent-data-corruption check's multiply: inputs made on the CPU, 32 MiB each
CPU_GEMM_N, CPU_CHECK_N = 256, 128  # --device cpu: seconds, not minutes, on a small machine
SEED = 20261129


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nodecheck.bench.gpu_itself_worker")
    parser.add_argument("test", choices=("hbm", "gemm"))
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
    words = torch.arange(size // 4, dtype=torch.int32, device=device)
    src = words.view(torch.uint8)
    dst = torch.empty_like(src)
    timer = Timer(torch, device)

    def copy():
        dst.copy_(src)

    once = max(timer.seconds(copy, WARMUP) / WARMUP, 1e-6)
    per_sample = max(1, min(200, round(SAMPLE_S / once)))
    samples, deadline, timed_from = [], time.monotonic() + seconds, time.time()
    while time.monotonic() < deadline or len(samples) < 3:
        samples.append(timer.seconds(copy, per_sample) / per_sample)
    timed_to = time.time()
    checked_from = time.perf_counter()  # what the data check adds to the run (.item() waits for the device)
    wrong = int((dst.view(torch.int32) != words).sum().item())  # what the copies wrote is what was read
    torch.bitwise_not(words, out=words)  # every bit the other way
    dst.copy_(src)
    wrong += int((dst.view(torch.int32) != words).sum().item())
    check_seconds = time.perf_counter() - checked_from
    median = statistics.median(samples)
    return {"size_bytes": size, "copies_per_sample": per_sample, "samples": len(samples), "seconds_per_copy": median,
            "bytes_per_second": 2 * size / median, "best_bytes_per_second": 2 * size / min(samples),
            "words_checked": 2 * (size // 4), "wrong_words": wrong, "check_seconds": check_seconds, "free_bytes": free,
            "window": [timed_from, timed_to]}


def gemm(torch, device: str, seconds: float) -> dict:
    """Dense BF16 FLOP/s on `device` (median of the samples), and the silent-data-corruption check's digests."""
    cuda = device.startswith("cuda")
    n = GEMM_N if cuda else CPU_GEMM_N
    a, b = (torch.randn(n, n, dtype=torch.bfloat16, device=device) for _ in range(2))
    c = torch.empty(n, n, dtype=torch.bfloat16, device=device)
    timer = Timer(torch, device)

    def multiply():
        torch.matmul(a, b, out=c)

    once = max(timer.seconds(multiply, WARMUP) / WARMUP, 1e-6)
    warm_until = time.monotonic() + min(2.0, seconds / 2)  # the clocks settle under load before samples count
    while time.monotonic() < warm_until:
        timer.seconds(multiply, max(1, round(SAMPLE_S / once)))
    per_sample = max(1, min(500, round(SAMPLE_S / once)))
    samples, deadline, timed_from = [], time.monotonic() + seconds, time.time()
    while time.monotonic() < deadline or len(samples) < 3:
        samples.append(timer.seconds(multiply, per_sample) / per_sample)
    timed_to = time.time()
    median = statistics.median(samples)
    checked_from = time.perf_counter()  # what the result check adds to the run (each digest copies to the host)
    first, second = (_digest(torch, device, CHECK_N if cuda else CPU_CHECK_N) for _ in range(2))
    check = {"n": CHECK_N if cuda else CPU_CHECK_N, "seed": SEED, "digests": [first, second],
             "seconds": time.perf_counter() - checked_from}
    return {"n": n, "dtype": "bf16", "multiplies_per_sample": per_sample, "samples": len(samples), "seconds_per_multiply": median,
            "flops_per_second": 2 * n**3 / median, "best_flops_per_second": 2 * n**3 / min(samples), "check": check,
            "window": [timed_from, timed_to]}


def _digest(torch, device: str, n: int) -> str:
    """SHA-256 of the bits of one BF16 multiply of inputs made from SEED on the CPU: the same inputs on every GPU."""
    generator = torch.Generator().manual_seed(SEED)
    a, b = (torch.randn(n, n, generator=generator).to(torch.bfloat16).to(device) for _ in range(2))
    result = torch.matmul(a, b).contiguous().view(torch.uint8).cpu().clone()
    return hashlib.sha256(bytes(result.untyped_storage())).hexdigest()


def run(torch, args) -> dict:
    gpu = json.loads(args.gpu)
    if not isinstance(gpu, dict) or not isinstance(gpu.get("index"), int):
        raise ValueError('--gpu: expected a JSON object {"index": N, ...}')
    torch.use_deterministic_algorithms(True)  # the same inputs give the same bits (CUBLAS_WORKSPACE_CONFIG: the runner's)
    if args.device == "cpu":
        return {"index": gpu["index"], "device": "cpu", args.test: _test(torch, args, "cpu")}
    from nodecheck.bench.gpu_worker import cuda_devices, hidden_by_environment

    if not torch.cuda.is_available():
        raise RuntimeError(f"CUDA is not available to torch {torch.__version__} (built for CUDA {torch.version.cuda})"
                           + hidden_by_environment(os.environ))
    devices = cuda_devices(torch)
    ordinal, how = pick_cuda_device(devices, gpu.get("uuid"), gpu.get("pci"), gpu["index"])
    torch.cuda.set_device(ordinal)
    return {"index": gpu["index"], "device": f"cuda:{ordinal}", "measured": dict(devices[ordinal], matched=how),
            args.test: _test(torch, args, f"cuda:{ordinal}")}


def _test(torch, args, device: str) -> dict:
    return hbm(torch, device, args.memory_share, args.seconds) if args.test == "hbm" else gemm(torch, device, args.seconds)


def main(argv: list[str] | None = None) -> int:
    hold()  # dies with the runner, before torch takes seconds to import
    args = _args(sys.argv[1:] if argv is None else argv)
    import torch

    return guarded(args.out, lambda: run(torch, args))


if __name__ == "__main__":
    sys.exit(main())
