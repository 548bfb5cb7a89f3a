"""NCCL's picture of the node (probes/nccl_topo.py: its dump, a topology file, its GRAPH log) against the node's own
(the Report: NVML, sysfs, `nvidia-smi topo -m`): each disagreement named with NCCL's value beside the node's. NCCL
routes every job by its picture, so where they differ the job takes the wrong path and nothing else says why.

A dump holds only the GPUs of the job's ranks on that node: a GPU it does not hold is no finding. A value NCCL did
not write (a link width of 0, a speed of "") is unknown, never a disagreement."""

from __future__ import annotations

import dataclasses
from collections import Counter

from nodecheck.core.link_types import link_distance
from nodecheck.core.pci import normal_pci
from nodecheck.core.specs import pcie_generation
from nodecheck.core.units import first_of
from nodecheck.probes.nccl_topo import NcclTopo, NcclTopoGpu, NcclTopoNic
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

CLOSE = ("PIX", "PXB")  # topo -m's links through PCIe switches only, as NCCL's shared switch is


def topo_findings(topo: NcclTopo, report: Report) -> list[Finding]:
    topo = with_bare_devices_named(topo, report)
    gpus = _gpu_index(report)
    matched = [(mine, gpus[mine.busid]) for mine in topo.gpus if mine.busid in gpus]
    findings = []
    hops = report.hops() if topo.version is not None else {}  # a GRAPH log's tree is NCCL's after it merged switches
    names = {busid: f"gpu{gpu.index}" for busid, gpu in gpus.items()}
    for nccl_gpu, gpu in matched:
        own_hops = hops.get(nccl_gpu.busid)
        findings += _nvlinks(nccl_gpu, gpu, topo.version is None) + _nvlink_targets(nccl_gpu, gpu, names) + _c2c(nccl_gpu, gpu)
        findings += _pcie(nccl_gpu, gpu, own_hops) + _numa(topo, nccl_gpu, gpu) + _chain(f"gpu{gpu.index}", nccl_gpu.chain, own_hops, hops)
    nics = _nic_index(report)
    for nccl_nic in topo.nics:
        if (nic := _node_nic(nccl_nic, nics)) is not None:
            findings += _nic_speed(nccl_nic, nic) + _nic_gdr(nccl_nic, nic, report)
            findings += _placement(nccl_nic, nic, matched, report)
            findings += _chain(nic.rdma_device or nic.name, nccl_nic.chain, hops.get(normal_pci(nic.pci_address)), hops)
    return findings


def unmatched(topo: NcclTopo, report: Report, where: str = "the node") -> str | None:
    """Why NCCL's picture cannot be held against the node (`where`, as the command names it), or None: it names devices
    and none of them is one of the node's GPUs or NICs, matched as topo_findings matches them: another node's picture,
    or a VM's, whose bus ids are its own. Nothing compared is no agreement. `topo` as with_bare_devices_named left it."""
    gpus, nics = _gpu_index(report), _nic_index(report)
    named = [d.busid for d in (*topo.gpus, *topo.nics, *topo.unclassed)]
    if not named or any(g.busid in gpus for g in topo.gpus) or any(_node_nic(n, nics) is not None for n in topo.nics):
        return None
    theirs = first_of(named, 3)
    ours = first_of(sorted(gpus), 3) if gpus else "no GPU"
    return (f"none of its {len(named)} device(s) is a GPU or NIC of {where} (its {theirs}; the node's GPUs: {ours}): "
            "another node's picture, or a VM's whose bus ids are its own; nothing to compare")


def _gpu_index(report: Report) -> dict[str, object]:
    """The node's GPUs by their PCI address as NCCL writes it."""
    return {normal_pci(g.pci_bus_id): g for g in report.gpus if g.pci_bus_id}


def _node_nic(nccl_nic: NcclTopoNic, nics: dict[str, object]):
    """The node's NIC an NCCL <nic> is: by its bus id, else by a <net> name (_nic_index's keys); None."""
    return nics.get(nccl_nic.busid) or next((nics[n["name"]] for n in nccl_nic.nets if n.get("name") in nics), None)


