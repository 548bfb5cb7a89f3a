"""Subnet proximity of a job's peer nodes (seed 002, "Node Proximity").

For each peer in the job's node list: resolve it, ask the kernel which interface and gateway carry
traffic to it (pyroute2, the same lookup as `ip route get`), whether it sits in that interface's
subnet, and the round trip of a TCP connect to slurmd's port (a refused connect is an answer too).
Collecting (I/O, every step bounded) is separate from judging (pure): judge_peers() turns the facts
into findings.
"""

from __future__ import annotations

import ipaddress
import re
import statistics
import time
from dataclasses import dataclass

from nodecheck.config import ProximityPolicy  # noqa: F401 (where callers found it)
from nodecheck.core.errors import NoData, NodecheckError, ParseError
from nodecheck.host.commands import run_until
from nodecheck.report.findings import Finding


@dataclass
class Peer:
    name: str
    address: str | None = None
    interface: str | None = None  # the interface traffic to the peer leaves by
    subnet: str | None = None  # the interface's network that holds the peer, else its first network
    same_subnet: bool | None = None
    gateway: str | None = None  # set when the route to the peer goes through a router
    rtt_ms: float | None = None
    error: str | None = None
    examined: bool = True  # False: the check's time ran out before this peer's turn or answer


MAX_JOB_NODES = 65536  # the largest Slurm clusters; a node list naming more is refused before expanding


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed node list ("gpu[01-04,07],login1") as host names, via python-hostlist.
    A list that would expand past MAX_JOB_NODES names is refused without being expanded."""
    import hostlist

    if len(text) > 1024 * 1024 or nodelist_size(text) > MAX_JOB_NODES:
        raise ParseError(f"node list {text[:60]!r}: more than {MAX_JOB_NODES} nodes, not expanded")
    if _NOT_IN_A_NODELIST.search(text.strip()):  # host names hold no white space or control characters
        raise ParseError(f"node list {text[:60]!r}: white space or control characters in host names")
    try:
        return hostlist.expand_hostlist(text.strip())
    except (hostlist.BadHostlist, ValueError, MemoryError, RecursionError) as error:
        raise ParseError(f"node list {text!r} cannot be expanded: {error}") from None


def nodelist_size(text: str) -> int:
    """An upper bound on how many names a Slurm node list expands to, computed without expanding it:
    per comma-separated item, the product of its bracket groups' sizes."""
    total, depth, item = 0, 0, []
    for char in text + ",":
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth <= 0:
            total += _item_size("".join(item))
            item = []
        else:
            item.append(char)
        if total > MAX_JOB_NODES:
            break
    return total


_DIGITS = re.compile(r"[0-9]+")
_NOT_IN_A_NODELIST = re.compile(r"[\s\x00-\x1f\x7f]")


def _item_size(item: str) -> int:
    size = 1
    for group in re.findall(r"\[([^\]]*)\]", item):
        count = 0
        for part in group.split(","):
            low, _, high = part.partition("-")
            low, high = low.strip(), (high or low).strip()
            if len(low) > 9 or len(high) > 9:
                return MAX_JOB_NODES + 1
            if not _DIGITS.fullmatch(low) or not _DIGITS.fullmatch(high):  # not str.isdigit(): it takes '²'
                return 1  # hostlist says what is wrong
            count += max(1, int(high) - int(low) + 1)
        size *= max(1, count)
        if size > MAX_JOB_NODES:
            return size
    return size


# ---- collecting -------------------------------------------------------------------------------

PEER_WORKERS = 64  # peers examined at once: a slow resolver costs one timeout per round of this many


def collect_peers(host, names: list[str], local_names: set[str], policy: ProximityPolicy, timeout: float) -> list[Peer]:
    """The peers chosen_peers() picks, examined concurrently through the host (name, route, TCP connect), all
    of it within `timeout`: a peer not examined by then (a slow resolver, a large job) is returned with
    examined=False."""
    deadline = time.monotonic() + timeout
    peers = chosen_peers(names, local_names, policy.max_peers)
    if not peers:
        return []
    local_addresses = {entry["address"] for entries in host.addresses().values() for entry in entries}
    done = run_until({name: (lambda n=name: _examine(host, n, local_addresses, policy, deadline)) for name in peers},
                     deadline, PEER_WORKERS)
    unreachable = next((value for value in done.values() if isinstance(value, NoData)), None)
    if unreachable is not None:  # this host reaches no other node (a replayed snapshot): nothing to judge
        raise unreachable
    examined = [done[name] if isinstance(done.get(name), Peer) else Peer(name, examined=False) for name in peers]
    return [peer for peer in examined if peer.address not in local_addresses]  # this node under another name


