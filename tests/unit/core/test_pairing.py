"""The pairing scheme that names a slow node: two rounds for any node count, rank 0 judged like any
other node, every rank in at least one round, pairs in a round disjoint; with several ranks per node,
local rank k meets local rank k of another node, each exchange judged against its own rail."""

import pytest

from nodecheck.core.pairing import exchange_spec, job_bound, node_groups, pairings, rank_ratio, rank_rounds, slow_ranks

GB = 1e9


def exchanges(world: int, bad: set[int], fast: float = 100.0, slow: float = 40.0) -> list[dict]:
    out = []
    for index, pairs in enumerate(pairings(world)):
        for a, b in pairs:
            rate = slow if {a, b} & bad else fast
            out.append({"round": index, "a": a, "b": b, "a_to_b": rate, "b_to_a": rate})
    return out


def hgx_job(nodes: int, ranks_per_node: int, rail_rate: float = 50 * GB) -> list[dict]:
    """What every rank of a job on 8-rail HGX nodes reports: local rank k drives gpu k and its rail mlx5_k."""
    return [{"rank": n * ranks_per_node + k, "local_rank": k, "node": f"node{n}", "address": f"198.18.0.{n + 1}",
             "rails": [{"name": f"mlx5_{k}", "rate": rail_rate}]} for n in range(nodes) for k in range(ranks_per_node)]


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
        assert slow_ranks(exchanges(world, {bad}), world, 0.8, 100.0) == ([bad], []), bad
    assert slow_ranks(exchanges(world, set()), world, 0.8, 100.0) == ([], [])


def test_two_nodes_cannot_be_told_apart():
    assert slow_ranks(exchanges(2, {1}), 2, 0.8, 100.0) == ([], [(0, 1)])


@pytest.mark.parametrize("nodes,per_node", [(2, 8), (3, 8), (4, 8), (5, 2), (3, 1)])
def test_ranks_meet_their_local_peer_on_another_node_never_their_own_node(nodes, per_node):
    """Issue 20 (3): with 8 ranks per node, round 0 paired ranks 0-1 (two GPUs of one node, NVLink)."""
    job = hgx_job(nodes, per_node)
    node_of = {m["rank"]: m["node"] for m in job}
    local_of = {m["rank"]: m["local_rank"] for m in job}
    rounds = rank_rounds(job)
    assert len(rounds) == len(pairings(nodes))
    for pairs in rounds:
        members = [rank for pair in pairs for rank in pair]
        assert len(members) == len(set(members))
        for a, b in pairs:
            assert node_of[a] != node_of[b] and local_of[a] == local_of[b], (a, b)
    assert {rank for pairs in rounds for pair in pairs for rank in pair} == set(range(nodes * per_node))


def test_node_groups_follow_the_reported_node_not_the_rank_number():
    job = hgx_job(2, 2)
    job[1]["node"], job[2]["node"] = "node1", "node0"  # srun --distribution=cyclic: ranks alternate nodes
    job[1]["address"], job[2]["address"] = "198.18.0.2", "198.18.0.1"
    job[2]["local_rank"], job[1]["local_rank"] = 1, 0
    job[3]["local_rank"] = 1
    assert node_groups(job) == [[0, 2], [1, 3]]
    assert rank_rounds(job) == [[(0, 1), (2, 3)]]


def test_the_job_bound_is_the_rails_its_ranks_use():
    """Issue 20 (2): one rank per node on an 8-rail node drives one rail: 50 GB/s, not 400 (ratio 0.12)."""
    assert job_bound(hgx_job(4, 1)) == 50 * GB
    assert job_bound(hgx_job(4, 8)) == 400 * GB
    two_share_one = hgx_job(2, 2)
    for m in two_share_one:  # p4d: two GPUs behind each EFA adapter
        m["rails"] = [{"name": "rdmap16s0", "rate": 12.5 * GB}]
    assert job_bound(two_share_one) == 12.5 * GB
    uneven = hgx_job(2, 8)
    uneven[-1]["rails"] = [{"name": "mlx5_7", "rate": 25 * GB}]  # one node's rail 7 negotiated at 200G
    assert job_bound(uneven) == 375 * GB
    unknown = hgx_job(2, 1)
    unknown[1]["rails"] = []
    assert job_bound(unknown) is None


def test_each_exchange_is_judged_against_its_own_rail_shared_in_its_round():
    job = hgx_job(3, 8)
    rounds = rank_rounds(job)
    (a, b) = rounds[0][0]
    assert exchange_spec(job, rounds[0], a, b) == 50 * GB  # one rail each: not the node's 400
    gloo = [dict(m, rails=[{"name": "eth0", "rate": 0.125 * GB}]) for m in hgx_job(3, 2)]
    rounds = rank_rounds(gloo)
    assert exchange_spec(gloo, rounds[0], *rounds[0][0]) == pytest.approx(0.0625 * GB)  # two ranks share eth0


def test_a_slow_rail_names_its_node_and_rank_among_eight():
    """Node 2's rail 5 at a fifth: only the exchanges of rank 2*8+5 are slow, in every round it takes part in."""
    job = hgx_job(4, 8)
    rounds = rank_rounds(job)
    bad = 2 * 8 + 5
    out = []
    for index, pairs in enumerate(rounds):
        for a, b in pairs:
            rate = 10 * GB if bad in (a, b) else 47 * GB
            out.append({"round": index, "a": a, "b": b, "a_to_b": rate, "b_to_a": rate,
                        "spec": exchange_spec(job, pairs, a, b)})
    assert slow_ranks(out, 4, 0.8) == ([bad], [])
    assert rank_ratio(out, bad) == pytest.approx(0.2)


def test_rules_name_both_ends_of_a_two_node_slow_pair():
    from nodecheck.config import Config
    from nodecheck.report.model import Measurement
    from nodecheck.verdicts.bandwidth import measurement_findings

    details = {"nodes": [{"rank": 0, "node": "a", "address": "198.18.0.1"}, {"rank": 1, "node": "b", "address": "198.18.0.2"}],
               "pair_exchanges": exchanges(2, {1}, fast=100.0, slow=40.0)}
    m = Measurement.measured("allreduce:2-ranks", "allreduce", 40.0, 100.0, 1 << 25, "gloo", "busbw", details)
    (finding,) = measurement_findings([m], Config())
    assert "a (198.18.0.1) at 0.40" in finding.message and "b (198.18.0.2) at 0.40" in finding.message


def test_rules_name_the_node_and_rail_of_a_slow_rank_among_eight_per_node():
    from nodecheck.config import Config
    from nodecheck.report.model import Measurement
    from nodecheck.verdicts.bandwidth import measurement_findings

    job = hgx_job(4, 8)
    rounds = rank_rounds(job)
    out = []
    for index, pairs in enumerate(rounds):
        for a, b in pairs:
            rate = 10 * GB if 21 in (a, b) else 47 * GB
            out.append({"round": index, "a": a, "b": b, "a_to_b": rate, "b_to_a": rate, "spec": exchange_spec(job, pairs, a, b)})
    details = {"nodes": job, "pair_exchanges": out, "path_kind": "infiniband"}
    m = Measurement.measured("allreduce:32-ranks", "allreduce", 250 * GB, 400 * GB, 1 << 30, "nccl", "busbw", details)
    m.ranks = 32
    (finding,) = measurement_findings([m], Config())
    assert finding.subject == "node2 (198.18.0.3)"
    assert "slow: node2 (198.18.0.3) at 0.20 of spec (rail mlx5_5)" in finding.message, finding.message
