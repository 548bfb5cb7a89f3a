"""`nodecheck nccl-job DIR` at job size: a thousand ranks' NCCL Inspector files (125 hosts x 8, v4.3 JSON Lines as the
plugin writes them: one world communicator and 125 per-host ones, OPS AllReduce records each, one rank late by 2 ms
in the world communicator), judged by the real command in a subprocess; its wall time and peak memory beside the
reference (a thousand ranks' files in seconds), and the same files read and parsed as JSON by Python alone.
Run: .venv/bin/python benchmarks/bench_nccl_job.py [--hosts 125] [--ops 200]"""

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

REFERENCE_S = 10.0  # "a directory of a thousand ranks' files reads in seconds"


def child_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def write_job(directory: Path, hosts: int, ops: int, late: int) -> int:
    rng = random.Random(7)
    n = hosts * 8
    world: dict[int, list[str]] = {rank: [] for rank in range(n)}
    local: dict[int, list[str]] = {rank: [] for rank in range(n)}
    for sn in range(ops):
        arrive = [rng.uniform(0, 200) + (2000 if rank == late else 0) for rank in range(n)]
        done = max(arrive) + 9000
        for rank in range(n):
            exec_us = done - arrive[rank]
            world[rank].append(json.dumps({"coll_perf": {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": 1 << 28,
                                                         "coll_exec_time_us": round(exec_us, 3), "coll_timing_source": "kernel_gpu",
                                                         "coll_busbw_gbs": round((1 << 28) / exec_us / 1e3 * 2, 3)}}))
            tp = 3000 + rng.uniform(0, 30)
            local[rank].append(json.dumps({"coll_perf": {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": 1 << 26,
                                                         "coll_exec_time_us": round(tp, 3), "coll_timing_source": "kernel_gpu",
                                                         "coll_busbw_gbs": round((1 << 26) / tp / 1e3 * 1.75, 3)}}))
    for rank in range(n):
        host, pid = f"gpu-{rank // 8:04d}", 40000 + rank
        metadata = {"inspector_output_format_version": "v4.3", "hostname": host, "pid": pid}
        marks = [{"header": {"id": "0xworld", "rank": rank, "n_ranks": n, "nnodes": hosts}, "metadata": metadata,
                  "dump_stats": {"coll_records": ops, "p2p_records": 0}},
                 {"header": {"id": f"0xtp{rank // 8:04d}", "rank": rank % 8, "n_ranks": 8, "nnodes": 1}, "metadata": metadata,
                  "dump_stats": {"coll_records": ops, "p2p_records": 0}}]
        text = "\n".join([json.dumps(marks[0]), *world[rank], json.dumps(marks[1]), *local[rank]]) + "\n"
        (directory / f"{host}-pid{pid}.log").write_text(text)
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=125)
    parser.add_argument("--ops", type=int, default=200)
    args = parser.parse_args()
    entry = str(Path(sys.executable).parent / "nodecheck")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        late = args.hosts * 8 // 3
        started = time.perf_counter()
        ranks = write_job(directory, args.hosts, args.ops, late)
        size = sum(p.stat().st_size for p in directory.iterdir()) / 2**20
        print(f"{ranks} ranks' files, {2 * args.ops * ranks} records, {size:.0f} MiB, written in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import json, pathlib, sys\n"
                        "for p in sorted(pathlib.Path(sys.argv[1]).iterdir()):\n"
                        "    [json.loads(line) for line in p.read_text().splitlines()]", str(directory)], timeout=3600, check=True)
        reference_s, reference_mib = time.perf_counter() - started, child_peak_mib()
        started = time.perf_counter()
        result = subprocess.run([entry, "nccl-job", str(directory), "--json"], capture_output=True, text=True, timeout=3600)
        job_s, job_mib = time.perf_counter() - started, child_peak_mib()
        named = [(n["why"], n["rank"]) for n in json.loads(result.stdout)["named"]] if result.stdout.startswith("{") else result.stderr[-300:]
        print(f"{'':40} {'wall s':>8} {'peak RSS MiB':>13}")
        print(f"{'python alone: read + json.loads a line':40} {reference_s:8.1f} {reference_mib:13.0f}")
        print(f"{'nodecheck nccl-job DIR --json':40} {job_s:8.1f} {job_mib:13.0f}  (exit {result.returncode}, named {named}, "
              f"late rank {late})")
        print(f"reference: a thousand ranks' files in seconds (under {REFERENCE_S:.0f} s): "
              f"{'met' if job_s < REFERENCE_S and ranks >= 1000 else 'NOT met'}")


if __name__ == "__main__":
    main()
