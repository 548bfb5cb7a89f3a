"""The node's /etc/nccl.conf judged against the node (src/nodecheck/probes/platform.py reads it as NCCL does): every NCCL job on
the node takes these values unless its environment sets its own, so a wrong one slows or breaks every job while
each GPU, NIC and link is healthy. A selection that names no active HCA sends every job's inter-node data over
sockets; one that names no interface that is up leaves NCCL without a bootstrap interface; a debugging variable
left set system-wide ("should not be used in production nor retained in scripts": NCCL's environment
documentation) disables a fast path for everyone. Warnings, never a drain: a conf file comes with the node's
image, and an error would drain every node of the image at once. Pure: reads the Report."""

from __future__ import annotations

import re

from nodecheck.assemble.rails import near_gpus
from nodecheck.checks.base import Check, Kind
from nodecheck.core.ifnames import nccl_selection
from nodecheck.probes.platform import NCCL_CONF
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

_NAME = re.compile(r"NCCL_[A-Z0-9_]{1,64}")
# what each debugging variable does when left set, with the values that disable something
DISABLING = {
    "NCCL_P2P_DISABLE": (("1",), "GPUs of a node exchange data through host memory instead of NVLink or PCIe peer-to-peer"),
    "NCCL_SHM_DISABLE": (("1",), "GPUs without peer access exchange data over the network instead of shared memory"),
    "NCCL_P2P_LEVEL": (("LOC", "0"), "no peer-to-peer between GPUs at all"),
    "NCCL_NET_GDR_LEVEL": (("LOC", "0"), "no GPUDirect RDMA: inter-node data is staged through host memory"),
    "NCCL_ALGO": (None, "every collective is forced to the algorithms named, whatever the size and topology"),
    "NCCL_PROTO": (None, "every collective is forced to the protocols named, whatever the size"),
}


def nccl_conf_findings(report: Report, config=None) -> list[Finding]:
    conf = report.nccl_conf()
    if not conf:
        return []
    return _unread_lines(conf) + _hca(report, conf) + _socket(report, conf) + _debugging(report, conf)


def _finding(name: str, measured: str, expected: str, message: str) -> Finding:
    return Finding("nccl_config", "warning", f"nccl.conf:{name}", measured, expected, f"{NCCL_CONF}: {message}")


def _unread_lines(conf: dict[str, str]) -> list[Finding]:
    """A name NCCL never reads: NCCL splits each line at its first '=' and strips nothing, so `NCCL_IB_HCA = mlx5`
    sets "NCCL_IB_HCA " and `export NCCL_IB_HCA=mlx5` sets "export NCCL_IB_HCA"; the line does nothing."""
    out = []
    for name in list(conf)[:16]:
        if "NCCL_" in name.upper() and not _NAME.fullmatch(name):
            shown = name.strip()[:64]
            out.append(_finding(shown.split()[-1] if shown.split() else "?", f"{name[:64]!r} set", "NAME=VALUE",
                                f"the line setting {name[:64]!r} sets nothing NCCL reads: NCCL splits a line at its "
                                "first '=' and strips nothing (no spaces around '=', no `export`)"))
    return out


def _hca(report: Report, conf: dict[str, str]) -> list[Finding]:
    up = report.rdma_nics_up()
    active = list(dict.fromkeys(n.rdma_device for n in up))
    if not active:
        return []
    if conf.get("NCCL_IB_DISABLE", "").strip() == "1":
        return [_finding("NCCL_IB_DISABLE", "1", "unset", f"NCCL_IB_DISABLE=1 while {', '.join(active[:8])} are ACTIVE: "
                         "every NCCL job's inter-node data goes over sockets (TCP), a fraction of the RDMA rate")]
    said = hca_shortfall(report, conf.get("NCCL_IB_HCA"))
    return [_finding("NCCL_IB_HCA", *said)] if said else []


def hca_shortfall(report: Report, value: str | None) -> tuple[str, str, str] | None:
    """(measured, expected, what it does) where an NCCL_IB_HCA selection leaves out the node's RDMA rails: it selects
    none of the active RDMA devices (every job's data across nodes over sockets), or leaves out one nearest to a GPU;
    None where it selects every rail, or is unset."""
    if value is None or not value.strip():
        return None
    up = report.rdma_nics_up()
    active = list(dict.fromkeys(n.rdma_device for n in up))
    chosen = set(nccl_selection(value, active))
    if active and not chosen:
        return (value[:64], f"one of {','.join(active[:8])}",
                f"NCCL_IB_HCA={value[:64]} selects none of the node's active RDMA devices ({', '.join(active[:8])}): "
                "NCCL finds no HCA and moves every job's inter-node data over sockets")
    rails = {n.rdma_device for n in near_gpus(up, report.gpus)}
    left_out = sorted(d for d in active if d not in chosen and d in rails)
    if left_out:
        return (value[:64], f"every rail ({len(left_out) + len(chosen & rails)})",
                f"NCCL_IB_HCA={value[:64]} leaves out {', '.join(left_out)}, active and nearest to a GPU: "
                "every job across nodes with it runs on fewer rails than the node has")
    return None


def _socket(report: Report, conf: dict[str, str]) -> list[Finding]:
    value = conf.get("NCCL_SOCKET_IFNAME")
    if value is None or not value.strip():
        return []
    up = [n.name for n in report.nics if n.kind != "loopback" and n.state in ("up", "unknown")
          and any(a.get("family") in ("inet", "inet6") for a in n.addresses)]
    if not up or nccl_selection(value, up):
        return []
    return [_finding("NCCL_SOCKET_IFNAME", value[:64], f"one of {','.join(up[:8])}",
                     f"NCCL_SOCKET_IFNAME={value[:64]} selects no interface that is up with an address, loopback aside "
                     f"({', '.join(up[:8])}): NCCL has no interface to bootstrap a job across nodes over")]


def _debugging(report: Report, conf: dict[str, str]) -> list[Finding]:
    out = []
    for name, (values, effect) in DISABLING.items():
        value = conf.get(name)
        if value is None or not value.strip() or (values is not None and value.strip().upper() not in values):
            continue
        out.append(_finding(name, value[:64], "unset", f"{name}={value[:64]} is a debugging variable (NCCL: \"should not be "
                            f"used in production nor retained in scripts\"): for every job on the node, {effect}"))
    return out


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
NCCL_CONFIG = Kind("nccl_config", "fabric", "{subject}={measured}",
    doc=(
        ("warning",
         "`/etc/nccl.conf` (what every NCCL job on the node reads for what its environment leaves unset) against the node, "
         "subject `nccl.conf:NAME`: `NCCL_IB_HCA` selecting none of the active RDMA devices (every job's inter-node data over "
         "sockets) or leaving out rails nearest a GPU, `NCCL_IB_DISABLE=1` with RDMA ports ACTIVE, `NCCL_SOCKET_IFNAME` "
         "selecting no interface up with an address (loopback aside: no bootstrap across nodes), a debugging variable left set "
         "(`NCCL_P2P_DISABLE=1`, `NCCL_SHM_DISABLE=1`, `NCCL_P2P_LEVEL`/`NCCL_NET_GDR_LEVEL` `LOC`, `NCCL_ALGO`, `NCCL_PROTO`),"
         " a line NCCL never reads (spaces around `=`, `export`). Warnings: the file comes with the image, and an error would "
         "drain every node of it. bench's rails follow the file too"),
    ))

CHECK = Check((NCCL_CONFIG,), nccl_conf_findings, needs="platform")
