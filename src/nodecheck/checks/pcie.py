"""The PCIe links between a GPU or NIC and its root port, judged from sysfs (src/nodecheck/probes/pcie.py): a link that
trained narrower, or (a NIC's) slower, than both its ends allow. Each is named once, at the device whose link
it is, with every device behind it. Pure: reads the Report."""

from __future__ import annotations

from nodecheck.assemble.paths import gpu_hops
from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.core.pci import narrow_hops, normal_pci, slow_hops
from nodecheck.core.specs import pcie, pcie_generation
from nodecheck.core.units import format_bits
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def narrow_links(report: Report, config: Config) -> list[Finding]:
    """A link on a GPU's or NIC's PCIe path (a switch port, a riser, the root port) trained narrower than
    both its ends allow, named once per link with every device behind it. A GPU's own link is NVML's to
    judge (pcie_downtrained)."""
    paths = report.hops()

    devices = [(f"gpu{g.index}", normal_pci(g.pci_bus_id), True) for g in report.gpus]
    devices += [(n.name, normal_pci(n.pci_address), False) for n in report.nics if n.pci_address]
    narrow: dict[str, tuple] = {}
    for subject, pci, is_gpu in devices:
        for position, hop, capable in narrow_hops(paths.get(pci, [])):
            if not (position == 0 and is_gpu):
                narrow.setdefault(hop.bdf, (hop, capable, []))[2].append(subject)
    return [Finding("pcie_hop_narrow", "error", f"pci:{bdf}", f"x{hop.width}", f"x{capable}",
                    f"the PCIe link of {bdf} trained at x{hop.width} (x{capable} capable): {', '.join(behind)} behind it "
                    f"get {hop.width / capable:.0%} of its bandwidth; reseat the card or riser, check the slot and the BIOS")
            for bdf, (hop, capable, behind) in sorted(narrow.items())]


def slow_nic_links(report: Report, config: Config) -> list[Finding]:
    """A link on a NIC's PCIe path that trained at a lower speed than both its ends allow (a gen5 card in a
    gen5 slot at 16 GT/s). Links a GPU's path shares are left out: they lower their speed when idle. An error
    where the link now moves less than a NIC's link rate and some other NIC of the node trained at full speed
    (one card, riser or slot at fault); a warning where every NIC's own link trained down alike (a BIOS speed
    setting or the platform: the fleet's peers say whether it is this node's type) or where the NIC keeps its
    link rate (a link that trained down is marginal even with bandwidth to spare)."""
    hops, specs = report.hops(), {p.path: p for p in report.paths}
    shared = gpu_hops(report, hops)
    slow: dict[str, tuple] = {}
    judged = set()
    for nic in report.nics:
        path = hops.get(normal_pci(nic.pci_address), []) if nic.pci_address else []
        if path and path[0].bdf not in shared and pcie_generation(path[0].speed) and pcie_generation(path[0].speed_max):
            judged.add(nic.name)
        spec = specs.get(f"nic:{nic.name}")
        line = spec and spec.link_bytes_per_second
        for _, hop, gen, capable in slow_hops(path, {h.bdf for h in path} - shared):
            now = pcie(gen, hop.width or hop.width_max or 0)
            entry = slow.setdefault(hop.bdf, (gen, capable, now, []))
            entry[3].append((nic.name, line if now and line and now.bytes_per_second < line else None))
    alike = judged <= {name for *_, behind in slow.values() for name, _ in behind}
    return [_slow_link(bdf, gen, capable, now, behind, alike) for bdf, (gen, capable, now, behind) in sorted(slow.items())]


def _slow_link(bdf: str, gen: int, capable: int, now, behind: list, alike: bool) -> Finding:
    short = [name for name, line in behind if line]
    if short:
        fastest = max(line for _, line in behind if line)
        effect = (f"{', '.join(short)} behind it cannot reach its link rate ({format_bits(fastest)}): {now.basis} moves "
                  f"{format_bits(now.bytes_per_second)}")
    else:
        effect = f"{', '.join(name for name, _ in behind)} behind it keeps its link rate, over a link that trained down"
    if alike:
        effect += "; every NIC of this node trained down alike: a BIOS PCIe speed setting or the platform, not one card"
    return Finding("pcie_hop_slow", "error" if short and not alike else "warning", f"pci:{bdf}", f"gen{gen}", f"gen{capable}",
                   f"the PCIe link of {bdf} trained at gen{gen}, gen{capable} capable: {effect}; reseat the card or riser, "
                   "check the slot and the BIOS's PCIe speed setting")


