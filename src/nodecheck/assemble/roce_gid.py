"""The GID NCCL puts on each active RoCE rail's packets, as NCCL chooses it: NCCL_IB_GID_INDEX where it is set;
otherwise the port's GID table walked from index 0 for an address of NCCL_IB_ADDR_FAMILY (IPv4 unless set) of RoCE
version NCCL_IB_ROCE_VERSION_NUM (2 unless set), within NCCL_IB_ADDR_RANGE when set (src/transport/net_ib:
ncclIbGetGidIndex, ncclUpdateGidIndex, envIbAddrRange, matchGidAddrPrefix). Read by the roce check, the fingerprint
and `inspect`. Pure: reads the Report."""

from __future__ import annotations

import re
import socket

from nodecheck.core.ifnames import nccl_selection
from nodecheck.probes.roce_gids import MAX_GIDS, ZERO_GID
from nodecheck.report.model import IbPort, Report

_V4_MAPPED = "0000:0000:0000:0000:0000:ffff:"  # ::ffff:a.b.c.d, an IPv4 address as a GID
_LINK_LOCAL = "fe80:0000:0000:0000:"
_INTEGER = re.compile(r"-?[0-9]{1,5}")
_LEADING_INTEGER = re.compile(r"\s*[-+]?[0-9]{1,5}")


def gid_family(gid: str) -> str:
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
        if gid_family(other) != gid_family(gid) and gid_family(other) == family and inside:
            chosen = candidate
        elif gid_family(other) == family and routable(other) and inside and versions.get(str(candidate)) == version and (
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
    family, version, _, within = asked_settings(conf)
    up = report.rdma_nics_up()
    chosen = set(nccl_selection(conf.get("NCCL_IB_HCA"), list(dict.fromkeys(n.rdma_device for n in up))))
    return [(port, nccl_gid_index(port, family, version, within), ", ".join(n.name for n in up if n.rdma_device == port.device))
            for port in active_roce_ports(report) if port.gids is not None and port.device in chosen]


def active_roce_ports(report: Report) -> list[IbPort]:
    """The ACTIVE RoCE ports (link layer Ethernet) of the NICs that are up, each once (a bond's netdevs share one)."""
    ports = {(p.device, p.port): p for nic in report.rdma_nics_up() for p in nic.ib_ports}
    return [p for p in ports.values() if p.state == "ACTIVE" and p.link_layer == "Ethernet"]


def asked_settings(conf: dict[str, str]) -> tuple[str, int, int, tuple | None]:
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
