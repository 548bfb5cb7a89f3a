"""Naming the slow node of an all-reduce in a constant number of rounds, whatever the node count.

Two pairings of the nodes: round 0 pairs 0-1, 2-3, 4-5 ...; round 1 pairs 1-2, 3-4 ... and the last
with 0 (an odd count needs a third round of one pair, 0 with the last). When a node pair meets, local
rank k of one exchanges with local rank k of the other, all k at once (never two ranks of one node:
that would measure NVLink, not the fabric), each over its own rail.
In each round every pair exchanges a buffer both ways at once with the other pairs, so a round costs
one exchange's time for 8 nodes as for 1,000. Each exchange is compared with its own spec: the rails
of its two ends, shared by the ranks of a node that use the same rails in that round. A rank is slow
when its exchange was slow in every round it took part in; a slow pair whose other member is fast
elsewhere is that other member's bad luck, not its fault. Rank 0 is judged like any other. Pure: the
worker moves the bytes (nodecheck.bench.worker), the verdicts judge (nodecheck.verdicts)."""

from __future__ import annotations


def pairings(count: int) -> list[list[tuple[int, int]]]:
    """The rounds over `count` members: each a list of disjoint (a, b) pairs with a < b; every member
    meets two different partners (from 3 on). An even count needs two rounds; an odd one leaves the
    last out of round 0 and member 0 out of round 1, and a third round of one pair gives those two
    their second."""
    if count < 2:
        return []
    first = [(a, a + 1) for a in range(0, count - 1, 2)]
    if count == 2:
        return [first]
    second = [(a, a + 1) for a in range(1, count - 1, 2)]
    if count % 2 == 0:
        return [first, sorted(second + [(0, count - 1)])]
    return [first, second, [(0, count - 1)]]


def node_key(member: dict) -> tuple:
    """What tells a rank's node: its host name and traffic address, as each rank reported them."""
    return member.get("node"), member.get("address")


def node_groups(members: list[dict]) -> list[list[int]]:
    """The ranks of each node in local-rank order, nodes in the order of their lowest rank.
    members: the gathered {"rank", "node", "address", "local_rank"} of every rank."""
    groups: dict[tuple, list[dict]] = {}
    for member in sorted(members, key=lambda m: m["rank"]):
        groups.setdefault(node_key(member), []).append(member)
    return [[m["rank"] for m in sorted(group, key=lambda m: (m.get("local_rank") or 0, m["rank"]))]
            for group in groups.values()]


def rank_rounds(members: list[dict]) -> list[list[tuple[int, int]]]:
    """The node pairings as rank pairs: local rank k of node i with local rank k of node j, all k at once.
    A node's ranks past its partner's count sit the round out."""
    groups = node_groups(members)
    return [sorted((min(x, y), max(x, y)) for a, b in pairs for x, y in zip(groups[a], groups[b], strict=False))
            for pairs in pairings(len(groups))]


def partner(rounds: list[list[tuple[int, int]]], round_index: int, rank: int) -> int | None:
    for a, b in rounds[round_index]:
        if rank in (a, b):
            return b if rank == a else a
    return None


def known_rails(member: dict) -> list[dict] | None:
    """A rank's rails as [{"name", "rate" (bytes/s), "link"?, "link_rate"?}]; None when it names none or any
    rate is unknown. A malformed "link" or "link_rate" is dropped: the rail then shares nothing."""
    rails = []
    for raw in member.get("rails") or []:
        rate = raw.get("rate") if isinstance(raw, dict) else None
        if not _positive(rate) or not isinstance(raw.get("name"), str):
            return None
        rail = {"name": raw["name"], "rate": rate}
        if isinstance(raw.get("link"), str) and raw["link"]:
            rail["link"] = raw["link"]
        if _positive(raw.get("link_rate")):
            rail["link_rate"] = raw["link_rate"]
        rails.append(rail)
    return rails or None


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def rail_key(rail: dict) -> str:
    """What a rail shares with others: its PCIe link where known (the ports of a dual-port card share one),
    else itself."""
    return rail.get("link") or f"rail:{rail['name']}"


def rails_capacity(rails: list[dict]) -> float:
    """What these rails move together, bytes/s: the sum of the distinct rails' rates, except that rails on one
    PCIe link move no more together than that link ("link_rate"): the two ports of a 2x200 Gbit/s HDR card in a
    gen4 x16 slot move 31.5 GB/s, not 50."""
    distinct = {rail["name"]: rail for rail in rails}  # a rail named twice counts once, as its last record says
    groups: dict[str, list[dict]] = {}
    for rail in distinct.values():
        groups.setdefault(rail_key(rail), []).append(rail)
    return sum(min([sum(r["rate"] for r in members), *[r["link_rate"] for r in members if "link_rate" in r]])
               for members in groups.values())