def with_bare_devices_named(topo: NcclTopo, report: Report) -> NcclTopo:
    """A topology file's devices without a class as NCCL will take them on this node, which reads each one's class
    from sysfs (src/graph/xml.cc ncclTopoGetXmlFromSys): the bus id of one of the node's GPUs a bare GPU, of a NIC a
    bare NIC; the rest stay unclassed (another node's file, or devices NCCL does not route by)."""
    if not topo.unclassed:
        return topo
    gpus = _gpu_index(report)
    nics = {normal_pci(n.pci_address) for n in report.nics if n.pci_address and not n.virtual}
    return dataclasses.replace(
        topo, gpus=topo.gpus + [NcclTopoGpu(b.busid, b.cpu, b.chain) for b in topo.unclassed if b.busid in gpus],
        nics=topo.nics + [NcclTopoNic(b.busid, b.cpu, b.chain) for b in topo.unclassed if b.busid in nics and b.busid not in gpus],
        unclassed=[b for b in topo.unclassed if b.busid not in gpus and b.busid not in nics])


def topology_from_details(raw) -> NcclTopo | None:
    """The topology a measurement kept (details["nccl_topology"], from a Report: untrusted), or None when it holds
    none of that shape."""
    from nodecheck.core.typed_json import record

    if not isinstance(raw, dict):
        return None
    try:
        return record(NcclTopo, raw)
    except (ValueError, TypeError, RecursionError):
        return None


def _nvlinks(nccl_gpu: NcclTopoGpu, gpu, from_log: bool = False) -> list[Finding]:
    """The GB300 case: NVML's fabric healthy and every link active, NCCL's dump without them: its traffic goes over
    PCIe (a tray's all-reduce read 51.6 GB/s of its 507). A GRAPH log prints each GPU with all its NVLinks below it
    (no count: NVL lines are judged only when there are none)."""
    bare = nccl_gpu.dev is None and not from_log  # a topology file's <pci> of a GPU's class: it says nothing of NVLink
    if gpu.mig_enabled or not gpu.nvlinks or bare and not nccl_gpu.nvlinks or nccl_gpu.cut:
        return []  # no NVML view to hold it against, a topology file's bare GPU (it says nothing of NVLink), or a
        # paste that ends inside the GPU's NVLink list (NVIDIA/nccl#671's DGX-1 dump: gpu1's 6 links, 4 pasted)
    active = sum(1 for link in gpu.nvlinks if link.get("active"))
    counts = [link["count"] for link in nccl_gpu.nvlinks if isinstance(link.get("count"), int)]
    if active and not nccl_gpu.nvlinks:
        return [Finding("nccl_topo_nvlink_missing", "error", f"gpu{gpu.index}", "no NVLink", f"{active} active (NVML)",
                        f"NCCL sees no NVLink on gpu{gpu.index}; NVML: {active} active: this GPU's traffic goes over PCIe. "
                        "Check the fabric manager and the GPU's fabric state (`nvidia-smi -q -d FABRIC`)"
                        + ("; the log's NCCL_DEBUG_SUBSYS=GRAPH lines before the block say why NCCL left them out" if from_log
                           else ", and rerun with NCCL_DEBUG_SUBSYS=GRAPH to see why NCCL left them out"))]
    seen = sum(counts)
    if active and counts and len(counts) == len(nccl_gpu.nvlinks) and seen < active:
        return [Finding("nccl_topo_nvlink_missing", "error", f"gpu{gpu.index}", f"{seen} NVLinks", f"{active} active (NVML)",
                        f"NCCL counts {seen} NVLinks on gpu{gpu.index}; NVML: {active} active: NCCL routes it over fewer "
                        "links than it has")]
    return []


