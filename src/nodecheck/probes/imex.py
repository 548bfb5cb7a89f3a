"""The IMEX service of a multi-node NVLink domain (GB200 NVL72): `nvidia-imex-ctl -q` (this node's daemon: READY once
it serves) and `nvidia-imex-ctl -N -j` (the domain: UP, DEGRADED, DOWN, and each node's status and connections), the
two questions DCGM 4.6 asks for its IMEX health (dcgmlib DcgmImexManager). A GPU exports its memory to another
node's GPUs only through IMEX: with the daemon down, CUDA's fabric handles fail and NCCL takes the network instead of
NVLink. A node without nvidia-imex-ctl has no IMEX: no data, never a failure.

parse_daemon() and parse_domain() are pure; collect() asks through the host."""

from __future__ import annotations

import json

from nodecheck.core.errors import NoData, NotRecorded, ParseError, ProbeFailed, TimedOut
from nodecheck.probes.base import Probe
from nodecheck.report.model import Imex

DAEMON_ARGV, DAEMON_SOURCE = ["nvidia-imex-ctl", "-q"], "nvidia-imex-ctl-q.txt"
DOMAIN_ARGV, DOMAIN_SOURCE = ["nvidia-imex-ctl", "-N", "-j"], "nvidia-imex-ctl-N.json"
NOT_CONFIGURED = "Failed to read node configuration file"  # what nvidia-imex-ctl says without /etc/nvidia-imex/nodes_config.cfg
MAX_OUTPUT = 1 << 20
MAX_NODES = 1024  # an NVL72 domain has 18 compute trays; NVL576, 144
DAEMON_STATES = ("INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY", "INIT_GPU", "READY",
                 "SHUTTING_DOWN", "UNAVAILABLE")
DOMAIN_STATES = ("UP", "DOWN", "DEGRADED")


def parse_daemon(text: str) -> str:
    """The daemon's state, one word (`nvidia-imex-ctl -q` prints "READY"); ParseError for anything else."""
    word = text.strip().upper()
    if word not in DAEMON_STATES:
        raise ParseError(f"nvidia-imex-ctl -q: {text.strip()[:60]!r} is none of {', '.join(DAEMON_STATES)}")
    return word


def parse_domain(text: str) -> tuple[str, list[dict]]:
    """(the domain's status, its nodes as {index, host, status, unconnected}) from `nvidia-imex-ctl -N -j`."""
    if len(text) > MAX_OUTPUT:
        raise ParseError(f"nvidia-imex-ctl -N -j: more than {MAX_OUTPUT >> 10} KiB")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise ParseError(f"nvidia-imex-ctl -N -j: not JSON ({text.strip()[:60]!r})") from None
    status = data.get("status") if isinstance(data, dict) else None
    if not isinstance(status, str) or status.upper() not in DOMAIN_STATES:
        raise ParseError(f"nvidia-imex-ctl -N -j: domain status {status!r:.60} is none of {', '.join(DOMAIN_STATES)}")
    nodes = data.get("nodes") if isinstance(data.get("nodes"), dict) else {}
    if len(nodes) > MAX_NODES:
        raise ParseError(f"nvidia-imex-ctl -N -j: {len(nodes)} nodes, more than {MAX_NODES}")
    return status.upper(), [_node(index, node) for index, node in nodes.items() if isinstance(node, dict)]


def _node(index: str, node: dict) -> dict:
    connections = node.get("connections") if isinstance(node.get("connections"), dict) else {}
    unconnected = sorted({str(c.get("host"))[:64] for c in list(connections.values())[:MAX_NODES]
                          if isinstance(c, dict) and str(c.get("status", "")).upper() != "CONNECTED"})
    return {"index": str(index)[:16], "host": str(node.get("host"))[:64] if node.get("host") else None,
            "status": str(node.get("status"))[:32].upper() if node.get("status") is not None else None,
            "unconnected": unconnected}


def collect(host, timeout: float) -> Imex:
    try:
        daemon_text = host.command(DAEMON_SOURCE, DAEMON_ARGV, timeout / 2)
    except NotRecorded:
        raise
    except NoData:
        raise NoData("nvidia-imex-ctl is not installed: no IMEX on this node") from None
    except TimedOut:
        return Imex(None, None, why=f"nvidia-imex-ctl -q did not answer within {timeout / 2:g} s")
    except ProbeFailed as error:  # installed, and its daemon does not answer
        return Imex(None, None, why=_configured(str(error)) or f"nvidia-imex-ctl -q failed: {error}")
    if NOT_CONFIGURED in daemon_text:
        return Imex(None, None, why="not configured (no /etc/nvidia-imex/nodes_config.cfg)")
    daemon = parse_daemon(daemon_text)
    try:
        domain, nodes = parse_domain(host.command(DOMAIN_SOURCE, DOMAIN_ARGV, timeout / 2))
    except (NoData, ProbeFailed, ParseError) as error:
        return Imex(daemon, None, why=f"nvidia-imex-ctl -N -j: {error}")
    return Imex(daemon, domain, nodes)


def _configured(message: str) -> str | None:
    return "not configured (no /etc/nvidia-imex/nodes_config.cfg)" if NOT_CONFIGURED in message else None


def fill(report, facts: Imex) -> None:
    report.imex = facts


PROBE = Probe("imex", collect, 10.0, fill)
