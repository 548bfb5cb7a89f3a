"""benchmarks/stopped_peer.py: when a rank whose peer stopped ends, and what it says. On the lent H100 (NCCL over
NET/Socket, 2026-11-28) it measured the watchdog's line at the process group's timeout and the abort 65 s after;
here it runs with gloo on CPUs, for real: two ranks, rank 1 SIGSTOPped between two all-reduces."""

import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import stopped_peer  # noqa: E402


def test_rank_0_ends_naming_the_collective_that_timed_out():
    pytest.importorskip("torch", reason="needs torch (sh deploy/install.sh bench)")
    result = stopped_peer.measure("gloo", timeout=5, limit=120)
    assert "error" not in result, result
    assert result["exit"] not in (None, 0) and result["finished"] is False, result
    assert "Timed out" in result["cause"] or "timed out" in result["cause"], result  # gloo's own words
    assert result["watchdog_s"] is None  # no NCCL, no watchdog line
    table = stopped_peer.table(result)
    assert "rank 0 ended" in table and "rank 0 said: " in table and "never" in table


def test_a_rank_that_never_stops_is_a_failure_said():
    result = {"backend": "nccl", "timeout_s": 20, "limit_s": 1, "error": "rank 1 never stopped: no GPU"}
    assert "FAILED: rank 1 never stopped: no GPU" in stopped_peer.table(result)