def _nvlink_targets(nccl_gpu: NcclTopoGpu, gpu, names: dict[str, str]) -> list[Finding]:
    """NCCL's `<nvlink target count>` is NVML's remote PCI bus id of each active link, counted per target
    (src/graph/xml.cc ncclTopoGetXmlFromGpu): NCCL naming peer GPUs that NVML's links do not reach is a picture of
    another wiring (a dump of another node, a topology file of another board, links rewired since). Peer GPUs only:
    NVSwitches are counted in the sum (_nvlinks), and each switch's bus id differs between bare metal and a VM."""
    ends = [link for link in gpu.nvlinks if link.get("active")]
    if nccl_gpu.dev is None or nccl_gpu.cut or not ends or any("remote" not in link for link in ends):
        return []  # a topology file's bare GPU, a paste cut inside it, or an NVML that did not say every far end
    nvml = Counter(normal_pci(link["remote"]) for link in ends if link.get("remote_type") == "gpu")
    nccl: Counter = Counter()
    for link in nccl_gpu.nvlinks:
        if not isinstance(link.get("count"), int) or not link.get("target"):
            return []  # a count or target NCCL did not write: nothing to hold against
        if str(link.get("tclass") or "").startswith("0x0302") or link["target"] in names:
            nccl[link["target"]] += link["count"]
    if nccl == nvml:
        return []

    def said(counts: Counter) -> str:
        return ", ".join(f"{names.get(end, end)} x{count}" for end, count in sorted(counts.items(), key=str)) or "no peer GPU"

    return [Finding("nccl_topo_mismatch", "warning", f"gpu{gpu.index}", f"NVLinks to {said(nccl)}", f"{said(nvml)} (NVML)",
                    f"NCCL routes gpu{gpu.index}'s NVLinks to {said(nccl)}; NVML's active links end at {said(nvml)}: "
                    "NCCL's picture is of another wiring (a dump of another node or a topology file of another board): "
                    "take a new dump (NCCL_TOPO_DUMP_FILE) on this node")]


def _chain(subject: str, chain: list, hops: list | None, every: dict) -> list[Finding]:
    """The PCI levels NCCL puts above a device against its sysfs path after NCCL's collapse: NCCL hangs each device
    two sysfs levels up, skipping a switch's downstream port, and stops at the root port (src/graph/xml.cc
    ncclTopoGetXmlFromSys, "Rewind two /"), so its levels are sysfs's hops 2, 4, ... above the device. A flattened
    VM's tree under a topology file's made-up switches is as meant (no such bridge is on the node)."""
    if not hops or not chain or any(hop.busid is None for hop in chain):
        return []
    nccl = [hop.busid for hop in reversed(chain[:-1])]  # upward from the device, as sysfs's hops go
    node = [normal_pci(hop.bdf) for hop in hops[2::2]]
    known = {normal_pci(hop.bdf) for path in every.values() for hop in path}
    if nccl == node or not node and not known.intersection(nccl):
        return []
    path = " > ".join(reversed(nccl)) or "its CPU"
    real = " > ".join(reversed(node)) or "its CPU (no PCIe switch)"
    return [Finding("nccl_topo_mismatch", "warning", subject, path, real + " (sysfs)",
                    f"NCCL places {subject} under {path}; sysfs (each switch's two ports as one level, as NCCL counts them): "
                    f"{real}: NCCL's PIX/PXB/PHB between GPUs and NICs follow its tree, so it pairs them by another one")]


def _c2c(nccl_gpu: NcclTopoGpu, gpu) -> list[Finding]:
    """A Grace GPU's NVLink-C2C links: NCCL's count against NVML's active ones (its host path, the CPU's memory)."""
    active = (gpu.c2c or {}).get("links") if isinstance(gpu.c2c, dict) else None
    if not isinstance(active, int) or active <= 0 or nccl_gpu.dev is None or nccl_gpu.cut and nccl_gpu.c2c is None:
        return []  # a bare GPU, or a paste cut inside the GPU before its <c2c>
    count = (nccl_gpu.c2c or {}).get("count")
    if isinstance(count, int) and count == active:
        return []
    seen = "no C2C link" if not isinstance(count, int) else f"{count} C2C links"
    return [Finding("nccl_topo_mismatch", "warning", f"gpu{gpu.index}", seen, f"{active} active (NVML)",
                    f"NCCL sees {seen} on gpu{gpu.index}; NVML: {active} active: NCCL rates the GPU's path to the CPU's "
                    "memory by what it sees")]


