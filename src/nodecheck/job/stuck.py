"""Stuck and missing ranks from NCCL RAS's reports (job/ras.py), several queries read together.

- A job process or rank RAS got no data from (INCOMPLETE: "Missing communicator data"): named, as RAS lists it.
- A rank *behind* the majority of its communicator by two or more operations (MISMATCH) in two or more queries: named
  stuck. One operation behind is a collective in flight; behind in one query only is said, not named: a second
  query some seconds later tells a stuck rank from a slow one.
- A minority *ahead* of the majority (NVIDIA/nccl#1911: 2 ranks launched AllGather 641 while 30 were at 640) has
  launched the next operation first: it names nobody.
- A rank holding an NCCL error (the JSON form's async_error or init_state, ncclResult_t): named, with the error. A
  rank holding only ncclRemoteError was told of another's failure: said, not named (the failing one is named, or is
  among the missing)."""

from __future__ import annotations

from collections import defaultdict

from nodecheck.job.ranks import Named
from nodecheck.job.ras import RasReport
from nodecheck.job.ras_json import REMOTE, RESULTS

_MISSING = {  # what RAS says of a missing rank (the JSON form's status; the text form says only that it is missing)
    None: "sent RAS no communicator data: it is dead, hung outside NCCL, or cut off from the others",
    "unresponsive": "did not answer RAS (unresponsive): hung, overloaded or cut off from the others",
    "dead": "is considered dead by RAS (no answer past its timeout): the process or its node is gone",
}
BEHIND = 2  # operations behind the majority before a rank is waited for rather than in flight


def judge_ras(reports: list[RasReport]) -> tuple[list[Named], list[str]]:
    named: dict[tuple[str, int], Named] = {}
    notes: list[str] = []
    latest = reports[-1]
    missing = latest.missing_processes + [r for comm in latest.comms for r in comm.missing]
    for rank in sorted(missing, key=lambda r: list(_MISSING).index(r.status if r.status in _MISSING else None)):  # the gravest last
        entry = named.setdefault((rank.node, rank.pid), Named("missing", rank.node, rank.pid, rank.rank, [], [], 1.0, 1, gpu=rank.gpu))
        entry.rank = entry.rank if entry.rank is not None else rank.rank  # the job-wide line names no rank; a communicator's does
        entry.message = f"process {rank.pid} on node {rank.node} (GPU {rank.gpu}) {_MISSING.get(rank.status, _MISSING[None])}"
    remote = []
    for rank in (r for comm in latest.comms for r in comm.errored):
        if rank.status.endswith(RESULTS[REMOTE]):
            remote.append(rank)
            continue
        entry = named.setdefault((rank.node, rank.pid), Named("error", rank.node, rank.pid, rank.rank, [], [], 1.0, 1, gpu=rank.gpu))
        entry.message = (f"rank {rank.rank} ({rank.node}, pid {rank.pid}, GPU {rank.gpu}) holds {rank.status.split()[-1]}: "
                         "NCCL failed on it (its log says where)")
    if remote:
        notes.append(f"{len(remote)} rank(s) hold ncclRemoteError (e.g. rank {remote[0].rank} on {remote[0].node}): they were told of "
                     "another rank's failure, so they are not named")
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
