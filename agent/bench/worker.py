"""One rank of the all-reduce test, in its own process (the only place torch is imported).

Launched by nodecheck's bench runner with the torch.distributed environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) of the job. Every rank writes the gathered results of all ranks as JSON to
--out, so each node can report what it saw; rank 0's copy is the cluster's.

busbw = algbw x 2(n-1)/n, the nccl-tests convention (seed 002): it is comparable to one link's rate
whatever the number of ranks. When busbw falls below the threshold, the nodes exchange buffers in two
pairings (nodecheck.pairing), both directions, all pairs at once: two rounds for any node count, and
a slow rank 0 is named like any other node.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time

from nodecheck.bench.results import guarded


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nodecheck.bench.worker")
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--spec", type=float, default=0.0, help="the path's spec in bytes/s when it is not per-node NICs (in-node)")
    parser.add_argument("--sizes", required=True, help="payload sizes in bytes, comma-separated")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--node", default=socket.gethostname())
    parser.add_argument("--nic", default=None)
    parser.add_argument("--address", default=None)
    parser.add_argument("--nic-spec", type=float, default=0.0, help="this node's NIC rate, bytes/s (0: unknown)")
    parser.add_argument("--node-results", default=None, help="JSON file: this node's own measurements, shared with every rank")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# With NCCL an all-reduce below this payload takes microseconds: at least MIN_SMALL_ITERS of them are timed.
# (gloo's 32 MiB on a 1-10 Gbit/s link takes tenths of a second: its own count is enough.)
SMALL = 64 << 20
MIN_SMALL_ITERS = 20


def _time_allreduce(dist, torch, device, size: int, warmup: int, iters: int) -> float:
    """Seconds per all-reduce of `size` bytes, the slowest rank's view (every rank gets the same number).
    The ranks start together (a barrier before the window); the window itself holds only the all-reduces
    and this rank's wait for its GPU, as nccl-tests times it: a barrier inside would add its own latency."""
    if size < SMALL and device.type == "cuda":
        iters = max(iters, MIN_SMALL_ITERS)
    x = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(x)
    _sync(torch, device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    _sync(torch, device)  # NCCL returns before the GPU is done
    elapsed = torch.tensor([(time.perf_counter() - started) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _node_results(path: str | None) -> list:
    if not path:
        return []
    with open(path) as file:
        return json.loads(file.read(4 << 20))


def _pair_exchange(dist, torch, device, rank: int, world: int, size: int) -> list[dict]:
    """Every pair of both pairings (nodecheck.pairing) exchanges `size` bytes, all pairs at once: the
    lower rank sends while the higher receives, then the reverse. Each direction is warmed with a
    small message first (NCCL builds a pair's communicator at its first send/recv, which must not be
    timed). Returns what this rank received: [{"round", "src", "dst", "rate"}], timed at the receiver."""
    from nodecheck.pairing import pairings, partner

    buffer = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    small = torch.ones(256, dtype=torch.float32, device=device)
    rounds = pairings(world)
    received = []
    for index in range(len(rounds)):
        other = partner(rounds, index, rank)
        for lower_sends in (True, False):
            sender = None if other is None else (min(rank, other) if lower_sends else max(rank, other))
            for payload, timed in ((small, False), (buffer, True)):
                dist.barrier()
                if other is None:
                    continue  # out of this round (an odd count of nodes)
                if rank == sender:
                    dist.send(payload, dst=other)
                    _sync(torch, device)
                    continue
                started = time.perf_counter()
                dist.recv(payload, src=other)
                _sync(torch, device)
                if timed:
                    received.append({"round": index, "src": other, "dst": rank,
                                     "rate": payload.numel() * 4 / (time.perf_counter() - started)})
    return received


def exchanges_from(received: list[dict]) -> list[dict]:
    """Every rank's receptions -> one record per pair and round: {"round", "a", "b", "a_to_b", "b_to_a"}."""
    pairs: dict[tuple[int, int, int], dict] = {}
    for r in received:
        a, b = sorted((r["src"], r["dst"]))
        entry = pairs.setdefault((r["round"], a, b), {"round": r["round"], "a": a, "b": b})
        entry["a_to_b" if r["src"] == a else "b_to_a"] = r["rate"]
    return [e for _, e in sorted(pairs.items()) if "a_to_b" in e and "b_to_a" in e]


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    return guarded(args.out, lambda: _run(args))


def _run(args) -> dict:
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if args.backend == "nccl":  # one GPU per process: the launcher's LOCAL_RANK
        device = torch.device(f"cuda:{own_gpu(int(os.environ.get('LOCAL_RANK', '0')), torch.cuda.device_count())}")
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        return _measure(args, dist, torch, device)
    finally:  # also when a collective fails: NCCL warns of a leak otherwise, and that warning hid the error
        dist.destroy_process_group()


def own_gpu(local_rank: int, visible: int) -> int:
    """The CUDA ordinal of this rank's GPU: its local rank, which must name a GPU it can see (else CUDA
    only says "invalid device ordinal" once NCCL starts)."""
    if not 0 <= local_rank < visible:
        raise RuntimeError(f"local rank {local_rank} has no GPU of its own: this process sees {visible} CUDA device(s) "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); launch at most "
                           f"{visible} rank(s) per node (torchrun --nproc-per-node, srun --ntasks-per-node)")
    return local_rank


def _measure(args, dist, torch, device) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    me = {"rank": rank, "node": args.node, "nic": args.nic, "address": args.address,
          "nic_spec_bytes_per_second": args.nic_spec or None, "pid": os.getpid(), "results": _node_results(args.node_results)}
    nodes: list = [None] * world
    dist.all_gather_object(nodes, me)
    specs = [n["nic_spec_bytes_per_second"] for n in nodes]
    spec = args.spec or (min(specs) if all(specs) else None)
    factor = 2 * (world - 1) / world
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        seconds = _time_allreduce(dist, torch, device, size, args.warmup, args.iters)
        rows.append({"size_bytes": size, "seconds": seconds, "algbw": size / seconds, "busbw": size / seconds * factor})
    exchanges = []
    if spec and rows and rows[-1]["busbw"] < args.threshold * spec and world > 1:
        received = _pair_exchange(dist, torch, device, rank, world, rows[-1]["size_bytes"])
        gathered: list = [None] * world
        dist.all_gather_object(gathered, received)
        exchanges = exchanges_from([r for part in gathered for r in part])
    return {"world_size": world, "backend": args.backend, "nodes": nodes, "spec_bytes_per_second": spec,
            "rows": rows, "pair_exchanges": exchanges, "rank": rank}


if __name__ == "__main__":
    sys.exit(main())
