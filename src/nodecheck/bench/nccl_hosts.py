"""Which ranks each host of an NCCL debug log ran, read from NCCL's communicator lines ("comm 0x.. rank 3 nranks 16",
from 2.19 "... rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0"), and what that says: hosts that each ran a job of
their own (separate_hosts), or one host NCCL took for several (its lines hold more ranks of one communicator than NCCL
counted per node). Bounded: past MAX_COMM_SIZE ranks or MAX_COMM_SIZES communicator sizes a log is no such case."""

from __future__ import annotations

import re

MAX_COMM_SIZE, MAX_COMM_SIZES = 4096, 64
_LOCAL_RANKS = re.compile(r"\bnNodes (\d{1,7}) localRanks (\d{1,7})\b")  # after "rank R nRanks N" (NCCL 2.19 on)


def note_local_ranks(local_ranks: dict[int, int], size: int, body: str, start: int) -> None:
    """NCCL's count of a communicator's ranks per node, where its line gives one: the largest per size."""
    if (said := _LOCAL_RANKS.search(body, start)) and size <= MAX_COMM_SIZE \
            and (size in local_ranks or len(local_ranks) < MAX_COMM_SIZES):
        local_ranks[size] = max(local_ranks.get(size, 0), int(said[2]))


def separate_hosts(comms: dict[int, dict[str, set[int]]]) -> str | None:
    """Why no communicator of the log spans its hosts, or None: every host shows whole communicators of the same sizes
    and ranks (rank 0 to N-1 of an N-rank one on each: each host ran a job of its own, as an nccl-tests built without
    MPI=1 does under mpirun), and no channel went through the network. A paste that shows part of a communicator on a
    host says nothing."""
    if not comms or any(len(hosts) < 2 for hosts in comms.values()):
        return None
    for size, hosts in comms.items():
        if any(ranks != set(range(size)) for ranks in hosts.values()):
            return None
    size = min(comms)
    first, second = list(comms[size])[:2]
    return f"ranks 0 to {size - 1} of {size} on {first[:60]} and again on {second[:60]}"


def host_split(comms: dict[int, dict[str, set[int]]], local_ranks: dict[int, int]) -> tuple[str | None, bool]:
    """(why NCCL took one host for several, or None; whether NCCL's per-node count holds every rank each host printed).
    A host printing more ranks of one communicator than NCCL's localRanks for it is a host NCCL split; every host
    within it is a log of part of a job across nodes, as NCCL itself counted them. Neither where NCCL gave no count."""
    counted = [(size, hosts) for size, hosts in comms.items() if local_ranks.get(size)]
    for size, hosts in counted:
        for host, ranks in hosts.items():
            if len(ranks) > local_ranks[size]:
                return (f"{host[:60]} printed {len(ranks)} ranks of a {size}-rank communicator, for which NCCL counted "
                        f"{local_ranks[size]} per node (localRanks)"), False
    return None, bool(counted)
