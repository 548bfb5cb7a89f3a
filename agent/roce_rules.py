"""Which GID NCCL puts on each active RoCE rail's packets, and whether that GID routes (roce_gid_unroutable).

NCCL takes NCCL_IB_GID_INDEX where it is set; otherwise it walks the port's GID table for an address of
NCCL_IB_ADDR_FAMILY (IPv4 unless set) of RoCE version NCCL_IB_ROCE_VERSION_NUM (2 unless set), starting from index 0,
the link-local fe80:: GID every RoCE port has (src/transport/net_ib: ncclIbGetGidIndex, ncclUpdateGidIndex). A rail
without its IPv4 address leaves NCCL on that link-local GID (Broadcom NICs whose GIDs were all IPv6: uccl#803, "an
unroutable link-local address ... IBV_WC_RETRY_EXC_ERR on all RDMA operations"), and an index pinned to a link-local
or unset entry does the same: "Call to ibv_modify_qp failed with error Connection timed out" (NVIDIA/nccl#769, with
GID 1 = fe80::... RoCE v2). The node's links all pass; every job across nodes over that rail hangs or fails.

Warnings: /etc/nccl.conf is what the rule judges; what an NCCL run (bench's, in a job's environment) logged it took
from its environment is judged with the run (agent/nccl_run.py). A job's own environment may set otherwise, and a
fabric of one switch can run on link-local GIDs. NCCL_IB_ADDR_RANGE (`a.b.c.d/len`) narrows the walk to the GIDs
whose address lies in it, as envIbAddrRange and matchGidAddrPrefix read it: a range that holds none of the rail's
addresses leaves NCCL on the link-local GID too. Pure: reads the Report."""

from __future__ import annotations

import re
import socket

from nodecheck.findings import Finding
from nodecheck.ifnames import nccl_selection
from nodecheck.model import IbPort, Report
from nodecheck.probes.roce_gids import MAX_GIDS, ZERO_GID

_V4_MAPPED = "0000:0000:0000:0000:0000:ffff:"  # ::ffff:a.b.c.d, an IPv4 address as a GID
_LINK_LOCAL = "fe80:0000:0000:0000:"
_INTEGER = re.compile(r"-?[0-9]{1,5}")
_LEADING_INTEGER = re.compile(r"\s*[-+]?[0-9]{1,5}")


def _family(gid: str) -> str:
    return "AF_INET" if gid.startswith(_V4_MAPPED) else "AF_INET6"


def routable(gid: str) -> bool:
    """NCCL's validGid: set (not zeros, not fe80:: with nothing after it) and not link-local."""
    return gid != ZERO_GID and not gid.startswith(_LINK_LOCAL)


def nccl_gid_index(port: IbPort, family: str, version: int, within: tuple[tuple[int, ...], int] | None = None) -> int:
    """The index ncclIbGetGidIndex takes on this RoCE port with NCCL_IB_GID_INDEX unset (ncclUpdateGidIndex's walk);
    `within`: NCCL_IB_ADDR_RANGE as address_range() reads it."""
    gids, versions = port.gids or {}, port.gid_versions
    chosen = 0
    for candidate in range(1, MAX_GIDS):
        gid, other = gids.get(str(chosen), ZERO_GID), gids.get(str(candidate), ZERO_GID)
        inside = in_range(other, family, within)
        if _family(other) != _family(gid) and _family(other) == family and inside:
            chosen = candidate
        elif _family(other) == family and routable(other) and inside and versions.get(str(candidate)) == version and (
                versions.get(str(chosen)) != version or not routable(gid)):
            chosen = candidate
    return chosen


def address_range(text: str | None, family: str) -> tuple[tuple[int, ...], int] | None:
    """NCCL_IB_ADDR_RANGE as envIbAddrRange reads it: (the address's 32-bit words, the prefix length), or None where
    NCCL takes every GID (unset, no '/', an address not of the family asked, a length past the family's). The
    length is read as strtol reads it: its leading digits, 0 without any."""
    text = (text or "")[:127]  # NCCL copies the setting into 128 bytes
    if "/" not in text:
        return None
    address, _, length = text.partition("/")
    try:
        packed = socket.inet_pton(socket.AF_INET if family == "AF_INET" else socket.AF_INET6, address)
    except (OSError, ValueError):
        return None
    digits = _LEADING_INTEGER.match(length)
    bits = int(digits[0]) if digits else 0
    if bits > (32 if family == "AF_INET" else 128):
        return None
    return tuple(int.from_bytes(packed[i:i + 4], "big") for i in range(0, len(packed), 4)), bits


def in_range(gid: str, family: str, within: tuple[tuple[int, ...], int] | None) -> bool:
    """matchGidAddrPrefix: whether the GID's address lies in NCCL_IB_ADDR_RANGE (an IPv4 range compares the GID's last
    32 bits); always where no range is set. A negative length matches nothing, as in NCCL."""
    if within is None:
        return True
    words, bits = within
    try:
        groups = [int(group, 16) for group in gid.split(":")]
    except ValueError:
        return False
    if len(groups) != 8 or bits < 0:
        return bits == 0
    gid_words = [(groups[i] << 16) | groups[i + 1] for i in range(0, 8, 2)]
    if family == "AF_INET":
        return bits == 0 or _masked(words[0], bits) == _masked(gid_words[3], bits)
    for base, word in zip(words, gid_words, strict=True):
        if bits <= 0:
            break
        if _masked(base, min(bits, 32)) != _masked(word, min(bits, 32)):
            return False
        bits -= 32
    return True