def acs_redirect(report: Report, config: Config) -> list[Finding]:
    """For every GPU pair and GPU-RDMA NIC pair under a common switch, the bridges between them (the ports
    below the switch's upstream port where each one's traffic enters it): one with ACS P2P request or
    completion redirect on sends their peer traffic up to the root complex. Named once per bridge."""
    redirect = report.acs_redirects() or {}
    if not any(redirect.values()):
        return []
    paths = report.hops()
    chains = {bdf: [hop.bdf for hop in hops] for bdf, hops in paths.items()}
    gpus = [(f"gpu{g.index}", chains.get(normal_pci(g.pci_bus_id))) for g in report.gpus]
    nics = [(n.name, chains.get(normal_pci(n.pci_address))) for n in report.rdma_nics_up() if n.pci_address]
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:] + nics]
    redirecting: dict[str, list[str]] = {}
    for (name_a, chain_a), (name_b, chain_b) in pairs:
        if not chain_a or not chain_b:
            continue
        common = set(chain_a[1:]) & set(chain_b[1:])
        if not common:
            continue  # they meet only at the root complex: their traffic goes up there anyway
        below = [bdf for chain in (chain_a, chain_b) for bdf in chain[1:next(i for i, b in enumerate(chain) if b in common)]]
        for bdf in below:
            if redirect.get(bdf):
                redirecting.setdefault(bdf, []).append(f"{name_a}-{name_b}")
    return [Finding("pcie_acs_redirect", "warning", f"pci:{bdf}", "ReqRedir+ or CmpltRedir+", "ReqRedir- CmpltRedir-",
                    f"ACS on the PCIe switch port {bdf} redirects peer-to-peer requests to the root complex: "
                    f"{', '.join(sorted(set(affected)))} go through the CPU instead of across the switch (lower P2P and "
                    "GPUDirect RDMA bandwidth); disable ACS in the BIOS, boot with pci=disable_acs_redir=" + bdf +
                    f" (or config_acs=), or `setpci -s {bdf} ECAP_ACS+6.w=0000` until the next boot")
            for bdf, affected in sorted(redirecting.items())]


def acs_unknown(report: Report) -> dict[str, str]:
    """ACS unread (lspci missing or hung, or not root for the extended config space): the redirect check cannot look."""
    if report.acs_redirects() is None:
        return {PCIE_ACS_REDIRECT.name: (report.pcie_acs and report.pcie_acs.why) or "ACS not read"}
    return {}


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
PCIE_HOP_NARROW = Kind("pcie_hop_narrow", "fabric", "{subject} PCIe {measured} < {expected}",
    doc=(
        ("error",
         "a link on a GPU's or NIC's PCIe path (switch port, riser, root port; the NIC's own link) trained narrower than "
         "min(its max width, the max width of the port above): subject `pci:ADDRESS`, every device behind it named"),
    ))
PCIE_HOP_SLOW = Kind("pcie_hop_slow", "fabric", "{subject} PCIe {measured} < {expected}",
    doc=(
        ("error, warning",
         "a link on a NIC's PCIe path (the NIC's own link, a switch port, the root port) trained at a lower speed than min(its "
         "max speed, the max speed of the port above): subject `pci:ADDRESS`, measured/expected the generations, every NIC "
         "behind it named; an error where the link now moves less than a NIC's link rate and another NIC of the node trained at"
         " full speed (one card, riser or slot at fault), a warning where every NIC's own link trained down alike (a BIOS speed"
         " setting or the platform: `NodecheckNicsSlowerThanPeers` and `nodecheck fleet` compare the node with its type) or "
         "where the NIC keeps its rate. Links a GPU's path shares are not judged by speed (they idle down with the GPU); a card"
         " faster than its slot is the design, not a fault"),
    ))
PCIE_ACS_REDIRECT = Kind("pcie_acs_redirect", "fabric", "{subject} ACS redirects peer traffic",
    doc=(
        ("warning",
         "a bridge between two GPUs, or a GPU and an ACTIVE RDMA NIC, under a common PCIe switch has ACS P2P request or "
         "completion redirect on (`lspci -vvv` ACSCtl `ReqRedir+`/`CmpltRedir+`): their peer traffic goes up to the root "
         "complex; subject `pci:ADDRESS`, every pair named, the fix (BIOS, `pci=disable_acs_redir=`/`config_acs=`, `setpci`)"),
    ))

NARROW = Check((PCIE_HOP_NARROW,), narrow_links, needs="pcie_paths")
SLOW = Check((PCIE_HOP_SLOW,), slow_nic_links, needs="pcie_paths")
ACS = Check((PCIE_ACS_REDIRECT,), acs_redirect, unknown=acs_unknown)