def nvlink_domain(member: dict) -> str | None:
    """The multi-node NVLink domain (cluster UUID/clique) a rank's GPU is registered in; None outside one."""
    said = member.get("nvlink")
    domain = said.get("domain") if isinstance(said, dict) else None
    return domain if isinstance(domain, str) and domain else None


def _nvlink_rate(member: dict) -> float | None:
    rate = member["nvlink"].get("rate")
    return rate if _positive(rate) else None


def one_nvlink_domain(members: list[dict]) -> str | None:
    """The one multi-node NVLink domain every rank's GPU shares (NCCL then carries the whole job over NVLink),
    else None."""
    domains = {nvlink_domain(m) for m in members}
    return domains.pop() if len(domains) == 1 and None not in domains else None


def job_bound(members: list[dict]) -> float | None:
    """The busbw bound of the job: per node, what the distinct rails its ranks use move together (NCCL runs a
    ring over each, crossing between nodes once per node; rails_capacity); the slowest node's. None when any
    rank's rail rate is unknown. members: every rank's {"node", "address", "rails": [{"name", "rate", ...}],
    "nvlink"?: {"domain", "rate"}}. In one multi-node NVLink domain (GB200 NVL72) the slowest GPU's NVLink
    rate; None for a job across several domains, or partly outside one: it takes NVLink inside each and the
    network between them, and neither bounds it alone."""
    if any(nvlink_domain(m) for m in members):
        if one_nvlink_domain(members) is None:
            return None
        rates = [_nvlink_rate(m) for m in members]
        return None if None in rates else min(rates)
    per_node: dict[tuple, list[dict]] = {}
    for member in members:
        rails = known_rails(member)
        if rails is None:
            return None
        per_node.setdefault(node_key(member), []).extend(rails)
    return min(rails_capacity(rails) for rails in per_node.values()) if per_node else None


def exchange_spec(members: list[dict], pairs: list[tuple[int, int]], a: int, b: int) -> float | None:
    """What the exchange of a and b can reach in a round of `pairs`: at each end, what its rails move (the rails
    of the node's ranks in this round on the same rails or PCIe links as its own, together) shared by those
    ranks; the lower end's. Two GPUs of one multi-node NVLink domain: the slower one's NVLink rate (each GPU
    has links of its own to the switches). None when unknown."""
    by_rank = {m["rank"]: m for m in members}
    in_round = {rank for pair in pairs for rank in pair}
    first, second = by_rank.get(a, {}), by_rank.get(b, {})
    if nvlink_domain(first) and nvlink_domain(first) == nvlink_domain(second):  # each GPU over its own links
        rates = [_nvlink_rate(first), _nvlink_rate(second)]
        return None if None in rates else min(rates)

    def end(rank: int) -> float | None:
        me = by_rank.get(rank, {})
        rails = known_rails(me)
        if rails is None:
            return None
        keys = {rail_key(r) for r in rails}
        pool, sharing = [], 0
        for other in in_round:
            them = by_rank.get(other, {})
            theirs = (known_rails(them) or []) if node_key(them) == node_key(me) else []
            if keys & {rail_key(r) for r in theirs}:
                sharing += 1
                pool += [r for r in theirs if rail_key(r) in keys]
        return rails_capacity(pool or rails) / max(1, sharing)

    ends = [end(a), end(b)]
    return None if None in ends else min(ends)


def _ratio(exchange: dict, default_spec: float | None) -> float | None:
    spec = exchange.get("spec") or default_spec
    return min(exchange["a_to_b"], exchange["b_to_a"]) / spec if spec else None


def slow_ranks(exchanges: list[dict], nodes: int, threshold: float,
               default_spec: float | None = None) -> tuple[list[int], list[tuple[int, int]]]:
    """exchanges: [{"round", "a", "b", "a_to_b", "b_to_a" (bytes/s), "spec"}]: each judged against its
    own spec (default_spec for records without one). Returns (ranks slow in every round they took part
    in, pairs that were slow but whose members each had a fast round: undecided)."""
    ratios: dict[int, list[float]] = {}
    slow_pairs = []
    for e in exchanges:
        ratio = _ratio(e, default_spec)
        if ratio is None:
            continue
        ratios.setdefault(e["a"], []).append(ratio)
        ratios.setdefault(e["b"], []).append(ratio)
        if ratio < threshold:
            slow_pairs.append((e["a"], e["b"]))
    if nodes == 2:  # one node pair only: its two ends cannot be told apart
        return [], slow_pairs
    slow = sorted(r for r, seen in ratios.items() if all(ratio < threshold for ratio in seen))
    undecided = [(a, b) for a, b in slow_pairs if a not in slow and b not in slow]
    return slow, undecided


def rank_ratio(exchanges: list[dict], rank: int, default_spec: float | None = None) -> float | None:
    """The best ratio a rank's exchanges reached (its rail's state, as far as the pairs can tell)."""
    seen = [_ratio(e, default_spec) for e in exchanges if rank in (e["a"], e["b"])]
    seen = [r for r in seen if r is not None]
    return max(seen) if seen else None
