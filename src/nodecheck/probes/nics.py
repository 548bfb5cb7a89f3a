"""NICs from sysfs: name, state, speed, MTU, driver, PCI address, NUMA node, addresses (psutil),
IPv4 routes (/proc/net/route), and InfiniBand/RoCE ports from /sys/class/infiniband.

Placeholders the kernel uses for "not known" (speed -1 or 4294967295, numa_node -1) become None,
never a number. The reader goes through a Host; parse_* functions take the raw values only.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from dataclasses import dataclass

from nodecheck.core.errors import NoData, ParseError
from nodecheck.core.limits import MAX_NICS
from nodecheck.core.units import to_int
from nodecheck.probes.base import Probe
from nodecheck.probes.ib_counters import JUDGED, parse_counter, read_port_counters
from nodecheck.probes.roce_gids import parse_gid_table, read_gid_table
from nodecheck.report.model import IbPort, Nic

_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_NET_FILES = ("operstate", "speed", "mtu", "duplex", "address", "carrier", "type")
_IB_PORT_FILES = ("rate", "state", "phys_state", "link_layer")
_TEXT_TABLES = ("counters", "gids", "gid_types")  # a port's values that are {name: text}
# a netdev's link counters the rules judge (src/nodecheck/checks/error_counters.py): times the carrier went down (Linux 5.8+; before it,
# carrier_changes counts downs and ups together), and frames received with a bad checksum (the Ethernet FCS)
NETDEV_COUNTERS = ("carrier_down_count", "carrier_changes", "statistics/rx_crc_errors")
_ARPHRD = {"1": "ethernet", "32": "infiniband", "772": "loopback"}


@dataclass
class Route:
    iface: str
    destination: str  # CIDR
    gateway: str | None


@dataclass
class NicFacts:
    nics: list[Nic]
    rdma_devices: dict[str, list[IbPort]]  # every RDMA device, with or without a netdev
    rdma_pci: dict[str, str]  # RDMA device -> PCI address
    routes: list[Route]


def _collect(host, timeout: float) -> NicFacts:
    return collect(host)  # sysfs and /proc reads: bounded by the host, each one quick


PROBE = Probe("nics", _collect, 10.0)


def collect(host) -> NicFacts:
    names = host.list_dir("/sys/class/net")
    if not names:  # a live Linux host always has lo: this is a snapshot without sysfs
        raise NoData("no /sys/class/net to read")
    rdma_names = host.list_dir("/sys/class/infiniband")
    if len(names) > MAX_NICS or len(rdma_names) > MAX_NICS:
        raise ParseError(f"{len(names)} netdevs and {len(rdma_names)} RDMA devices: more than a node has "
                         f"(at most {MAX_NICS} of each accepted)")
    netdevs = {name: raw for name in names if _is_netdev(raw := read_netdev(host, name))}
    rdma = {name: read_rdma_device(host, name) for name in rdma_names}
    return parse_nics(netdevs, rdma, host.addresses(), host.read_text("/proc/net/route"))


def read_netdev(host, name: str) -> dict:
    base = f"/sys/class/net/{name}"
    raw = {key: host.read_text(f"{base}/{key}") for key in (*_NET_FILES, *NETDEV_COUNTERS)}
    raw["link"] = host.read_link(base)
    driver = host.read_link(f"{base}/device/driver")
    raw["driver"] = driver.rsplit("/", 1)[-1] if driver else None
    pci = pci_address_from_path(raw["link"] or "")
    raw["numa_node"] = host.read_text(f"/sys/bus/pci/devices/{pci}/numa_node") if pci else None
    raw["bond_slaves"] = host.read_text(f"{base}/bonding/slaves")  # a bond has it, whatever its name
    return raw


def _is_netdev(raw: dict) -> bool:
    """Every netdev in /sys/class/net is a link to its device with a `type`; `bonding_masters`, a plain
    file there whenever the bonding driver is loaded, is neither."""
    return raw["link"] is not None or raw["type"] is not None


def read_rdma_device(host, name: str) -> dict:
    base = f"/sys/class/infiniband/{name}"
    ports = {port: {key: host.read_text(f"{base}/ports/{port}/{key}") for key in _IB_PORT_FILES}
             for port in host.list_dir(f"{base}/ports")}
    for port, raw in ports.items():
        raw["counters"] = read_port_counters(host, f"{base}/ports/{port}")
        table = read_gid_table(host, f"{base}/ports/{port}") if _clean(raw["link_layer"]) == "Ethernet" else None
        if table is not None:  # RoCE: the addresses NCCL picks its GID from
            raw["gids"], raw["gid_types"] = table
    return {"device": host.read_link(f"{base}/device"), "ports": ports, "netdevs": host.list_dir(f"{base}/device/net"),
            "fw_ver": host.read_text(f"{base}/fw_ver")}


def pci_address_from_path(path: str) -> str | None:
    """The last PCI address in a sysfs path ('../../devices/pci0000:00/0000:00:03.0/virtio2/net/eth0')."""
    found = [part for part in path.split("/") if _PCI_ADDRESS.match(part)]
    return found[-1] if found else None


def parse_nics(netdevs: dict[str, dict], rdma: dict[str, dict], addresses: dict, route_text: str | None) -> NicFacts:
    _check_shapes(netdevs, rdma, addresses)
    rdma_ports = {name: _ib_ports(name, raw.get("ports") or {}) for name, raw in rdma.items()}
    owner = {netdev: name for name, raw in rdma.items() for netdev in raw.get("netdevs") or []}
    nics = []
    for name in sorted(netdevs):
        nic = _nic(name, netdevs[name], addresses.get(name, []))
        nic.rdma_device = owner.get(name)
        nic.ib_ports = rdma_ports.get(nic.rdma_device, []) if nic.rdma_device else []
        firmware = _clean(rdma[nic.rdma_device].get("fw_ver")) if nic.rdma_device else None
        nic.firmware = firmware[:64] if firmware else None
        nics.append(nic)
    rdma_pci = {name: pci for name, raw in rdma.items() if (pci := pci_address_from_path(raw.get("device") or ""))}
    return NicFacts(nics, rdma_ports, rdma_pci, parse_proc_route(route_text) if route_text else [])


def _check_shapes(netdevs, rdma, addresses) -> None:
    """The raw values come from a host or a snapshot (untrusted): every value is text or absent."""
    def text_or_none(value) -> bool:
        return value is None or isinstance(value, str)

    def names(value) -> bool:
        return value is None or isinstance(value, list) and all(isinstance(n, str) for n in value)

    if not (isinstance(netdevs, dict) and isinstance(rdma, dict) and isinstance(addresses, dict)):
        raise ParseError("NIC sources: expected objects keyed by device name")
    for name, raw in netdevs.items():
        if not isinstance(raw, dict) or not all(text_or_none(v) for v in raw.values()):
            raise ParseError(f"netdev {name!r:.40}: expected text values")
    for name, raw in rdma.items():
        ports = raw.get("ports") if isinstance(raw, dict) else None
        if (not isinstance(raw, dict) or not text_or_none(raw.get("device")) or not names(raw.get("netdevs"))
                or not text_or_none(raw.get("fw_ver"))
                or not (ports is None or isinstance(ports, dict) and all(
                    isinstance(p, dict) and all(v is None or _texts(v) if k in _TEXT_TABLES else text_or_none(v)
                                                for k, v in p.items())
                    for p in ports.values()))):
            raise ParseError(f"RDMA device {name!r:.40}: unexpected values")
    for name, entries in addresses.items():
        if not isinstance(entries, list):
            raise ParseError(f"addresses of {name!r:.40}: expected a list")


def _texts(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in value.items())


def _nic(name: str, raw: dict, addresses: list[dict]) -> Nic:
    link = raw.get("link") or ""
    pci = pci_address_from_path(link)
    return Nic(
        name=name,
        kind=_ARPHRD.get(_clean(raw.get("type")) or "", "other"),
        virtual="/virtual/" in link or pci is None,
        state=_clean(raw.get("operstate")),
        speed_mbps=_positive_int(raw.get("speed"), placeholder=(4294967295, 65535)),
        mtu=_positive_int(raw.get("mtu")),
        driver=raw.get("driver"),
        pci_address=pci,
        numa_node=_non_negative_int(raw.get("numa_node")),
        mac=_clean(raw.get("address")),
        addresses=[a for a in addresses if _valid_address(a)],
        bond_members=_bond_members(raw.get("bond_slaves")),
        counters={} if pci is None else {key.rpartition("/")[2]: parse_counter(raw[key]) for key in NETDEV_COUNTERS
                                         if raw.get(key) is not None},
    )


def _bond_members(text: str | None) -> list[str] | None:
    """bonding/slaves ("eth0 eth4", empty for a bond with none yet) as names; None when the file is absent."""
    if text is None:
        return None
    return [name[:64] for name in text.split()[:MAX_NICS]]


def _ib_ports(device: str, ports: dict[str, dict]) -> list[IbPort]:
    out = []
    for number, raw in sorted((to_int(port), raw) for port, raw in ports.items() if to_int(port) is not None):
        counters = {name: parse_counter(text) for name, text in (raw.get("counters") or {}).items() if name in JUDGED}
        gids, versions = parse_gid_table(raw.get("gids"), raw.get("gid_types")) or (None, {})
        out.append(IbPort(device, number, _after_colon(raw.get("state")), _after_colon(raw.get("phys_state")),
                          _clean(raw.get("rate")), _clean(raw.get("link_layer")), counters, gids, versions))
    return out


def parse_proc_route(text: str) -> list[Route]:
    """/proc/net/route: hex little-endian IPv4 destination, gateway and mask per line."""
    routes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dest, gateway, mask = (socket.inet_ntoa(struct.pack("<I", int(f, 16))) for f in (fields[1], fields[2], fields[7]))
            prefix = ipaddress.IPv4Network(f"0.0.0.0/{mask}").prefixlen
        except (ValueError, struct.error):
            raise ParseError(f"/proc/net/route: unreadable line {line[:80]!r}") from None
        routes.append(Route(fields[0], f"{dest}/{prefix}", None if gateway == "0.0.0.0" else gateway))  # noqa: S104 a route, not a bind
    return routes


def _clean(text: str | None) -> str | None:
    value = (text or "").strip()
    return value or None


def _after_colon(text: str | None) -> str | None:
    """sysfs IB states read '4: ACTIVE', '5: LinkUp'."""
    value = _clean(text)
    return value.split(":", 1)[1].strip() if value and ":" in value else value


def _positive_int(text: str | None, placeholder: tuple[int, ...] = ()) -> int | None:
    number = to_int(_clean(text))
    return number if number is not None and number > 0 and number not in placeholder else None


def _non_negative_int(text: str | None) -> int | None:
    number = to_int(_clean(text))
    return number if number is not None and number >= 0 else None


def _valid_address(entry) -> bool:
    if not (isinstance(entry, dict) and isinstance(entry.get("address"), str) and type(entry.get("prefixlen")) is int):
        return False
    try:
        ipaddress.ip_interface(f"{entry['address']}/{entry['prefixlen']}")
    except ValueError:
        return False
    return True
