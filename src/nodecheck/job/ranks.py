"""Which rank holds a job back, from NCCL Inspector's per-rank records of the same collectives.

Late arrival (a slow host, a data loader, a GPU that braked during compute): a collective cannot finish on any rank
before the last rank joins it, and with kernel timing (coll_timing_source kernel_gpu) each rank's time runs from its
own kernel's start, so every rank's time includes its wait for the late one and the late rank's is the *shortest*.
Each operation is matched across ranks by (communicator, collective, sequence number: Inspector counts coll_sn per
collective type), and the rank that is shortest, by a lead above clock noise, in most of a communicator's operations
is named. The rank with the lowest bus bandwidth (ROCm cvs's rule) is one that waited longest, never the late one.

A slow link slows every rank of a communicator alike, so no rank inside it stands out: across communicators of one
shape (collective, size class, rank count) the slow ones share the culprit. The host common to every slow
communicator and to no fast one is named."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from nodecheck.job.inspector import KERNEL_TIMING, Op

MIN_OPS = 8  # complete operations of a communicator before a rank can be called persistently late
LATE_SHARE = 0.5  # shortest in at least half of them: a majority, where chance among n ranks is 1/n
MIN_LEAD = 0.05  # its lead over the median rank, as a share of the median time: a wait, not timer noise
SLOW_RATIO = 0.8  # a communicator below 0.8 of the median bus bandwidth of its shape (the project's 80% rule)
MIN_PEERS = 3  # communicators of one shape needed to tell the slow ones


@dataclass
class Named:
    why: str  # "late" or "slow_link"
    host: str
    pid: int | None
    rank: int | None  # in the first communicator it was named in; None for a host named by its communicators
    comms: list[str]
    colls: list[str]
    share: float  # late: of the operations it was shortest in; slow_link: the slow communicators' bus bandwidth / their shape's median
    ops: int
    lead_us: float | None = None  # late: the median lead of its shortest operations over the median rank
    message: str = ""
    gpu: str | None = None  # the GPU RAS says the process manages (its CUDA index, as RAS prints it)
    because: list[str] = field(default_factory=list)  # what its node's Report says of its GPU, rails and node (job/why.py)


@dataclass
class JobVerdict:
    named: list[Named] = field(default_factory=list)
    comms: int = 0
    ops: int = 0  # complete operations compared (every rank's record present)
    notes: list[str] = field(default_factory=list)  # what could not be judged, and why


def judge_job(ops: list[Op]) -> JobVerdict:
    verdict = JobVerdict()
    timed = [op for op in ops if op.timing in (KERNEL_TIMING, None)]
    if len(timed) < len(ops):
        verdict.notes.append(f"{len(ops) - len(timed)} record(s) timed on the CPU (kernel_cpu, collective_cpu): their times do not hold "
                             "each rank's wait, so they name no rank (NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING=1 keeps only kernel timing)")
    if any(op.timing is None for op in timed):
        verdict.notes.append("records without coll_timing_source (an Inspector before v4.2): taken as kernel timing")
    groups = complete_ops(timed, verdict)
    verdict.comms = len({comm for comm, _, _ in groups})
    verdict.ops = len(groups)
    verdict.named = _merge(_late(groups)) + _slow_links(groups)
    return verdict


def complete_ops(ops: list[Op], verdict: JobVerdict) -> dict[tuple[str, str, int], dict[int, Op]]:
    """(comm, coll, sn) -> {rank: its record}, for the operations every rank of the communicator recorded."""
    groups: dict[tuple[str, str, int], dict[int, Op]] = defaultdict(dict)
    for op in ops:
        groups[(op.comm, op.coll, op.sn)].setdefault(op.rank, op)
    complete = {key: ranks for key, ranks in groups.items() if len(ranks) == next(iter(ranks.values())).n_ranks > 1}
    if len(complete) < len(groups):
        verdict.notes.append(f"{len(groups) - len(complete)} operation(s) without every rank's record (a file not given, a ring "
                             "that overwrote records, a one-rank communicator): not compared")
    return complete


def _late(groups: dict) -> list[Named]:
    by_comm: dict[str, list[dict[int, Op]]] = defaultdict(list)
    for (comm, _, _), ranks in groups.items():
        by_comm[comm].append(ranks)
    named = []
    for comm, operations in by_comm.items():
        if len(operations) < MIN_OPS:
            continue
        leads: dict[int, list[float]] = defaultdict(list)
        for ranks in operations:
            times = sorted((op.exec_us, rank) for rank, op in ranks.items())
            median = statistics.median(t for t, _ in times)
            if median > 0 and median - times[0][0] >= MIN_LEAD * median and times[0][0] < times[1][0]:
                leads[times[0][1]].append(median - times[0][0])
        for rank, lead in leads.items():
            share = len(lead) / len(operations)
            if share >= LATE_SHARE:
                op = operations[0][rank]
                colls = sorted({next(iter(r.values())).coll for r in operations})
                named.append(Named("late", op.host, op.pid, rank, [comm], colls, share, len(operations), statistics.median(lead)))
    return named


def _merge(named: list[Named]) -> list[Named]:
    """One entry per process late in several communicators."""
    by_process: dict[tuple[str, int | None], Named] = {}
    for entry in named:
        seen = by_process.get((entry.host, entry.pid))
        if seen is None:
            by_process[(entry.host, entry.pid)] = entry
            continue
        seen.comms += entry.comms
        seen.colls = sorted(set(seen.colls) | set(entry.colls))
        seen.share = (seen.share * seen.ops + entry.share * entry.ops) / (seen.ops + entry.ops)
        seen.ops += entry.ops
        seen.lead_us = max(seen.lead_us or 0, entry.lead_us or 0)
    for entry in by_process.values():
        where = f"rank {entry.rank} ({entry.host}, pid {entry.pid})"
        entry.message = (f"{where} late in {entry.share:.0%} of {entry.ops} {'/'.join(entry.colls)} operation(s) of "
                         f"{len(entry.comms)} communicator(s) by {entry.lead_us / 1000:.3g} ms (median lead): every other rank waits for it")
    return list(by_process.values())


def _slow_links(groups: dict) -> list[Named]:
    """Each communicator's bus bandwidth (per operation the best rank's, which waited least) against its shape's
    median; the process in every slow communicator, of any shape, and in no fast one is named: a data-parallel and a
    tensor-parallel communicator both slow share exactly the process (the GPU, its NIC) that slows them."""
    speeds: dict[str, list[float]] = defaultdict(list)
    shape_of: dict[str, tuple] = {}
    members: dict[str, dict[tuple[str, int], int]] = defaultdict(dict)  # comm -> {(host, pid): rank}
    for (comm, coll, _), ranks in groups.items():
        rates = [op.busbw for op in ranks.values() if op.busbw]
        if rates:
            speeds[comm].append(max(rates))
        first = next(iter(ranks.values()))
        shape_of.setdefault(comm, (coll, first.size.bit_length(), first.n_ranks))
        members[comm].update({(op.host, op.pid): op.rank for op in ranks.values()})
    by_shape: dict[tuple, list[tuple[str, float]]] = defaultdict(list)
    for comm, rates in speeds.items():
        by_shape[shape_of[comm]].append((comm, statistics.median(rates)))
    slow, fast = {}, set()
    for comms in by_shape.values():
        if len(comms) < MIN_PEERS:
            continue
        median = statistics.median(rate for _, rate in comms)
        for comm, rate in comms:
            if rate < SLOW_RATIO * median:
                slow[comm] = rate / median
            else:
                fast.add(comm)
    if not slow:
        return []
    culprits = set.intersection(*(set(members[comm]) for comm in slow)) - set().union(*(set(members[comm]) for comm in fast))
    if not culprits or any(len(culprits) == len(members[comm]) for comm in slow):
        return []  # no one process apart: every member of a lone slow communicator is as suspect as the next
    comms = sorted(slow)
    ratio = statistics.median(slow.values())
    colls = sorted({shape_of[comm][0] for comm in comms})
    return [Named("slow_link", host, pid, members[comms[0]][(host, pid)], comms, colls, ratio, len(comms),
                  message=f"rank {members[comms[0]][(host, pid)]} ({host}, pid {pid}) is in every slow communicator ({len(comms)}, "
                          f"{ratio:.2f} of their peers' median bus bandwidth) and in no fast one: its GPU's links or NIC slow them")
            for host, pid in sorted(culprits)]
