"""One rank of the all-reduce test, in its own process (the only place torch is imported).

Launched by nodecheck's bench runner with the torch.distributed environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) of the job. Every rank writes the gathered results of all ranks as JSON to
--out, so each node can report what it saw; rank 0's copy is the cluster's.

busbw = algbw x 2(n-1)/n, the nccl-tests convention (seed 002): it is comparable to one link's rate
whatever the number of ranks. When busbw falls below the threshold, the nodes exchange buffers in two
pairings (nodecheck.core.pairing), local rank k with local rank k, both directions, all pairs at once: two
rounds for any node count, and a slow rank 0 is named like any other node.

Before the first collective every rank checks what it needs (its GPU) and puts "ready" or its own error
in the job's store; rank 0 waits for all of them (READY_WAIT) and calls the test off naming the rank that
failed or never came, so ranks fail fast together instead of each timing out in NCCL's initialisation.
The store's time limit (--init-timeout) is apart from the collectives' (--timeout).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import socket
import sys
import time

from nodecheck.bench.heartbeat import EVERY_RANK_READS, STORE_TIMEOUT_S, Heartbeat, ranks_text, step, suspect_after
from nodecheck.bench.lifeline import hold, runner_deadline
from nodecheck.bench.results import essential, guarded
from nodecheck.core import typed_json
from nodecheck.core.units import format_size


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
    parser.add_argument("--rails", default="[]", help='JSON [{"name", "rate", "link", "link_rate"}]: the NICs this rank\'s traffic leaves by, bytes/s (assemble/rails.py)')
    parser.add_argument("--nvlink", default="null", help='JSON {"domain", "rate"}: the multi-node NVLink domain this rank\'s GPU is in (assemble/rails.py rank_nvlink)')
    parser.add_argument("--gpu-uuid", default=None, help="this rank's GPU (NVML UUID), matched among the CUDA devices it sees")
    parser.add_argument("--gpu-ordinal", type=int, default=None, help="this rank's CUDA ordinal when the UUID cannot be matched")
    parser.add_argument("--init-timeout", type=float, default=None, help="seconds for the ranks to meet (default: --timeout)")
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
    what = f"all-reduce of {format_size(size)}"
    for call in range(warmup):
        step(f"{what}: warm-up call {call + 1} of {warmup}")
        dist.all_reduce(x)
    step(f"{what}: waiting for the warm-up to finish")
    _sync(torch, device)
    step(f"{what}: barrier before timing")
    dist.barrier()
    started = time.perf_counter()
    for call in range(iters):
        step(f"{what}: timed call {call + 1} of {iters}")
        dist.all_reduce(x)
    step(f"{what}: waiting for the timed calls to finish")
    _sync(torch, device)  # NCCL returns before the GPU is done
    step(f"{what}: taking the slowest rank's time")
    elapsed = torch.tensor([(time.perf_counter() - started) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _check_data(dist, torch, device, world: int, size: int) -> dict:
    """After timing, one all-reduce of ones checked, as nccl-tests' -c 1 does: every element must equal the
    world size on every rank (a corrupting link or GPU passes at full speed otherwise). Every rank learns
    the total of wrong elements."""
    x = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    step(f"data check: all-reduce of {format_size(size)}")
    dist.all_reduce(x)
    step("data check: summing the wrong elements")
    wrong = torch.tensor([int((x != world).sum().item())], dtype=torch.int64, device=device)
    dist.all_reduce(wrong)
    return {"expected": world, "elements": x.numel() * world, "wrong_elements": int(wrong.item())}


def _node_results(path: str | None) -> list:
    if not path:
        return []
    with open(path) as file:
        return typed_json.loads(file.read(4 << 20))


def _pair_exchange(dist, torch, device, rank: int, rounds: list, size: int) -> list[dict]:
    """Every pair of the rounds (nodecheck.core.pairing.rank_rounds) exchanges `size` bytes, all pairs at once:
    the lower rank sends while the higher receives, then the reverse. Each direction is warmed with a
    small message first (NCCL builds a pair's communicator at its first send/recv, which must not be
    timed). Returns what this rank received: [{"round", "src", "dst", "rate"}], timed at the receiver."""
    from nodecheck.core.pairing import partner

    buffer = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    small = torch.ones(256, dtype=torch.float32, device=device)
    received = []
    for index in range(len(rounds)):
        other = partner(rounds, index, rank)
        for lower_sends in (True, False):
            sender = None if other is None else (min(rank, other) if lower_sends else max(rank, other))
            for payload, timed in ((small, False), (buffer, True)):
                step(f"pair exchange round {index}: barrier")
                dist.barrier()
                if other is None:
                    continue  # out of this round (an odd count of nodes)
                step(f"pair exchange round {index}: {'timed' if timed else 'warm-up'} send from rank {sender} "
                     f"to rank {rank + other - sender}")
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


def exchanges_from(received: list[dict], members: list[dict], rounds: list) -> list[dict]:
    """Every rank's receptions -> one record per pair and round: {"round", "a", "b", "a_to_b", "b_to_a",
    "spec"}, spec being what that exchange's rails allow (nodecheck.core.pairing.exchange_spec)."""
    from nodecheck.core.pairing import exchange_spec

    pairs: dict[tuple[int, int, int], dict] = {}
    for r in received:
        a, b = sorted((r["src"], r["dst"]))
        entry = pairs.setdefault((r["round"], a, b), {"round": r["round"], "a": a, "b": b,
                                                      "spec": exchange_spec(members, rounds[r["round"]], a, b)})
        entry["a_to_b" if r["src"] == a else "b_to_a"] = r["rate"]
    return [e for _, e in sorted(pairs.items()) if "a_to_b" in e and "b_to_a" in e]