def _masked(word: int, bits: int) -> int:
    return word & (0xFFFFFFFF ^ ((1 << (32 - bits)) - 1))


def nccl_roce_ports(report: Report, asked: dict[str, str] | None = None) -> list[tuple[IbPort, int, str]]:
    """Each ACTIVE RoCE port NCCL would use (NCCL_IB_HCA) whose GID table was read, with the index NCCL takes by
    itself there (NCCL_IB_GID_INDEX unset; the family and RoCE version asked) and its netdevs. `asked`: the NCCL
    settings to read, /etc/nccl.conf's when not given."""
    conf = (report.nccl_conf() or {}) if asked is None else asked
    family, version, _, within = _asked(conf)
    up = report.rdma_nics_up()
    chosen = set(nccl_selection(conf.get("NCCL_IB_HCA"), list(dict.fromkeys(n.rdma_device for n in up))))
    return [(port, nccl_gid_index(port, family, version, within), ", ".join(n.name for n in up if n.rdma_device == port.device))
            for port in active_roce_ports(report) if port.gids is not None and port.device in chosen]


def active_roce_ports(report: Report) -> list[IbPort]:
    """The ACTIVE RoCE ports (link layer Ethernet) of the NICs that are up, each once (a bond's netdevs share one)."""
    ports = {(p.device, p.port): p for nic in report.rdma_nics_up() for p in nic.ib_ports}
    return [p for p in ports.values() if p.state == "ACTIVE" and p.link_layer == "Ethernet"]


def roce_gid_findings(report: Report, config=None, settings: dict[str, str] | None = None,
                      where: str = "/etc/nccl.conf") -> list[Finding]:
    """`settings`: what an NCCL run took from its environment (nccl_run: "NCCL_IB_GID_INDEX set by environment to 3"),
    read over /etc/nccl.conf's, as NCCL reads them; `where` names their source in the finding."""
    asked = {**(report.nccl_conf() or {}), **(settings or {})}
    family, version, pinned, within = _asked(asked)
    narrowed = f", NCCL_IB_ADDR_RANGE={asked['NCCL_IB_ADDR_RANGE'][:50]}" if within is not None else ""
    findings = []
    for port, auto, netdevs in nccl_roce_ports(report, asked):
        index = pinned if pinned >= 0 else auto
        gid = (port.gids or {}).get(str(index), ZERO_GID)
        if routable(gid) and (pinned >= 0 or port.gid_versions.get(str(index)) == version):
            continue
        how = (f"NCCL_IB_GID_INDEX={pinned} ({where}) names" if pinned >= 0 else
               f"with NCCL_IB_GID_INDEX unset, NCCL ({family}, RoCE v{version}{narrowed}) "
               + ("takes" if routable(gid) else "falls back to"))
        short = ("unset" if gid == ZERO_GID else "link-local" if not routable(gid) else
                 f"RoCE v{port.gid_versions.get(str(index), '?')}")
        what = "an unset entry" if gid == ZERO_GID else f"{gid}, {short}"
        outside = [g for g in (port.gids or {}).values() if within is not None and _family(g) == family and routable(g)
                   and not in_range(g, family, within)]
        fix = ("RoCE v1 does not cross a router, and the port lists no RoCE v2 GID for this address: enable RoCE v2 "
               "on the NIC" if routable(gid) else
               f"NCCL_IB_ADDR_RANGE ({where}) leaves out the port's address {outside[0]}: set it to the rails' subnet, "
               "or unset it" if outside and pinned < 0 else
               f"give {netdevs} its {'IPv4' if family == 'AF_INET' else 'IPv6'} address, or set NCCL_IB_GID_INDEX to "
               "the entry `show_gids` lists for it (the same on every node)")
        findings.append(Finding(
            "roce_gid_unroutable", "warning", f"{port.device}/{port.port}", f"GID {index} {short}",
            f"a routable RoCE v{version} GID",
            f"{port.device}/{port.port} ({netdevs}): {how} GID {index}: {what}; packets from it do not route across "
            f"subnets, and every NCCL connection across nodes over this port times out (\"ibv_modify_qp failed with "
            f"error Connection timed out\"); {fix}"))
    return findings


def _asked(conf: dict[str, str]) -> tuple[str, int, int, tuple | None]:
    """(address family, RoCE version, pinned index or -1, address range or None) as NCCL reads them, from the conf
    file's values."""
    family = "AF_INET6" if conf.get("NCCL_IB_ADDR_FAMILY", "").strip() == "AF_INET6" else "AF_INET"  # as envIbAddrFamily
    return (family, _number(conf.get("NCCL_IB_ROCE_VERSION_NUM"), 2), _number(conf.get("NCCL_IB_GID_INDEX"), -1),
            address_range(conf.get("NCCL_IB_ADDR_RANGE"), family))


def _number(text: str | None, default: int) -> int:
    """An integer of at most five ASCII digits, as NCCL's strtoll reads a setting; else the default ('²' and '--3'
    pass str.isdigit but not int())."""
    text = (text or "").strip()
    return int(text) if _INTEGER.fullmatch(text) else default
