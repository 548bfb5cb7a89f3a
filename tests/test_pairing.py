"""The pairing scheme that names a slow node: two rounds for any node count, rank 0 judged like any
other node, every rank in at least one round, pairs in a round disjoint."""

import pytest

from nodecheck.pairing import pairings, slow_nodes


def exchanges(world: int, bad: set[int], fast: float = 100.0, slow: float = 40.0) -> list[dict]:
    out = []
    for index, pairs in enumerate(pairings(world)):
        for a, b in pairs:
            rate = slow if {a, b} & bad else fast
            out.append({"round": index, "a": a, "b": b, "a_to_b": rate, "b_to_a": rate})
    return out


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8, 9, 64, 1000])
def test_rounds_are_few_disjoint_and_cover_every_rank(world):
    rounds = pairings(world)
    assert len(rounds) <= 3
    for pairs in rounds:
        members = [rank for pair in pairs for rank in pair]
        assert len(members) == len(set(members))
    assert {rank for pairs in rounds for pair in pairs for rank in pair} == set(range(world))


@pytest.mark.parametrize("world", [3, 4, 5, 8, 9, 64])
def test_each_single_slow_node_is_named_rank_0_included(world):
    for bad in range(world):
        assert slow_nodes(exchanges(world, {bad}), world, 80.0) == ([bad], []), bad
    assert slow_nodes(exchanges(world, set()), world, 80.0) == ([], [])


def test_two_nodes_cannot_be_told_apart():
    assert slow_nodes(exchanges(2, {1}), 2, 80.0) == ([], [(0, 1)])


def test_rules_name_both_ends_of_a_two_node_slow_pair():
    from nodecheck.config import Config
    from nodecheck.model import Measurement
    from nodecheck.rules import measurement_findings

    details = {"nodes": [{"rank": 0, "node": "a", "address": "198.18.0.1"}, {"rank": 1, "node": "b", "address": "198.18.0.2"}],
               "pair_exchanges": exchanges(2, {1}, fast=100.0, slow=40.0)}
    m = Measurement.measured("allreduce:2-ranks", "allreduce", 40.0, 100.0, 1 << 25, "gloo", "busbw", details)
    (finding,) = measurement_findings([m], Config())
    assert "a (198.18.0.1) at 0.40" in finding.message and "b (198.18.0.2) at 0.40" in finding.message