def main(argv: list[str] | None = None) -> int:
    hold()  # dies with the runner, before torch takes seconds to import
    args = _args(sys.argv[1:] if argv is None else argv)
    return guarded(args.out, lambda: _run(args))


READY_WAIT = 30.0  # seconds rank 0 waits for every rank's ready key (or error) before the first collective


def _run(args) -> dict:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    step("meeting the other ranks in the job's store")
    store = _store(dist, rank, world, args.init_timeout or args.timeout)
    heartbeat = _heartbeat(dist, args, rank, world)
    try:
        step("preparing this rank's device" if rank else "preparing this rank's device, then waiting for every rank to be ready")
        device = _ready(store, rank, world, args.node, lambda: _own_device(torch, args), min(READY_WAIT, args.init_timeout or args.timeout))
        if heartbeat:  # the ranks met (_ready named any that did not): a stall from here on is read out
            heartbeat.arm()
        with _explained(heartbeat):
            step(f"joining the {args.backend} process group")
            dist.init_process_group(args.backend, store=dist.PrefixStore("nodecheck/pg", store), rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=args.timeout))
        try:
            with _explained(heartbeat):
                return _measure(args, dist, torch, device)
        finally:  # also when a collective fails: NCCL warns of a leak otherwise, and that warning hid the error
            step("leaving the process group")
            dist.destroy_process_group()
    finally:
        if heartbeat:
            heartbeat.stop()


@contextlib.contextmanager
def _explained(heartbeat: Heartbeat | None):
    """A failure inside (the group's rendezvous or a collective failed or timed out) waits for the heartbeat to
    name who stopped, while the failed step is still the current one, so the runner finds it beside the error."""
    try:
        yield
    except BaseException:
        if heartbeat:
            heartbeat.explain()
        raise


def _heartbeat(dist, args, rank: int, world: int) -> Heartbeat | None:
    """This rank's beat thread (nodecheck.bench.heartbeat), on its own client of the job's store; none for a
    world of one."""
    if world < 2:
        return None

    def connect():
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                             timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False)

    reads = world <= EVERY_RANK_READS or rank == 0 or os.environ.get("LOCAL_RANK", "0") == "0"  # bounded store load
    return Heartbeat(connect, rank, world, args.node, args.out, suspect_after(args.timeout), runner_deadline(),
                     reads=reads).start()


def _boot_id() -> str | None:
    """This machine's boot id: ranks that share it run on one machine, whatever their host names say (two
    containers may share one name, and MASTER_ADDR may be a name, leaving no address to tell them apart)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            return file.read(64).strip() or None
    except OSError:
        return None


def _store(dist, rank: int, world: int, timeout: float):
    """The job's key-value store at MASTER_ADDR:MASTER_PORT, rank 0 its server; under torchrun with its
    agent's store (TORCHELASTIC_USE_AGENT_STORE), torchrun serves it and every rank is a client, as
    torch's own env:// initialisation does."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=rank == 0 and not agent,
                         timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)


def _ready(store, rank: int, world: int, node: str, prepare, wait: float):
    """Run `prepare` (this rank's own checks: its GPU), then meet the other ranks in the store: each puts
    "ready" or its error; rank 0 waits up to `wait` seconds for all and says "go" or why not; the others
    wait for that word. Raises naming the rank that failed or never came. Returns what `prepare` gave."""
    try:
        prepared = prepare()
    except Exception as error:
        store.set(f"nodecheck/error/{rank}", json.dumps({"node": node, "message": essential(str(error))[:500]}))
        if rank == 0:
            store.set("nodecheck/verdict", json.dumps({"go": False, "why": f"rank 0 ({node}) failed first"}))
        raise
    store.set(f"nodecheck/ready/{rank}", node)
    if rank == 0:
        why = _wait_for_ranks(store, world, wait)
        store.set("nodecheck/verdict", json.dumps({"go": why is None, "why": why}))
        if why:
            raise RuntimeError(why)
        return prepared
    store.wait(["nodecheck/verdict"])
    verdict = typed_json.loads(store.get("nodecheck/verdict"))
    if not verdict.get("go"):
        raise RuntimeError(f"rank 0 called the test off: {verdict.get('why')}")
    return prepared


