"""Naming the slow node of an all-reduce in a constant number of rounds, whatever the node count.

Two pairings of the ranks (nodes): round 0 pairs 0-1, 2-3, 4-5 ...; round 1 pairs 1-2, 3-4 ... and
the last with 0 (an odd count needs a third round of one pair, 0 with the last).
In each round every pair exchanges a buffer both ways at once with the other pairs, so a round costs
one exchange's time for 8 nodes as for 1,000. A node is slow when its exchange was slow in every round
it took part in; a slow pair whose other member is fast elsewhere is that other member's bad luck,
not its fault. Rank 0 is judged like any other node. Pure: the worker moves the bytes
(nodecheck.bench.worker), the rules judge (nodecheck.rules)."""

from __future__ import annotations


def pairings(world: int) -> list[list[tuple[int, int]]]:
    """The rounds: each a list of disjoint (a, b) pairs with a < b; every rank meets two different
    partners (from 3 nodes on). An even count needs two rounds; an odd one leaves the last rank out of
    round 0 and rank 0 out of round 1, and a third round of one pair gives those two their second."""
    if world < 2:
        return []
    first = [(a, a + 1) for a in range(0, world - 1, 2)]
    if world == 2:
        return [first]
    second = [(a, a + 1) for a in range(1, world - 1, 2)]
    if world % 2 == 0:
        return [first, sorted(second + [(0, world - 1)])]
    return [first, second, [(0, world - 1)]]


def partner(rounds: list[list[tuple[int, int]]], round_index: int, rank: int) -> int | None:
    for a, b in rounds[round_index]:
        if rank in (a, b):
            return b if rank == a else a
    return None


def slow_nodes(exchanges: list[dict], world: int, floor: float) -> tuple[list[int], list[tuple[int, int]]]:
    """exchanges: [{"round", "a", "b", "a_to_b", "b_to_a"} bytes/s]. Returns (ranks slow in every round
    they took part in, pairs that were slow but whose members each had a fast round: undecided)."""
    rates: dict[int, list[float]] = {r: [] for r in range(world)}
    slow_pairs = []
    for e in exchanges:
        rate = min(e["a_to_b"], e["b_to_a"])
        rates[e["a"]].append(rate)
        rates[e["b"]].append(rate)
        if rate < floor:
            slow_pairs.append((e["a"], e["b"]))
    slow = [r for r, seen in rates.items() if seen and all(rate < floor for rate in seen)]
    undecided = [(a, b) for a, b in slow_pairs if a not in slow and b not in slow]
    if world == 2 and slow_pairs:  # one pair only: the two ends cannot be told apart
        return [], slow_pairs
    return slow, undecided


def node_rate(exchanges: list[dict], rank: int) -> float | None:
    """The best exchange rate a rank reached (its link's rate, as far as the pairs can tell)."""
    seen = [min(e["a_to_b"], e["b_to_a"]) for e in exchanges if rank in (e["a"], e["b"])]
    return max(seen) if seen else None
