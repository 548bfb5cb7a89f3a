"""Path specs: the theoretical one-way rate of every path a measurement can take (a GPU's host link, a GPU pair,
a NIC), from the Report's facts and specs.toml, with the hop that bounds each."""

from __future__ import annotations

from nodecheck.core import specs
from nodecheck.core.link_types import link_class, nvlink_count
from nodecheck.core.pci import Hop, normal_pci
from nodecheck.report.model import Gpu, Nic, PathSpec, Report


def host_link_spec(gpu: Gpu, hops: list | None = None) -> PathSpec:
    """The GPU's own PCIe link (NVML), or a slower hop above it on its way to the root port (sysfs):
    a GPU at gen5 x16 behind a gen4 switch moves no more than gen4 x16 to the host. A GPU with active NVLink-C2C
    links to a Grace CPU reaches the host over them: their count times the slowest one's rate (NVML, as NCCL
    reads them)."""
    c2c = gpu.c2c or {}
    if c2c.get("links") and c2c.get("link_mbps"):
        return PathSpec(f"gpu{gpu.index}:host", "c2c", c2c["links"] * c2c["link_mbps"] * 1e6,
                        f"NVLink-C2C {c2c['links']} links x {c2c['link_mbps']} MB/s (NVML)",
                        "NVML NVML_FI_DEV_C2C_LINK_COUNT/_GET_STATUS/_GET_MAX_BW per link, as NCCL's topology reads them")
    own = _own_link_spec(gpu)
    slowest = _slowest_hop((hops or [])[1:], lambda hop: hop.speed_max)
    if own.bytes_per_second is None or slowest is None or slowest[0].bytes_per_second >= own.bytes_per_second:
        return own
    spec, hop = slowest
    return PathSpec(own.path, "pcie", spec.bytes_per_second,
                    f"{spec.basis} at {hop.bdf}, the slowest hop on the way to the CPU (the GPU's own link: {own.basis})",
                    spec.source)


def _slowest_hop(hops: list[Hop], speed_of) -> tuple[specs.Spec, Hop] | None:
    """(the PCIe spec, the hop) of the hop that moves least, each at its width as trained and at the speed
    `speed_of(hop)` gives (sysfs text); None when no hop's rate is known."""
    slowest = None
    for hop in hops:
        gen, width = specs.pcie_generation(speed_of(hop)), hop.width or hop.width_max
        spec = specs.pcie(gen, width) if gen and width else None
        if spec and (slowest is None or spec.bytes_per_second < slowest[0].bytes_per_second):
            slowest = (spec, hop)
    return slowest


def _own_link_spec(gpu: Gpu) -> PathSpec:
    path = f"gpu{gpu.index}:host"
    pcie = gpu.pcie or {}
    gen_max, width = pcie.get("gen_max"), pcie.get("width_current")
    if gen_max is None or width is None:
        return PathSpec(path, "pcie", None, "PCIe generation/width unknown (NVML did not report them)")
    busy = (gpu.utilization_percent or 0) >= specs.BUSY_UTILIZATION
    gen = min(pcie.get("gen_current") or gen_max, gen_max) if busy else gen_max
    width = min(width, pcie.get("width_max") or width)
    spec = specs.pcie(gen, width)
    if spec is None:
        return PathSpec(path, "pcie", None, f"no spec for PCIe gen {gen} x{width}")
    note = "" if busy else " (idle: the link trains up to its max generation under load)"
    return PathSpec(path, "pcie", spec.bytes_per_second, spec.basis + note, spec.source)


def pair_spec(a: Gpu, b: Gpu, link_type: str, host_specs: dict[int, PathSpec]) -> PathSpec:
    path = f"gpu{a.index}:gpu{b.index}"
    links = nvlink_count(link_type)
    if links is not None:
        return _nvlink_spec(path, link_type, links, a, b)
    slower = min((host_specs[a.index], host_specs[b.index]), key=lambda s: s.bytes_per_second or 0)
    if "c2c" in (host_specs[a.index].kind, host_specs[b.index].kind):
        return PathSpec(path, "pcie", None, f"{link_type} ({link_class(link_type)}): the GPUs reach each other through "
                                            "their Grace CPUs (NVLink-C2C and the CPUs' own link), which has no spec here")
    if slower.bytes_per_second is None:
        return PathSpec(path, "pcie", None, f"{link_type} ({link_class(link_type)}): PCIe link of the GPUs unknown")
    return PathSpec(path, "pcie", slower.bytes_per_second,
                    f"{link_type} ({link_class(link_type)}), slower GPU's link: {slower.basis}", slower.source)


