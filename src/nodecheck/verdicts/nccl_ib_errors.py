"""NCCL's InfiniBand/RoCE transfers that failed, judged: what each verbs status means, and which end of the failed
connections the log points at (the peer every reporter names, or the one reporter that fails with every peer).
Read by bench.nccl_debug from NCCL's own WARN lines ("NET/IB : Got completion from peer 10.0.35.1<49189> with
error 4, ..."); a NET/IB error kills the job (ncclRemoteError / ncclSystemError). Pure: no I/O."""

from __future__ import annotations

from collections import Counter

from nodecheck.report.findings import Finding

# libibverbs' names of a work completion's status (rdma-core libibverbs/verbs.c, ibv_wc_status_str)
WC_STATUS = {
    1: "local length error", 2: "local QP operation error", 3: "local EE context operation error",
    4: "local protection error", 5: "Work Request Flushed Error", 6: "memory management operation error",
    7: "bad response error", 8: "local access error", 9: "remote invalid request error", 10: "remote access error",
    11: "remote operation error", 12: "transport retry counter exceeded", 13: "RNR retry counter exceeded",
    14: "local RDD violation error", 15: "remote invalid RD request", 16: "aborted error", 17: "invalid EE context number",
    18: "invalid EE context state", 19: "fatal error", 20: "response timeout error", 21: "general error", 22: "TM error",
    23: "TM software rendezvous",
}
FLUSHED = 5  # IBV_WC_WR_FLUSH_ERR: the queue pair was already in error; the work was flushed, a consequence
# what a status says of the path, as NCCL's maintainers read it
CAUSES = {
    12: "the two NICs cannot reach each other, or the path loses so much that the retries run out: a port down or "
        "flapping, a cable, RoCE routing or congestion (NCCL: error 12 \"either means two NICs can't talk to each other "
        "... or the network connection is very bad\", NVIDIA/nccl#902); check both ends' ports (`ibstat`, "
        "`nodecheck inspect`) and their link error counters; NCCL_IB_TIMEOUT helps only a lossy path",
    13: "the receiver posted no buffer in time: the peer's process stalled or died first (look at its log)",
    4: "usually PCIe ACS on the GPU-NIC path breaking GPUDirect RDMA (NCCL: \"IB error 4 is usually due to ACS being "
       "enabled\", NVIDIA/nccl#928): see `nodecheck inspect`'s ACS finding on the reporting node; NCCL_NET_GDR_LEVEL=0 "
       "confirms it (slower)",
    FLUSHED: "flushed after an earlier error on the same connection, which this log does not hold: the first failing "
             "line (here or in the peer's log) names the cause",
}
LOCAL = frozenset((1, 2, 3, 4, 8, 14))  # the "local ..." statuses: the reporting end's own HCA, memory or PCIe path
MAX_NAMED = 3  # peers and reporters named in the message


def status_name(status: int) -> str:
    return WC_STATUS.get(status, "unknown status")


def ib_error_findings(errors: list[dict], addresses: dict[str, str]) -> list[Finding]:
    """One warning for a log whose NET/IB transfers failed: the main status (the commonest that is not a flush), what
    it means, and the end the failed connections share. `errors`: {host, peer, status, hca, count} as the parser
    keeps them; `addresses`: an address a host's NCCL lines named -> that host."""
    if not errors:
        return []
    by_status = Counter()
    for error in errors:
        by_status[error["status"]] += error["count"]
    main = next((s for s, _ in by_status.most_common() if s != FLUSHED), FLUSHED)
    chosen = [e for e in errors if e["status"] == main]
    peers, reporters = Counter(), Counter()
    for error in chosen:
        if error["peer"]:
            peers[error["peer"]] += error["count"]
        reporters[_reporter(error)] += error["count"]
    subject = _shared_end(main, chosen, peers, reporters, addresses)
    lines = sum(by_status.values())
    others = ", ".join(f"status {s} x{n}" for s, n in sorted(by_status.items()) if s != main)
    named_peers = ", ".join(f"{_named(p, addresses)} x{n}" for p, n in peers.most_common(MAX_NAMED))
    named_reporters = ", ".join(f"{r} x{n}" for r, n in reporters.most_common(MAX_NAMED))
    message = (f"NCCL's IB transfers failed ({lines} NET/IB \"Got completion\" WARN line{'s' if lines > 1 else ''}): "
               f"status {main} ({status_name(main)}) x{by_status[main]}{f', then {others}' if others else ''}, "
               f"reported by {named_reporters}" + (f", with peer {named_peers}" if named_peers else "") +
               f"; {subject[1]}; {CAUSES.get(main, 'the verbs status names the failure')}")
    return [Finding("nccl_ib_error", "warning", subject[0][:120], f"status {main} ({status_name(main)}) x{by_status[main]}",
                    "no failed IB work request", message[:900])]


def _reporter(error: dict) -> str:
    host = error["host"] or "the log's host"
    return f"{host} {error['hca']}" if error["hca"] else host


def _named(peer: str, addresses: dict[str, str]) -> str:
    host = addresses.get(peer)
    return f"{peer} ({host})" if host else peer


def _shared_end(status: int, chosen: list[dict], peers: Counter, reporters: Counter,
                addresses: dict[str, str]) -> tuple[str, str]:
    """(subject, sentence): the end the failed connections have in common. A peer that several reporters name is
    the likely culprit; one reporter failing with several peers points at its own NIC or link; one connection alone
    does not say which end."""
    reporter, _ = reporters.most_common(1)[0]
    if status in LOCAL:
        return (reporter, f"a local error: {reporter}'s own HCA or its PCIe path to the GPU is the failing end")
    if peers:
        peer, _ = peers.most_common(1)[0]
        hosts = {e["host"] for e in chosen if e["peer"] == peer}
        if len(hosts) > 1:
            return (f"peer {_named(peer, addresses)}", f"{len(hosts)} hosts failed with the same peer, "
                    f"{_named(peer, addresses)}: its NIC, link or process is the common end")
    peers_of = {e["peer"] for e in chosen if _reporter(e) == reporter and e["peer"]}
    if len(peers_of) > 1:
        return (reporter, f"{reporter} failed with {len(peers_of)} peers: its own NIC or link is the common end")
    if peers:
        peer = next(iter(peers_of or peers))
        return (f"{reporter} -> {_named(peer, addresses)}",
                f"one connection, {reporter} to {_named(peer, addresses)}: either end (the peer's log tells which)")
    return (reporter, f"{reporter}'s NCCL named no peer (older NCCL versions print none)")