def _pcie(nccl_gpu: NcclTopoGpu, gpu, hops: list | None) -> list[Finding]:
    """A GPU's PCIe link as NCCL wrote it against NVML's maximum. Before 2.30.7 NCCL wrote the lower of the GPU's and
    its upstream port's max_link_speed and max_link_width (sysfs): a VM's emulated bridge (2.5 GT/s x1) makes it rate
    the GPU's PCIe path far below what it is (a warning). From 2.30.7 it writes NVML's current generation and width at
    its init (src/graph/xml.cc, ncclNvmlDeviceGetCurrPcieLinkGeneration): where the node's sysfs hops show the value
    is not that lower maximum, it is what the link ran at then, a GPU still at its idle link speed or a link trained
    down, which nodecheck's own PCIe checks judge: said, as info."""
    own = nccl_gpu.chain[-1] if nccl_gpu.chain else None
    pcie = gpu.pcie or {}
    device, port = (hops[0], hops[1]) if hops and len(hops) > 1 else (None, None)
    out = []
    if own is not None and own.link_width and pcie.get("width_max") and own.link_width != pcie["width_max"]:
        sysfs = min(device.width_max, port.width_max) if device and device.width_max and port.width_max else None
        out.append(_read_otherwise(gpu, f"x{own.link_width}", f"x{pcie['width_max']}", "width", sysfs is None or sysfs == own.link_width,
                                   f"NCCL reads gpu{gpu.index}'s PCIe link as x{own.link_width}; NVML: x{pcie['width_max']} at most"))
    generation = pcie_generation(f"{own.link_gts:g} GT/s") if own is not None and own.link_gts else None
    wanted = pcie.get("gen_max") or pcie.get("gen_gpu_max")
    if generation and wanted and generation != wanted:
        maxima = [pcie_generation(h.speed_max) for h in (device, port) if h is not None and h.speed_max]
        sysfs = min(maxima) if len(maxima) == 2 and None not in maxima else None
        out.append(_read_otherwise(gpu, f"{own.link_gts:g} GT/s (Gen{generation})", f"Gen{wanted}", "generation",
                                   sysfs is None or sysfs == generation,
                                   f"NCCL reads gpu{gpu.index}'s PCIe link at {own.link_gts:g} GT/s (Gen{generation}); "
                                   f"NVML: Gen{wanted}"))
    return out


def _read_otherwise(gpu, measured: str, expected: str, what: str, as_sysfs: bool, said: str) -> Finding:
    if as_sysfs:  # the lower of the GPU's and its port's maxima, as NCCL before 2.30.7 reads sysfs
        return Finding("nccl_topo_mismatch", "warning", f"gpu{gpu.index}", measured, expected,
                       f"{said}: NCCL rates the path by what it read; in a VM an emulated bridge says so, and a topology "
                       "file (NCCL_TOPO_FILE) with the host's figures corrects NCCL's picture")
    return Finding("nccl_topo_mismatch", "info", f"gpu{gpu.index}", measured, expected,
                   f"{said}, and sysfs gives the GPU and its port more: NCCL 2.30.7 on writes the link's current "
                   f"{what} as NVML gave it at NCCL's init, so the link then ran below its maximum (a GPU not yet up "
                   "from its idle link speed, or a link trained down: nodecheck's PCIe checks judge the link itself)")


def _numa(topo: NcclTopo, nccl_gpu: NcclTopoGpu, gpu) -> list[Finding]:
    numaid = topo.cpus[nccl_gpu.cpu].numaid if 0 <= nccl_gpu.cpu < len(topo.cpus) else None
    if numaid is None or gpu.numa_node is None or gpu.numa_node < 0 or numaid == gpu.numa_node:
        return []
    return [Finding("nccl_topo_mismatch", "warning", f"gpu{gpu.index}", f"NUMA node {numaid}", f"NUMA node {gpu.numa_node}",
                    f"NCCL places gpu{gpu.index} under NUMA node {numaid}; sysfs: NUMA node {gpu.numa_node}: NCCL binds its "
                    "threads and host buffers to the other socket")]


