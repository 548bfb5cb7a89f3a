"""What a topology drift is, in the words `inspect` and `config check` use: the fields of the topology hash
(fingerprint.topology_facts) on which a node differs from a node of its type's majority ("mlx5_3 ib 200 Gbit/s,
most: 400 Gbit/s"; "gpu3 PCIe max Gen4 x16, most: Gen5 x16"), where both Reports hold them. Two bare hashes tell
an operator only that something differs."""

from __future__ import annotations

from collections import Counter

MAX_SAID = 8  # differences listed per drift: the first say where to look


def topology_differences(mine: dict, usual: dict, my_nics: list[tuple[str, str, int]]) -> list[str]:
    """Each difference of `mine` from `usual` (topology facts), most telling first; `my_nics`: (name, kind, Mb/s)
    of this node's physical NICs, to name the NIC that differs."""
    said = _nics(mine.get("nics") or [], usual.get("nics") or [], my_nics)
    said += _per_gpu(mine, usual)
    said += _gpu_links(mine.get("gpu_links") or [], usual.get("gpu_links") or [])
    if mine.get("cpu") != usual.get("cpu"):
        said.append(f"CPU {_cpu(mine.get('cpu'))}, most: {_cpu(usual.get('cpu'))}")
    return said[:MAX_SAID] or ["the topology differs in a field this nodecheck does not name"]


def _rate(mbps: int) -> str:
    return f"{mbps / 1000:g} Gbit/s" if mbps else "speed unknown"


def _nics(mine: list, usual: list, named: list[tuple[str, str, int]]) -> list[str]:
    """NICs by kind and speed: each one this node has beyond the majority's, named, beside what the majority has
    that this node lacks."""
    have, want = Counter(tuple(n) for n in mine), Counter(tuple(n) for n in usual)
    extra, missing = have - want, want - have
    said = []
    lacking = [f"{kind} {_rate(speed)}" for (kind, speed), n in sorted(missing.items()) for _ in range(n)]
    for (kind, speed), n in sorted(extra.items()):
        names = sorted(name for name, k, s in named if (k, s) == (kind, speed))[:n] or ["a NIC"] * n
        for name in names:
            said.append(f"{name} {kind} {_rate(speed)}, most: " + (lacking.pop(0) if lacking else "no such NIC"))
    said += [f"no {lack} NIC, which most have" for lack in lacking]
    return said


def _per_gpu(mine: dict, usual: dict) -> list[str]:
    said = []
    fields = (("pcie", lambda v: f"PCIe max Gen{v[0]} x{v[1]}" if v and v[0] else "PCIe unknown"),
              ("nvlinks", lambda v: f"NVLinks {v[1]} of {v[0]} active" if v else "no NVLink"),
              ("gpu_numa", lambda v: f"NUMA node {v}"),
              ("gpu_nic_links", lambda v: "to NICs " + (" ".join(v) if v else "none")),
              ("compute_mode", lambda v: f"compute mode {v or 'default'}"))
    for name, say in fields:
        a, b = mine.get(name) or [], usual.get(name) or []
        for index in range(max(len(a), len(b))):
            ours, theirs = (a[index] if index < len(a) else None), (b[index] if index < len(b) else None)
            if ours != theirs:
                said.append(f"gpu{index} {say(ours)}, most: {say(theirs)}")
    return said


def _gpu_links(mine: list, usual: list) -> list[str]:
    ours = {(a, b): kind for a, b, kind in mine}
    theirs = {(a, b): kind for a, b, kind in usual}
    return [f"gpu{a}-gpu{b} {ours.get((a, b), 'no link')}, most: {theirs.get((a, b), 'no link')}"
            for a, b in sorted(set(ours) | set(theirs)) if ours.get((a, b)) != theirs.get((a, b))]


def _cpu(cpu) -> str:
    if not cpu:
        return "unknown"
    packages, numa, pus = cpu
    return f"{packages} package(s), {numa} NUMA node(s), {pus} CPUs"
