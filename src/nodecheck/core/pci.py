"""PCI addresses and PCIe paths, in the one spelling every layer compares: a device's address as sysfs
writes it ('0000:1b:00.0'), its hops up to the root port, and which of those links trained narrow."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodecheck.core.specs import pcie_generation

SYSFS_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")  # as sysfs and /proc name a device: fullmatch


def normal_pci(bus_id: str | None) -> str | None:
    """'00000000:1B:00.0' (NVML), '0000:1b:00.0' (sysfs, hwloc, lspci -D) -> '0000:1b:00.0'; None for what
    is not a domain:bus:device.function address."""
    if not isinstance(bus_id, str) or bus_id.count(":") != 2:
        return None
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if domain and all(c in "0123456789abcdef" for c in domain) else None


def link_of(address: str, hops: list) -> str:
    """The physical link a device's traffic enters the host by, named by the port above it: every function
    of a dual-port card (and so each of its ports) sits below one ("mlx5_core 0000:b3:00.1: ... limited by
    8 GT/s x8 link at 0000:b2:00.0"); without a port above (a VM's root bus), the device less its function."""
    return hops[1].bdf if len(hops) > 1 else address.rpartition(".")[0]


@dataclass
class Hop:
    """One device on a PCIe path and the link above it, from /sys/bus/pci/devices/ADDRESS/."""

    bdf: str
    width: int | None  # current_link_width: lanes its upstream link trained at
    width_max: int | None  # max_link_width: lanes it can train at
    speed: str | None  # current_link_speed, as sysfs prints it: "32.0 GT/s PCIe"
    speed_max: str | None  # max_link_speed
    aer: dict[str, int] | None = None  # AER counts since boot: correctable, nonfatal, fatal (+ "family.Name" when nonzero)


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


def slow_hops(hops: list[Hop], judged: set[str]) -> list[tuple[int, Hop, int, int]]:
    """(position, hop, its generation, the generation it could have) for every hop in `judged` whose link
    trained at a lower speed than both ends allow: min(its own max, the max of the port above it). Only
    links that keep their speed when idle can be judged so: a GPU's link, and a switch uplink it shares,
    drop to 2.5 GT/s to save power; a NIC's own link does not. The port above a slow hop reports the same
    link: it is not named again."""
    out = []
    for position, hop in enumerate(hops):
        above = hops[position + 1] if position + 1 < len(hops) else None
        gen, own_max = pcie_generation(hop.speed), pcie_generation(hop.speed_max)
        above_max = pcie_generation(above.speed_max) if above else None
        capable = min(g for g in (own_max, above_max) if g) if own_max else None
        below = out[-1][1] if out and out[-1][0] == position - 1 else None
        same_link = below is not None and (below.speed, below.width) == (hop.speed, hop.width)
        if hop.bdf in judged and gen and capable and gen < capable and not same_link:
            out.append((position, hop, gen, capable))
    return out