def chosen_peers(names: list[str], local_names: set[str], most: int) -> list[str]:
    """The peers this node examines: the `most` that follow it in the job's node list, wrapping round (every
    peer when the job has no more, or `most` is 0). Each node is then examined by `most` others, and its slurmd
    answers `most` nodes' connects at the job's start, whatever the job's size: examining every peer made
    N x (N-1) connects, and each one costs two error lines in the peer's slurmd log ("Zero Bytes were
    transmitted or received"), ~3000 on every slurmd of a 512-node job."""
    def this_node(name: str) -> bool:  # by its Slurm name, or its host name without the domain
        return name in local_names or name.split(".")[0] in local_names

    unique = list(dict.fromkeys(names))
    mine = next((i for i, name in enumerate(unique) if this_node(name)), -1)
    following = unique[mine + 1:] + unique[:max(mine, 0)]
    peers = [name for name in following if not this_node(name)]
    return peers[:most] if most else peers


def _examine(host, name: str, local_addresses: set[str], policy: ProximityPolicy, deadline: float) -> Peer:
    peer = Peer(name)

    def left() -> float:  # what remains of the check's time, never quite nothing
        return max(0.1, deadline - time.monotonic())

    try:
        peer.address = host.resolve(name, policy.port, left())
        if peer.address in local_addresses:
            return peer
        peer.interface, peer.gateway, networks = host.route(peer.address, policy.interface, left())
        peer.same_subnet, peer.subnet = in_subnet(peer.address, networks, peer.gateway)
        peer.rtt_ms = host.connect_rtt_ms(peer.address, policy.port, min(policy.connect_timeout_s, left()))
    except NoData:
        raise  # not this peer's doing: the host reaches no other node
    except NodecheckError as error:
        peer.error = str(error)
    return peer


def in_subnet(address: str, networks: list[str], gateway: str | None) -> tuple[bool, str | None]:
    """Whether `address` is on-link in one of `networks` (interface address/prefix), and which network."""
    peer = ipaddress.ip_address(address)
    candidates = [ipaddress.ip_interface(n).network for n in networks]
    same = [n for n in candidates if n.version == peer.version and peer in n and not n.is_link_local]
    if same and gateway is None:
        return True, str(same[0])
    usable = [n for n in candidates if n.version == peer.version and not n.is_link_local]
    return False, str(usable[0]) if usable else None


# ---- judging (pure) ---------------------------------------------------------------------------

def judge_peers(peers: list[Peer], policy: ProximityPolicy) -> list[Finding]:
    findings = []
    unexamined = [p.name for p in peers if not p.examined]
    if unexamined:  # at the proximity severity: running out of time says nothing against this node
        findings.append(Finding("check_timed_out", policy.severity, "proximity", f"{len(unexamined)} of {len(peers)} peers",
                                "every peer", f"proximity: {len(unexamined)} of {len(peers)} peers not examined in time "
                                f"(first: {unexamined[0]}): a slow resolver or a very large job"))
    for peer in peers:
        if not peer.examined:
            continue
        if peer.error:
            findings.append(Finding("peer_unreachable", policy.severity, f"peer:{peer.name}", "unreachable", "reachable",
                                    f"peer {peer.name} unreachable: {peer.error}"))
        elif peer.same_subnet is False:
            via = f" via {peer.gateway}" if peer.gateway else ""
            findings.append(Finding("peer_outside_subnet", policy.severity, f"peer:{peer.name}", peer.address, peer.subnet,
                                    f"peer {peer.name} ({peer.address}) outside {peer.subnet} on {peer.interface}{via}: "
                                    "traffic to it crosses a router; ask for nodes in one subnet (Slurm topology/switches)"))
    rtts = [p.rtt_ms for p in peers if p.rtt_ms is not None]
    if len(rtts) >= 2:
        median = statistics.median(rtts)
        for peer in peers:
            if peer.rtt_ms is not None and peer.rtt_ms > policy.rtt_factor * median and peer.rtt_ms - median >= policy.rtt_floor_ms:
                findings.append(Finding("peer_slow", policy.severity, f"peer:{peer.name}", f"{peer.rtt_ms:g} ms",
                                        f"{median:g} ms", f"peer {peer.name} round trip {peer.rtt_ms:g} ms, "
                                        f"{peer.rtt_ms / median:.1f}x the peers' median {median:g} ms: a far or congested path"))
    return findings
