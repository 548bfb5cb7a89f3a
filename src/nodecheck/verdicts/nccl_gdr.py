"""Why an NCCL run's network channels went without GPUDirect RDMA (no `/GDRDMA`), and whether that is a fault on a
node like the Report's. Pure: no I/O.

NCCL takes GPUDirect RDMA only where the NIC can reach GPU memory (a peer-memory module or DMA-BUF) and only up to
NCCL_NET_GDR_LEVEL's distance, PXB unless set (src/graph/paths.cc, ncclTopoCheckGdr): past a PCIe switch it stages
through the CPU by design. NCCL's maintainers: "GPU Direct RDMA is not required in many cases; if we have to go through
the CPU for NIC-GPU communication, we will use simple GPU->CPU and CPU->NIC communication ... The one case where GPU
Direct RDMA is needed is when the NIC and GPU are on the same PCI switch" (NVIDIA/nccl#465), and forcing it across the
CPU "may not give you better performance" (NVIDIA/nccl#1151)."""

from __future__ import annotations

from nodecheck.core.link_types import NCCL_DEFAULT_REACH, link_distance, link_family, nccl_reach
from nodecheck.core.specs import no_gpudirect_rdma
from nodecheck.core.units import first_of
from nodecheck.report.findings import Finding

# NCCL_NET_GDR_LEVEL's legacy numbers (NCCL's env documentation: 0 never, 1 same PCI switch, 2 through PCI switches,
# 3 same root complex, 4 same NUMA node, 5 across the SMP interconnect), as the level names nccl_reach reads
LEGACY_LEVELS = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "PHB", "5": "SYS"}
MAX_NAMED = 4


def gdr_finding(run, report) -> Finding:
    """The finding for a run whose network channels lack GPUDirect RDMA (run.gdr False), naming its cause: the NIC
    side (NCCL found no GPUDirect on the HCA: a warning); the run's NCCL_NET_GDR_LEVEL, or NCCL's distance rule, where
    the node has a GPU and an RDMA NIC on one PCIe switch (a warning: NCCL's picture is not the node's); the node's
    layout, where no GPU shares a PCIe switch with an RDMA NIC (NCCL's design: info)."""
    transports = ", ".join(run.inter_node_transports)

    def finding(severity: str, message: str) -> Finding:
        return Finding("nccl_no_gdr", severity, "nccl", transports, "/GDRDMA",
                       "NCCL's network channels run without GPUDirect RDMA" + message)

    if designed := no_gpudirect_rdma([g.name for g in report.gpus]):
        return finding("info", f", as on every node of {report.gpus[0].name}: its GPU gives NICs no GPUDirect RDMA by "
                               f"design ({designed}); NCCL stages through pinned host memory")
    plugin = [said for said in run.gdr_off_nics if said.startswith("NET/OFI")]
    if plugin:  # aws-ofi-nccl's own words: the libfabric provider cannot leave CUDA calls out, or has no HMEM support
        return finding("warning", f": the net plugin turned it off (\"{plugin[0][:120]}\"): inter-node data is staged "
                                  "through host memory; update aws-ofi-nccl and libfabric (the EFA installer's), and check "
                                  "that the instance type supports GPUDirect RDMA over EFA")
    if nics := _used(run, [said for said in run.gdr_off_nics if not said.startswith("NET/OFI")]):
        return finding("warning", f": NCCL found none on {_named(nics)} (\"GPU Direct RDMA Disabled for HCA\"): "
                                  f"inter-node data is staged through host memory; {_module_state(report)}")
    level = run.settings.get("NCCL_NET_GDR_LEVEL", "").strip().upper()
    level = LEGACY_LEVELS.get(level, level)
    paths = _gpu_nic_paths(report)
    switch = _within(paths, NCCL_DEFAULT_REACH)  # NCCL's default reach: one PCIe switch
    reached = _within(paths, nccl_reach(level)) if level else switch  # the run's own reach
    far = _closest(paths)
    said = f" (NCCL: {_named(run.gdr_off_distance)})" if run.gdr_off_distance else ""
    if switch and not reached:
        return finding("warning", f": the run's NCCL_NET_GDR_LEVEL={level} keeps it off{said}, although {switch} share a "
                                  "PCIe switch: inter-node data is staged through host memory")
    if reached and run.gdr_off_distance:
        return finding("warning", f": NCCL placed the NICs past its GDR level{said}, while on this node {reached} are "
                                  "within it: NCCL's picture of the PCI tree is not the node's (a VM's flattened tree: "
                                  "`nodecheck nccl-topo`)")
    if far and not reached and not any(gpu.on_grace() for gpu in report.gpus):
        return finding("info", f"{said}, as NCCL chooses on this node: no GPU shares a PCIe switch with an RDMA NIC "
                               f"({far}), so NCCL stages through the CPU by design (NCCL_NET_GDR_LEVEL defaults to PXB); in "
                               "a VM whose PCI tree is flattened, `nodecheck nccl-topo --write` gives NCCL the host's tree")
    if run.gdr_off_distance and not far:  # the node's GPU-NIC paths are unknown: NCCL's own rule is all there is
        return finding("info", f" by NCCL's distance rule{said}: the GPUs and NICs do not share a PCIe switch as NCCL "
                               "sees them (NCCL_NET_GDR_LEVEL defaults to PXB)")
    return finding("warning", ": inter-node data is staged through host memory; load nvidia_peermem (or use DMA-BUF), "
                              "check NCCL_NET_GDR_LEVEL and the GPU-NIC distance"
                              + (f" ({reached} within its GDR level)" if reached else ""))


