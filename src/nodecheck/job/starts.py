"""The late rank from Inspector's verbose traces (NCCL_INSPECTOR_DUMP_VERBOSE=1: event_trace_ts.coll_start_ts, when
the rank called the collective, in microseconds of its host's clock): the rank that joins an operation last has the
latest start. Unlike the kernel-time rule (job/ranks.py) it holds for records timed on the CPU as well.

Start times of two hosts compare only when their clocks agree. RAS's verbose report says so: "Travel times (valid only
if system clocks are synchronized between nodes)" and a warning when a travel time is negative (job/ras.py reads
`clocks`). Without a report that says they agree, starts are compared only between ranks of one host (one clock)."""

from __future__ import annotations

import statistics
from collections import defaultdict

from nodecheck.job.inspector import Op
from nodecheck.job.ranks import LATE_SHARE, MIN_LEAD, MIN_OPS, JobVerdict, Named, complete_ops
from nodecheck.job.ras import RasReport

SYNCHRONIZED = "synchronized"


def clocks_said(reports: list[RasReport]) -> str | None:
    """What the RAS reports given say of the hosts' clocks: one that saw them disagree outweighs any that did not."""
    said = {report.clocks for report in reports if report.clocks}
    return "not synchronized" if "not synchronized" in said else SYNCHRONIZED if said else None


def late_by_start(ops: list[Op], clocks: str | None, verdict: JobVerdict) -> None:
    """Add to the verdict: a rank named late by its start times, or the start times' word on one named by its kernels."""
    started = [op for op in ops if op.start_ts is not None]
    if not started:
        return
    groups = complete_ops(started, JobVerdict())
    across = clocks == SYNCHRONIZED
    verdict.notes.append("verbose start times compared across hosts: RAS saw the hosts' clocks agree" if across else
                         "verbose start times compared only between ranks of one host: "
                         + ("RAS saw the hosts' clocks disagree (negative travel times)" if clocks else
                            "no verbose RAS report (ncclras -v) says the hosts' clocks agree"))
    by_comm: dict[str, list[dict[int, Op]]] = defaultdict(list)
    for (comm, _, _), ranks in groups.items():
        by_comm[comm].append(ranks)
    for comm, operations in by_comm.items():
        latest: dict[int, list[float]] = defaultdict(list)
        judged = 0
        for ranks in operations:
            domains = [list(ranks.values())] if across else _by_host(ranks.values())
            domains = [d for d in domains if len(d) > 1]
            if not domains:
                continue
            judged += 1
            work = statistics.median(op.exec_us for op in ranks.values())
            for domain in domains:
                starts = sorted((op.start_ts, op.rank) for op in domain)
                median = statistics.median(t for t, _ in starts)
                lead = starts[-1][0] - median
                if lead >= MIN_LEAD * work and starts[-1][0] > starts[-2][0]:
                    latest[starts[-1][1]].append(lead)
        for rank, leads in latest.items():
            if judged >= MIN_OPS and len(leads) / judged >= LATE_SHARE:
                _name(verdict, operations[0][rank], comm, len(leads) / judged, judged, statistics.median(leads), across)


def _by_host(ops) -> list[list[Op]]:
    hosts: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        hosts[op.host].append(op)
    return list(hosts.values())


def _name(verdict: JobVerdict, op: Op, comm: str, share: float, judged: int, lead: float, across: bool) -> None:
    said = (f"its collectives started latest{'' if across else ' of its host'} in {share:.0%} of {judged} verbose operation(s) "
            f"of {comm}, by {lead / 1000:.3g} ms")
    for entry in verdict.named:
        if entry.why == "late" and (entry.host, entry.pid) == (op.host, op.pid):
            entry.message += f"; {said}"
            return
    verdict.named.append(Named("late", op.host, op.pid, op.rank, [comm], [op.coll], share, judged, lead,
                               message=f"rank {op.rank} ({op.host}, pid {op.pid}): {said}: every other rank waits for it"))