def _wait_for_ranks(store, world: int, wait: float) -> str | None:
    """None when every rank said ready within `wait` seconds; else what went wrong, naming the ranks."""
    deadline = time.monotonic() + wait
    pending = set(range(world))
    errors = []
    while pending and time.monotonic() < deadline:
        for rank in sorted(pending):
            if store.check([f"nodecheck/error/{rank}"]):
                said = typed_json.loads(store.get(f"nodecheck/error/{rank}"))
                errors.append(f"rank {rank} ({said.get('node')}): {said.get('message')}")
                pending.discard(rank)
            elif store.check([f"nodecheck/ready/{rank}"]):
                pending.discard(rank)
        if errors:
            break
        if pending:
            time.sleep(0.1)
    if errors:
        return "; ".join(errors)
    if pending:
        return (f"{ranks_text(sorted(pending))} of {world} never reported ready within {wait:g} s: not started (check the launcher "
                "on their nodes) or stuck before reaching the store")
    return None


def _own_device(torch, args):
    """This rank's device: the CPU for gloo; for NCCL the GPU the runner named (by UUID, else its CUDA
    ordinal: LOCAL_RANK, or the one GPU a task sees under srun --gpus-per-task=1)."""
    if args.backend != "nccl":
        return torch.device("cpu")
    from nodecheck.bench.gpu_worker import cuda_devices, hidden_by_environment
    from nodecheck.bench.identity import pick_cuda_device

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available to torch: no GPU visible or no driver" + hidden_by_environment(os.environ))
    visible = torch.cuda.device_count()
    ordinal = args.gpu_ordinal if args.gpu_ordinal is not None else own_gpu(int(os.environ.get("LOCAL_RANK", "0")), visible)
    ordinal, _how = pick_cuda_device(cuda_devices(torch), args.gpu_uuid, None, ordinal)
    device = torch.device(f"cuda:{ordinal}")
    torch.cuda.set_device(device)
    return device


def own_gpu(local_rank: int, visible: int) -> int:
    """The CUDA ordinal of this rank's GPU: its local rank, which must name a GPU it can see (else CUDA
    only says "invalid device ordinal" once NCCL starts); with one GPU visible (srun --gpus-per-task=1),
    that one."""
    if visible == 1:
        return 0
    if not 0 <= local_rank < visible:
        raise RuntimeError(f"local rank {local_rank} has no GPU of its own: this process sees {visible} CUDA device(s) "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); launch at most "
                           f"{visible} rank(s) per node (torchrun --nproc-per-node, srun --ntasks-per-node)")
    return local_rank


def _measure(args, dist, torch, device) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    from nodecheck.core.pairing import job_bound, rank_rounds

    me = {"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0") or 0), "node": args.node, "nic": args.nic,
          "address": args.address, "rails": json.loads(args.rails), "pid": os.getpid(), "boot_id": _boot_id(),
          "results": _node_results(args.node_results)}
    nvlink = json.loads(args.nvlink)
    if nvlink:
        me["nvlink"] = nvlink
    nodes: list = [None] * world
    step("gathering every rank's description")
    dist.all_gather_object(nodes, me)
    spec = args.spec or job_bound(nodes)
    factor = 2 * (world - 1) / world
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        seconds = _time_allreduce(dist, torch, device, size, args.warmup, args.iters)
        rows.append({"size_bytes": size, "seconds": seconds, "algbw": size / seconds, "busbw": size / seconds * factor})
    exchanges = []
    data_check = _check_data(dist, torch, device, world, rows[-1]["size_bytes"] if rows else 1024)
    rounds = rank_rounds(nodes)
    if spec and rows and rows[-1]["busbw"] < args.threshold * spec and rounds:
        received = _pair_exchange(dist, torch, device, rank, rounds, rows[-1]["size_bytes"])
        gathered: list = [None] * world
        step("gathering the pair exchanges")
        dist.all_gather_object(gathered, received)
        exchanges = exchanges_from([r for part in gathered for r in part], nodes, rounds)
    return {"world_size": world, "backend": args.backend, "nodes": nodes, "spec_bytes_per_second": spec,
            "rows": rows, "pair_exchanges": exchanges, "rank": rank, "data_check": data_check}


if __name__ == "__main__":
    sys.exit(main())