def _used(run, nics: list[str]) -> list[str]:
    """Of the HCAs NCCL found no GPUDirect on ("mlx5_1 (no module)"), those its network channels used, where the log's
    "NET/IB : Using [N]hca:port" lines name the N of "NET/IB/N"; all of them where it does not (a storage NIC without
    GPUDirect is not why the rails ran without it)."""
    indexes = {t.split("/")[2] for t in run.inter_node_transports if len(t.split("/")) > 2}
    used = {name.split(":")[0] for names in run.net_device_names.values() for index, name in names.items() if index in indexes}
    return [said for said in nics if said.split(" ")[0] in used] if used else nics


def _gpu_nic_paths(report) -> list[tuple[int, str, str]]:
    """The node's GPU-to-RDMA-NIC links (topo -m): (GPU index, NIC name, link type)."""
    names = {name for nic in report.rdma_nics_up() for name in (nic.name, nic.rdma_device) if name}
    return [(l.a, l.b, l.type) for l in report.links if isinstance(l.a, int) and isinstance(l.b, str) and l.b in names]


def _within(paths: list, reach: tuple) -> str:
    """Those paths GDR takes at this reach ("gpu0 and mlx5_0 (PIX)"); "" for none."""
    return _named([f"gpu{a} and {b} ({kind})" for a, b, kind in paths if link_family(kind) in reach])


def _closest(paths: list) -> str:
    """Each GPU's closest RDMA NIC ("gpu0-mlx5_0 NODE"); "" for none."""
    closest: dict[int, tuple] = {}
    for a, b, kind in paths:
        if a not in closest or link_distance(kind) < closest[a][0]:
            closest[a] = (link_distance(kind), f"gpu{a}-{b} {kind}")
    return _named([closest[a][1] for a in sorted(closest)])


def _module_state(report) -> str:
    """What the node says of the peer-memory module and DMA-BUF, as advice for a NIC NCCL found no GPUDirect on."""
    facts = report.platform
    if facts is not None and facts.modules_known and facts.peer_memory:
        return (f"this node has {facts.peer_memory} loaded: the log is another node's, or the module is not registered "
                "(NCCL looks for /sys/kernel/mm/memory_peers/nv_mem/version)")
    if facts is not None and facts.dma_buf:
        return ("this node can give NICs GPU memory through DMA-BUF (open kernel modules, Linux >= 5.12), which NCCL uses "
                "from 2.13 on, not before, nor a net plugin without it; else load nvidia_peermem")
    return "load nvidia_peermem, or use the open kernel modules on Linux >= 5.12 for DMA-BUF"


def _named(items: list[str]) -> str:
    return first_of(items, MAX_NAMED)