def gpu_nvlink_spec(gpu: Gpu, links: int) -> tuple[specs.Spec | None, str]:
    """`links` NVLinks of this GPU, at its per-link rate from its architecture (NVML's version enum of its active
    links is a cross-check only: specs.nvlink_for_gpu); (None, why) when unknown."""
    versions = [l["version"] for l in gpu.nvlinks if l.get("active") and isinstance(l.get("version"), int)]
    return specs.nvlink_for_gpu(gpu.architecture, gpu.name, min(versions) if versions else None, links, gpu.nvlink_speed_mbps)


def _nvlink_spec(path: str, link_type: str, links: int, a: Gpu, b: Gpu) -> PathSpec:
    """`links` NVLinks at the slower GPU's per-link rate (gpu_nvlink_spec)."""
    judged = [gpu_nvlink_spec(gpu, links) for gpu in (a, b)]
    if any(spec is None for spec, _ in judged):
        return PathSpec(path, "nvlink", None, f"{link_type}: " + next(why for spec, why in judged if spec is None))
    spec = min((spec for spec, _ in judged), key=lambda s: s.bytes_per_second)
    return PathSpec(path, "nvlink", spec.bytes_per_second, spec.basis, spec.source)


def nic_line_spec(nic: Nic) -> tuple[specs.Spec | None, str]:
    """The rate its own link negotiated (an ACTIVE InfiniBand/RoCE port's rate, else the netdev's speed) and
    the path kind; (None, kind) when unknown."""
    active = [p for p in nic.ib_ports if p.state == "ACTIVE" and p.rate]
    if active:
        kind = "infiniband" if (active[0].link_layer or "").lower() == "infiniband" else "ethernet"
        return specs.infiniband(active[0].rate), kind
    return specs.ethernet(nic.speed_mbps), "ethernet"


def nic_spec(nic: Nic, expected_mbps: int | None, hops: list | None = None, shared: frozenset = frozenset()) -> PathSpec:
    """Its link rate, or its PCIe path where that is slower (a 400 Gbit/s NIC in a gen4 x16 slot moves
    31.5 GB/s at most): each hop at the speed it trained at, except those a GPU's path shares (`shared`:
    they lower their speed when idle), taken at their max."""
    expected = expected_mbps * 1e6 / 8 if expected_mbps else None
    line, kind = nic_line_spec(nic)
    if line is None:
        return PathSpec(f"nic:{nic.name}", kind, None, "link speed unknown (not reported, or the link is down)",
                        expected_bytes_per_second=expected)
    slowest = nic_pcie_bound(hops or [], shared)
    if slowest is None or slowest[0].bytes_per_second >= line.bytes_per_second:
        return PathSpec(f"nic:{nic.name}", kind, line.bytes_per_second, line.basis, line.source, expected)
    bound, hop = slowest
    return PathSpec(f"nic:{nic.name}", kind, bound.bytes_per_second, f"{line.basis}, limited by {bound.basis} at {hop.bdf}",
                    bound.source, expected, line_bytes_per_second=line.bytes_per_second)


def nic_pcie_bound(hops: list[Hop], shared: frozenset) -> tuple[specs.Spec, Hop] | None:
    """(spec, hop) of the slowest link on a NIC's PCIe path: each at the speed it trained at, except those a
    GPU's path shares (`shared`), taken at their max; None when no hop's rate is known."""
    return _slowest_hop(hops, lambda hop: hop.speed_max if hop.bdf in shared else hop.speed or hop.speed_max)


def gpu_hops(report: Report, hops: dict) -> frozenset[str]:
    """The PCI addresses on any GPU's path to its root port (`hops`: report.hops()): links that lower their speed
    when the GPU idles."""
    return frozenset(hop.bdf for g in report.gpus for hop in hops.get(normal_pci(g.pci_bus_id), []))


def path_specs(report: Report, config=None) -> list[PathSpec]:
    hops = report.hops()
    host_specs = {g.index: host_link_spec(g, hops.get(normal_pci(g.pci_bus_id))) for g in report.gpus}
    by_index = {g.index: g for g in report.gpus}
    paths = list(host_specs.values())
    for link in report.links:
        if isinstance(link.a, int) and isinstance(link.b, int) and link.a in by_index and link.b in by_index:
            paths.append(pair_spec(by_index[link.a], by_index[link.b], link.type, host_specs))
    shared = gpu_hops(report, hops)
    for nic in report.nics:
        expected = config.nic_speed_mbps(nic) if config else None
        paths.append(nic_spec(nic, expected, hops.get(normal_pci(nic.pci_address)), shared))
    return paths