def _nic_index(report: Report) -> dict[str, object]:
    """A physical NIC by its PCI address, its RDMA device and its netdev name: how NCCL's <nic> may name it."""
    index: dict[str, object] = {}
    for nic in report.nics:
        if nic.virtual:
            continue
        for key in (normal_pci(nic.pci_address), nic.rdma_device, nic.name):
            if key:
                index.setdefault(key, nic)
    return index


def _nic_speed(nccl_nic: NcclTopoNic, nic) -> list[Finding]:
    speeds = {n["speed"] for n in nccl_nic.nets if isinstance(n.get("speed"), int) and n["speed"] > 0}
    if not nic.speed_mbps or not speeds or nic.speed_mbps in speeds:
        return []
    seen = max(speeds)
    return [Finding("nccl_topo_mismatch", "warning", nic.rdma_device or nic.name, f"{seen} Mb/s", f"{nic.speed_mbps} Mb/s",
                    f"NCCL rates {nic.rdma_device or nic.name} at {seen} Mb/s; the port says {nic.speed_mbps} Mb/s: NCCL "
                    "balances its rails by the rate it read")]


def _nic_gdr(nccl_nic: NcclTopoNic, nic, report: Report) -> list[Finding]:
    """NCCL's GPUDirect RDMA flag for a NIC against the node's own verdict (a peer-memory module, or DMA-BUF)."""
    gpudirect = report.platform.gpudirect if report.platform else None
    flags = {n.get("gdr") for n in nccl_nic.nets if n.get("gdr") is not None}
    if not gpudirect or flags != {False}:
        return []
    return [Finding("nccl_topo_mismatch", "warning", nic.rdma_device or nic.name, "gdr=0", f"GPUDirect RDMA ({gpudirect})",
                    f"NCCL marks {nic.rdma_device or nic.name} without GPUDirect RDMA (gdr=0) though the node gives it "
                    f"({gpudirect}): NCCL stages every transfer through host memory (a GB10 has none by design: its GPU "
                    "shares the CPU's memory)")]


def _placement(nccl_nic: NcclTopoNic, nic, matched: list, report: Report) -> list[Finding]:
    """A NIC NCCL puts under the same switch as a GPU where `nvidia-smi topo -m` says they are far apart, or the
    reverse (PCIe switches with virtual bridges reverse which NIC is near which GPU: NVIDIA/nccl#820)."""
    links = {(link.a, link.b): link.type for link in report.links if isinstance(link.a, int) and isinstance(link.b, str)}
    out = []
    for nccl_gpu, gpu in matched:
        topo_type = links.get((gpu.index, nic.name)) or links.get((gpu.index, nic.rdma_device or ""))
        if topo_type is None or link_distance(topo_type) is None:
            continue
        nccl_close = _share_a_switch(nccl_gpu, nccl_nic)
        if nccl_close is None or nccl_close == (topo_type in CLOSE):
            continue
        said = "under the same PCIe switch as" if nccl_close else "under another PCIe switch than"
        out.append(Finding("nccl_topo_mismatch", "warning", f"gpu{gpu.index}/{nic.rdma_device or nic.name}",
                           "near" if nccl_close else "far", topo_type,
                           f"NCCL places {nic.rdma_device or nic.name} {said} gpu{gpu.index}; `nvidia-smi topo -m`: {topo_type}: "
                           "NCCL picks each GPU's NIC by its own picture"))
    return out


def _share_a_switch(nccl_gpu: NcclTopoGpu, nccl_nic: NcclTopoNic) -> bool | None:
    """Whether NCCL has the two under a common PCIe bridge below their CPU (None: a chain NCCL did not give)."""
    if not nccl_gpu.chain or not nccl_nic.chain or nccl_gpu.cpu != nccl_nic.cpu:
        return None if not nccl_gpu.chain or not nccl_nic.chain else False
    ours = {hop.busid for hop in nccl_gpu.chain[:-1]}
    return any(hop.busid in ours for hop in nccl_nic.chain[:-1])
