"""What an nccl-tests log's rows say of their run: the collective (its own words, the file's name, else the rows'
busbw/algbw ratio) and the rank count that ratio gives."""

from __future__ import annotations

import math
import re

from nodecheck.bench.nccl_tests import NcclLog

# busbw = algbw x this factor of the rank count n (nccl-tests doc/PERFORMANCE.md): 2(n-1)/n for all-reduce,
# (n-1)/n for all-gather, reduce-scatter and alltoall, 1 for broadcast, reduce and sendrecv (no n in it)
_TWO_RING = ("all_reduce",)
# alltoallv (nccl-tests 2.18.5): algbw is the busiest rank's bytes over the time, busbw that x (n-1)/n; its traffic is
# uneven by design (NCCL_TESTS_ALLTOALLV_SPREAD), so no link bounds it as it bounds alltoall
_ONE_RING = ("all_gather", "reduce_scatter", "alltoall", "alltoallv", "gather", "scatter", "hypercube")
COLLECTIVES = (*_TWO_RING, *_ONE_RING, "broadcast", "reduce", "sendrecv")
_COLLECTIVE_NAME = re.compile(r"(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all_?v|all_?to_?all|broadcast|reduce|sendrecv|gather|scatter"
                              r"|hypercube)(?:_perf)?", re.IGNORECASE)
ROUNDING = 0.005  # nccl-tests prints algbw and busbw with two decimals


def collective_name(text: str | None) -> str | None:
    """"all_reduce_perf", "AllReduce", "alltoall_perf.txt" -> the canonical name (all_reduce, alltoall ...); None."""
    match = _COLLECTIVE_NAME.search((text or "")[:300])
    if not match:
        return None
    word = match[1].lower().replace("_", "")
    return next(c for c in COLLECTIVES if c.replace("_", "") == word)


def collective_of(log: NcclLog, hint: str | None = None) -> tuple[str | None, str]:
    """(the collective, how it is known): the log's own words, else the file's name (`alltoall_perf.txt`), else its
    rows: a reduction (a redop) whose busbw is below its algbw is a reduce-scatter ((n-1)/n), else an all-reduce
    (2(n-1)/n, equal at 2 ranks, where a reduce is bounded alike); rows without a redop do not tell all-gather from
    alltoall: (None, why)."""
    if named := collective_name(log.collective):
        return named, "named in the log"
    if named := collective_name(hint):
        return named, f"from the file name {hint[:80]!r}"
    timings = [r.out_of_place for r in log.rows if r.out_of_place and r.out_of_place.algbw_gbytes >= 1]
    if timings and any(r.redop for r in log.rows):
        if all(t.busbw_gbytes < t.algbw_gbytes - 2 * ROUNDING for t in timings):
            return "reduce_scatter", "its rows reduce (a redop) and their busbw is below algbw"
        return "all_reduce", "its rows reduce (a redop) and their busbw is algbw x 2(n-1)/n"
    return None, "not named in the log or its file name, and its rows do not settle it"


def ranks_from_rows(log: NcclLog, collective: str | None) -> tuple[int, int] | None:
    """The rank count n the rows' busbw/algbw ratio gives (busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for
    all-gather, reduce-scatter and alltoall), as (least, most) over the rows' two-decimal rounding, narrowed over the
    largest rows; None where the collective's factor has no n or no row is large enough to say."""
    if collective not in _TWO_RING + _ONE_RING:
        return None
    scale = 2.0 if collective in _TWO_RING else 1.0
    timings = sorted((r.out_of_place for r in log.rows if r.out_of_place and r.out_of_place.algbw_gbytes >= 1),
                     key=lambda t: -t.algbw_gbytes)[:8]
    if scale == 1.0 and timings and timings[0].algbw_gbytes >= 100 and timings[0].busbw_gbytes == timings[0].algbw_gbytes:
        # nccl-tests before 2020 (ec1b5e2) wrote all-gather's and reduce-scatter's busbw as their algbw (factor 1):
        # equal at 100 GB/s, today's (n-1)/n would mean 20,000 ranks (nccl-tests#37: 8 V100, 129.05 and 129.05)
        return None
    least, most = 1, 1 << 30
    for t in timings:
        low = (t.busbw_gbytes - ROUNDING) / (t.algbw_gbytes + ROUNDING) / scale
        high = (t.busbw_gbytes + ROUNDING) / (t.algbw_gbytes - ROUNDING) / scale
        if low >= 1:
            return None  # busbw/algbw past the factor's limit: not this collective's rows
        least = max(least, math.ceil(1 / (1 - low) - 1e-9))
        most = min(most, math.floor(1 / (1 - high) + 1e-9) if high < 1 else most)
    return (least, most) if timings and least <= most else None
