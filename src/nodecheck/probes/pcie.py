"""The PCIe path of every GPU and NIC up to its root port, hop by hop, from sysfs: the device's real
path under /sys/devices names every bridge above it (switch ports, the root port), and each hop's
current_link_width / max_link_width say how its upstream link trained. NVML sees only the GPU's own
link; a switch uplink trained at x8 halves every GPU behind it without NVML noticing.

Speeds are read too, but judged only on a NIC's own links (src/nodecheck/core/pci.py slow_hops): an idle GPU's link, and
a switch uplink it shares, lower their speed to save power (2.5 GT/s), never their width.
Each hop's AER counters are read on the way (src/nodecheck/probes/aer.py): the errors of the links that carry its traffic.
"""

from __future__ import annotations

from nodecheck.core.errors import NoData
from nodecheck.core.pci import SYSFS_ADDRESS, Hop
from nodecheck.core.units import to_int
from nodecheck.probes.aer import read_aer
from nodecheck.probes.base import Probe

DEVICE_CLASSES = ("0x0300", "0x0302", "0x0200", "0x0207")  # VGA, 3D controller (GPUs); Ethernet, InfiniBand
MAX_DEVICES = 4096
MAX_DEPTH = 16  # hops from a device to its root port: real trees have two to six
_WIDTHS = (1, 2, 4, 8, 12, 16, 32)


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
        chain = [part for part in real.split("/") if SYSFS_ADDRESS.fullmatch(part)][-MAX_DEPTH:] or [bdf]
        paths[bdf] = [_hop(host, hop) for hop in reversed(chain)]
    return paths


def _hop(host, bdf: str) -> Hop:
    def read(name: str) -> str | None:
        text = host.read_text(f"/sys/bus/pci/devices/{bdf}/{name}")
        return text.strip()[:40] if text and text.strip() else None

    def read_all(name: str) -> str | None:
        return host.read_text(f"/sys/bus/pci/devices/{bdf}/{name}")

    def lanes(name: str) -> int | None:
        value = to_int(read(name) or "")
        return value if value in _WIDTHS else None  # 0 (link down) and garbage are unknown

    return Hop(bdf, lanes("current_link_width"), lanes("max_link_width"), read("current_link_speed"), read("max_link_speed"),
               read_aer(read_all))


def fill(report, paths: dict[str, list[Hop]]) -> None:
    report.pcie_paths = paths


PROBE = Probe("pcie_paths", collect, 5.0, fill)
