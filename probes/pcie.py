"""The PCIe path of every GPU and NIC up to its root port, hop by hop, from sysfs: the device's real
path under /sys/devices names every bridge above it (switch ports, the root port), and each hop's
current_link_width / max_link_width say how its upstream link trained. NVML sees only the GPU's own
link; a switch uplink trained at x8 halves every GPU behind it without NVML noticing.

Widths only: an idle link lowers its speed to save power (an idle GPU sits at 2.5 GT/s), never its width.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from nodecheck.errors import NoData
from nodecheck.probes.base import Probe
from nodecheck.units import to_int

_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
DEVICE_CLASSES = ("0x0300", "0x0302", "0x0200", "0x0207")  # VGA, 3D controller (GPUs); Ethernet, InfiniBand
MAX_DEVICES = 4096
MAX_DEPTH = 16  # hops from a device to its root port: real trees have two to six
_WIDTHS = (1, 2, 4, 8, 12, 16, 32)


@dataclass
class Hop:
    bdf: str
    width: int | None  # lanes its upstream link trained at (current_link_width)
    width_max: int | None  # lanes it can train at (max_link_width)
    speed: str | None  # as sysfs prints it: "32.0 GT/s PCIe"
    speed_max: str | None


def collect(host, timeout: float) -> dict[str, list[Hop]]:
    """{endpoint PCI address: [its hops, the endpoint first, its root port last]} for GPUs and NICs."""
    names = host.list_dir("/sys/bus/pci/devices")[:MAX_DEVICES]
    if not names:
        raise NoData("/sys/bus/pci/devices lists no device")
    paths = {}
    for bdf in names:
        kind = (host.read_text(f"/sys/bus/pci/devices/{bdf}/class") or "").strip()[:6]
        if kind not in DEVICE_CLASSES:
            continue
        real = host.read_link(f"/sys/bus/pci/devices/{bdf}") or ""
        chain = [part for part in real.split("/") if _BDF.match(part)][-MAX_DEPTH:] or [bdf]
        paths[bdf] = [_hop(host, hop) for hop in reversed(chain)]
    return paths


def _hop(host, bdf: str) -> Hop:
    def read(name: str) -> str | None:
        text = host.read_text(f"/sys/bus/pci/devices/{bdf}/{name}")
        return text.strip()[:40] if text and text.strip() else None

    def lanes(name: str) -> int | None:
        value = to_int(read(name) or "")
        return value if value in _WIDTHS else None  # 0 (link down) and garbage are unknown

    return Hop(bdf, lanes("current_link_width"), lanes("max_link_width"), read("current_link_speed"), read("max_link_speed"))


def hops_from_report(raw) -> dict[str, list[Hop]]:
    """Report.pcie_paths back to Hops, dropping what is not a hop's shape (a Report read from a file is
    untrusted): {normalized PCI address: hops}."""
    from nodecheck.bench.identity import normal_pci

    def value(hop: dict, key: str, kind: type):
        got = hop.get(key)
        return got if isinstance(got, kind) and not isinstance(got, bool) else None

    paths = {}
    for bdf, hops in (raw.items() if isinstance(raw, dict) else ()):
        chain = [Hop(normal_pci(h["bdf"]), value(h, "width", int), value(h, "width_max", int), value(h, "speed", str),
                     value(h, "speed_max", str))
                 for h in (hops if isinstance(hops, list) else ()) if isinstance(h, dict) and isinstance(h.get("bdf"), str)]
        if isinstance(bdf, str) and normal_pci(bdf) and chain:
            paths[normal_pci(bdf)] = chain
    return paths


def narrow_hops(hops: list[Hop]) -> list[tuple[int, Hop, int]]:
    """(position, hop, lanes it could have) for every hop whose upstream link trained narrower than both
    ends allow: min(its own max, the max of the port above it). A x8 card in a x16 slot is not narrow."""
    out = []
    for position, hop in enumerate(hops):
        above = hops[position + 1] if position + 1 < len(hops) else None
        capable = min(w for w in (hop.width_max, above.width_max if above else None) if w) if hop.width_max else None
        if hop.width and capable and hop.width < capable:
            out.append((position, hop, capable))
    return out


def fill(report, paths: dict[str, list[Hop]]) -> None:
    report.pcie_paths = {bdf: [asdict(h) for h in hops] for bdf, hops in paths.items()}


PROBE = Probe("pcie_paths", collect, 5.0, fill)
