"""IMEX judged on a node of a multi-node NVLink domain (its GPUs' fabric names a cluster: GB200 NVL72). IMEX lets a
GPU share its memory with other nodes' GPUs over NVLink; without it a job across the domain's nodes goes over the
network at a fraction of NVLink's rate, or fails. DCGM 4.6 fails its NVLink health on a domain DOWN or DEGRADED
and on a daemon not READY; nodecheck says whose fault it is, so that one tray's fault does not drain the rack:

- imex_unhealthy (error): this node's daemon is not READY (INITIALIZING, INIT_GPU ...), or does not answer
  nvidia-imex-ctl; the domain is DOWN; the domain is DEGRADED and this node's own entry is not READY.
- imex_unhealthy (warning): the domain is DEGRADED (or UP with connections missing) while this node is READY, named
  with the nodes that are not; IMEX not configured on a node in a domain (a site may run the domain's trays as
  separate nodes); a daemon WAITING_FOR_PEERS or WAITING_FOR_RECOVERY (it waits on the other nodes, named); a
  daemon state this nodecheck does not judge (UNAVAILABLE).

A node outside a multi-node NVLink domain is not judged: IMEX has nothing to do there. On a node in one without
nvidia-imex-ctl (not installed, or not in a Kubernetes DaemonSet's image) the check is unknown, never a warning."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

WHERE_TO_LOOK = "`nvidia-imex-ctl -N`, `systemctl status nvidia-imex` and `journalctl -u nvidia-imex`"
WAITING = ("WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY")  # the daemon waits on the domain's other nodes


def imex_findings(report: Report, config: Config) -> list[Finding]:
    if not report.in_nvlink_domain():
        return []
    imex = report.imex
    if imex is None:  # no nvidia-imex-ctl here, or not in this container's image: unknown (imex_unknown)
        return []
    if imex.daemon is None:
        severity = "warning" if imex.why and imex.why.startswith("not configured") else "error"
        return [_finding(severity, imex.why or "unknown", "READY", f"IMEX on this node: {imex.why}; jobs across the "
                         f"domain's nodes take the network; check {WHERE_TO_LOOK}")]
    mine = _own_entry(report, imex.nodes)
    if imex.daemon in WAITING:  # for the domain's other nodes: their fault as much as this one's
        whom = _not_ready(imex, mine) or "every node it lists is READY: those it waits on are missing from its list"
        return [_finding("warning", f"daemon {imex.daemon}", "READY", f"this node's IMEX daemon is {imex.daemon}: it waits "
                         f"for the domain's other nodes ({whom}); jobs across the domain wait with it; check "
                         f"{WHERE_TO_LOOK} on those nodes")]
    if imex.daemon != "READY":
        severity = "warning" if imex.daemon == "UNAVAILABLE" else "error"
        return [_finding(severity, f"daemon {imex.daemon}", "READY", f"this node's IMEX daemon is {imex.daemon}, not READY: "
                         f"its GPUs cannot share memory across the domain; check {WHERE_TO_LOOK}")]
    return _domain(imex, mine)


def _not_ready(imex, mine: dict | None) -> str:
    """The domain's nodes other than this one (`mine`) that are not READY, and the hosts a node cannot reach, in
    words."""
    others = [n for n in imex.nodes if n is not mine and n.get("status") != "READY"]
    unconnected = sorted({h for n in imex.nodes for h in n.get("unconnected") or []})
    return "; ".join(filter(None, [f"not READY: {', '.join(_name(n) for n in others[:8])}" if others else "",
                                   f"unconnected: {', '.join(unconnected[:8])}" if unconnected else ""]))


def _domain(imex, mine: dict | None) -> list[Finding]:
    if imex.domain is None:
        return [_finding("warning", "domain unknown", "UP", f"IMEX's domain status could not be read: {imex.why}")]
    named = _not_ready(imex, mine)
    unconnected = any(n.get("unconnected") for n in imex.nodes)
    if imex.domain == "DOWN":
        return [_finding("error", "domain DOWN", "UP", f"the IMEX domain is DOWN ({named or 'no node READY'}): no GPU of "
                         f"it shares memory across nodes; check {WHERE_TO_LOOK}")]
    if mine is not None and mine.get("status") != "READY":
        return [_finding("error", f"this node {mine.get('status')}", "READY", f"IMEX lists this node ({mine.get('host')}) "
                         f"as {mine.get('status')}, not READY; check {WHERE_TO_LOOK}")]
    if imex.domain == "DEGRADED" or unconnected:
        who = "this node is READY" if mine is not None else "this node is not among its nodes by address"
        return [_finding("warning", f"domain {imex.domain}", "UP", f"the IMEX domain is {imex.domain} ({named or 'nodes missing'}); "
                         f"{who}: jobs across the domain avoid the nodes named; check {WHERE_TO_LOOK} on them")]
    return []


def _own_entry(report: Report, nodes: list[dict]) -> dict | None:
    addresses = {a.get("address") for nic in report.nics for a in nic.addresses if isinstance(a, dict)}
    return next((n for n in nodes if n.get("host") in addresses), None)


def _name(node: dict) -> str:
    return f"{node.get('host') or 'node ' + str(node.get('index'))} {node.get('status')}"


def _finding(severity: str, measured: str, expected: str, message: str) -> Finding:
    return Finding("imex_unhealthy", severity, "imex", measured, expected, message)


def imex_unknown(report: Report) -> dict[str, str]:
    """A node in a multi-node NVLink domain whose IMEX service was not read."""
    if report.imex is not None or not report.in_nvlink_domain():
        return {}
    outcome = next((p for p in report.probes if p.name == "imex"), None)
    return {IMEX_UNHEALTHY.name: (outcome.error if outcome and outcome.error else "IMEX not read")
            + " (this node is in a multi-node NVLink domain)"}


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
IMEX_UNHEALTHY = Kind("imex_unhealthy", "gpu", "{subject} {measured}",
    doc=(
        ("error; warning where the fault is elsewhere",
         "on a node in a multi-node NVLink domain (GB200 NVL72: its GPUs' fabric names a cluster), IMEX (`nvidia-imex-ctl -q` "
         "and `-N -j`, as DCGM 4.6 asks): an error when this node's daemon is not READY (INITIALIZING, INIT_GPU ...) or does "
         "not answer, the domain is DOWN, or the domain lists this node (by address) as not READY; a warning when the domain is"
         " DEGRADED, or a connection is missing, while this node is READY, or when this node's daemon waits for its peers "
         "(WAITING_FOR_PEERS, WAITING_FOR_RECOVERY) (the nodes at fault are named, so one tray does not drain the rack), when "
         "IMEX is not configured (a site may run the domain's trays as separate nodes), or for a daemon state UNAVAILABLE. Not "
         "judged outside a domain; unknown on a node in one without `nvidia-imex-ctl` (not installed, or not in a DaemonSet's "
         "image)"),
    ))

CHECK = Check((IMEX_UNHEALTHY,), imex_findings, needs="imex", unknown=imex_unknown)
