"""Stuck and missing ranks from NCCL RAS's reports (job/ras.py), several queries read together.

- A job process or rank RAS got no data from (INCOMPLETE: "Missing communicator data"): named, as RAS lists it.
- A rank *behind* the majority of its communicator by two or more operations (MISMATCH) in two or more queries: named
  stuck. One operation behind is a collective in flight; behind in one query only is said, not named: a second
  query some seconds later tells a stuck rank from a slow one.
- A minority *ahead* of the majority (NVIDIA/nccl#1911: 2 ranks launched AllGather 641 while 30 were at 640) has
  launched the next operation first: it names nobody."""

from __future__ import annotations

from collections import defaultdict

from nodecheck.job.ranks import Named
from nodecheck.job.ras import RasReport

BEHIND = 2  # operations behind the majority before a rank is waited for rather than in flight


def judge_ras(reports: list[RasReport]) -> tuple[list[Named], list[str]]:
    named: dict[tuple[str, int], Named] = {}
    notes: list[str] = []
    latest = reports[-1]
    for rank in latest.missing_processes + [r for comm in latest.comms for r in comm.missing]:
        entry = named.setdefault((rank.node, rank.pid), Named("missing", rank.node, rank.pid, rank.rank, [], [], 1.0, 1, gpu=rank.gpu))
        entry.rank = entry.rank if entry.rank is not None else rank.rank  # the job-wide line names no rank; a communicator's does
        entry.message = (f"process {rank.pid} on node {rank.node} (GPU {rank.gpu}) sent RAS no communicator data: it is dead, "
                         "hung outside NCCL, or cut off from the others")
    behind: dict[tuple, list[int]] = defaultdict(list)  # (comm, coll, node, pid, rank) -> how far behind, per query
    gpus: dict[tuple[str, int], str] = {}
    for query, report in enumerate(reports):
        for comm in report.comms:
            if len(comm.counts) < 2:
                continue
            majority = max(comm.counts, key=lambda c: c.ranks)
            for count in comm.counts:
                lag = majority.operation - count.operation
                if count is majority or not count.listed:
                    continue
                if lag < 0:
                    notes.append(f"query {query + 1}: {count.ranks} rank(s) of #{comm.group}-{comm.index} ahead of the majority by "
                                 f"{-lag} {comm.coll or ''} operation(s): they launched the next one first, which names nobody")
                elif lag >= BEHIND:
                    for rank in count.listed:
                        gpus[(rank.node, rank.pid)] = rank.gpu
                        behind[(comm.comm_id, comm.coll, rank.node, rank.pid, rank.rank)].append(lag)
    for (comm_id, coll, node, pid, rank), lags in behind.items():
        if len(lags) < 2:
            notes.append(f"rank {rank} ({node}, pid {pid}) {lags[0]} {coll or ''} operation(s) behind in one query: query RAS again "
                         "(30 s or more later) to tell a stuck rank from a slow one")
            continue
        entry = named.setdefault((node, pid), Named("stuck", node, pid, rank, [], [coll] if coll else [], 1.0, len(lags),
                                                    gpu=gpus.get((node, pid))))
        entry.comms.append(comm_id)
        entry.message = (f"rank {rank} ({node}, pid {pid}) behind its communicator's majority by {min(lags)}-{max(lags)} "
                         f"{coll or ''} operation(s) in {len(lags)} queries: the others wait for it")
    return list(named.values()), notes
