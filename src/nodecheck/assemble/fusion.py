"""The probes' facts fused into one Report: GPUs from topo -m, NVML and lstopo; NICs from topo -m, sysfs and
lstopo; the links between them."""

from __future__ import annotations

from nodecheck.core.link_types import link_class, link_distance
from nodecheck.core.pci import normal_pci
from nodecheck.core.units import natural_key
from nodecheck.probes import ProbeResult
from nodecheck.probes.lstopo import LstopoFacts
from nodecheck.probes.nics import NicFacts
from nodecheck.probes.nvml import COMPUTE_MODES, NvmlFacts
from nodecheck.probes.topo import GpuTopology
from nodecheck.report.model import (
    Cpu,
    Gpu,
    GpuFabric,
    GpuProcess,
    GpuSignals,
    InaccessibleGpu,
    Link,
    Nic,
    ProbeOutcome,
    Report,
)


def _facts(results: dict[str, ProbeResult], name: str):
    result = results.get(name)
    return result.facts if result and result.ok else None


def merge(results: dict[str, ProbeResult], identity: dict, source: str, started: float) -> Report:
    topo: GpuTopology | None = _facts(results, "nvidia_smi_topo")
    nvml: NvmlFacts | None = _facts(results, "nvml")
    hw: LstopoFacts | None = _facts(results, "lstopo")
    net: NicFacts | None = _facts(results, "nics")
    node = {k: identity.get(k) for k in ("hostname", "kernel", "machine", "nodecheck_version")}
    node["driver_version"] = (nvml.driver_version if nvml else None) or identity.get("kernel_module_version")
    node["cuda_driver_version"] = nvml.cuda_driver_version if nvml else None  # NVML's: 12040 is CUDA 12.4
    node["nvlink_bw_mode"] = nvml.nvlink_bw_mode if nvml else None  # FULL, OFF, MIN, HALF, 3QUARTER
    gpus = _gpus(topo, nvml, hw)
    nics = _nics(topo, net, hw)
    links = [Link(l.a, l.b, l.type, link_class(l.type)) for l in topo.links] if topo else []
    for gpu in gpus:
        gpu.nearest_nics = _nearest_nics(gpu.index, links)
    return Report(
        generated_at=started, source=source, node=node,
        probes=[ProbeOutcome(r.name, r.ok, r.no_data, round(r.duration, 4), r.error, r.timed_out) for r in results.values()],
        cpu=_cpu(hw), gpus=gpus, gpus_absent_reason=None if gpus else _why_no_gpus(results, nvml),
        nics=nics, links=links, paths=[],
        gpus_inaccessible=[InaccessibleGpu(**gpu) for gpu in nvml.unopened] if nvml else [],
        driver_gpus=identity.get("driver_gpus"),
    )


def _cpu(hw: LstopoFacts | None) -> Cpu | None:
    if hw is None:
        return None
    numa = [{"node": node, "cpus": cpus} for node, cpus in sorted(hw.numa.items())]
    return Cpu(hw.packages, hw.numa_nodes, hw.cores, hw.pus, numa, hw.cpu_model)


def _why_no_gpus(results: dict[str, ProbeResult], nvml: NvmlFacts | None) -> str:
    reasons = [f"{name}: {results[name].error}" for name in ("nvml", "nvidia_smi_topo")
               if name in results and results[name].error]
    if nvml and nvml.unopened:
        reasons.insert(0, f"NVML counts {len(nvml.unopened)} GPU(s) and could open none ({nvml.unopened[0]['error']})")
    return "; ".join(reasons) or "no NVIDIA GPU reported by NVML or nvidia-smi"


def _gpus(topo: GpuTopology | None, nvml: NvmlFacts | None, hw: LstopoFacts | None) -> list[Gpu]:
    indices = sorted({g.index for g in (nvml.gpus if nvml else [])} | {g.index for g in (topo.gpus if topo else [])})
    by_topo = {g.index: g for g in topo.gpus} if topo else {}
    by_nvml = {g.index: g for g in nvml.gpus} if nvml else {}
    hw_numa = {normal_pci(g.pci_busid): g.numa_nodes for g in hw.gpus if g.pci_busid} if hw else {}
    gpus = []
    for index in indices:
        gpu, t, n = Gpu(index), by_topo.get(index), by_nvml.get(index)
        if n:
            gpu.name, gpu.uuid, gpu.pci_bus_id, gpu.architecture = n.name, n.uuid, n.pci_bus_id, n.architecture
            gpu.pcie = {k: getattr(n, f"pcie_{k}") for k in ("gen_current", "gen_max", "gen_gpu_max", "width_current", "width_max")}
            gpu.utilization_percent, gpu.memory_bytes = n.utilization_gpu, n.memory_total_bytes
            gpu.nvlinks = [{"link": link, "active": active, "version": version}
                           | ({} if active is not None else {"error": n.errors.get("nvlink", "state unknown")})
                           | _remote(n.nvlink_remotes.get(link))
                           for link, active, version in n.nvlinks]
            gpu.ecc_enabled, gpu.remapped_rows_pending, gpu.remapped_rows_failed = n.ecc_enabled, n.remapped_rows_pending, n.remapped_rows_failed
            gpu.vbios = n.vbios
            gpu.nvlink_speed_mbps = n.nvlink_speed_mbps
            gpu.fabric = GpuFabric(**n.fabric) if n.fabric else None
            gpu.c2c = n.c2c
            signals = GpuSignals(n.pcie_replays, n.clock_event_reasons, n.ecc_uncorrected_volatile, n.nvlink_errors,
                                 n.recovery_action, **n.memory, clock_event_ns=n.clock_event_ns)
            gpu.signals = signals if signals != GpuSignals() else None  # None: NVML said nothing of them (an older dump)
            gpu.cpu_affinity = n.cpu_affinity
            gpu.gpu_numa_id = n.numa_node
            gpu.power_limit_w = n.power_limit_mw / 1000 if n.power_limit_mw is not None else None
            gpu.power_limit_default_w = n.power_limit_default_mw / 1000 if n.power_limit_default_mw is not None else None
            gpu.mig_enabled, gpu.mig_pending = n.mig_enabled, n.mig_pending
            gpu.persistent = bool(n.persistence_mode) if n.persistence_mode in (0, 1) else None
            gpu.processes = None if n.processes is None else [GpuProcess(**p) for p in n.processes]
            gpu.compute_mode = COMPUTE_MODES.get(n.compute_mode)
            gpu.ecc_pending = n.ecc_pending
            gpu.memory_used_bytes = n.memory_used_bytes
        if t:
            gpu.cpu_affinity = t.cpu_affinity or gpu.cpu_affinity  # nvidia-smi's view wins: it is what people compare with
            gpu.numa_node = t.numa_affinity[0] if len(t.numa_affinity) == 1 else None
            gpu.gpu_numa_id = t.gpu_numa_id if t.gpu_numa_id is not None else gpu.gpu_numa_id
        if nvml and nvml.p2p_read:
            gpu.p2p_read = {f"gpu{b if a == index else a}": status for (a, b), status in nvml.p2p_read.items() if index in (a, b)}
        located = hw_numa.get(normal_pci(gpu.pci_bus_id))
        if gpu.numa_node is None and located and len(located) == 1:
            gpu.numa_node = located[0]
        gpus.append(gpu)
    return gpus


def _nics(topo: GpuTopology | None, net: NicFacts | None, hw: LstopoFacts | None) -> list[Nic]:
    nics = [n for n in net.nics if n.kind != "loopback"] if net else []
    located = {d.name: d.numa_nodes for d in hw.nics} if hw else {}
    for nic in nics:  # sysfs says -1 in many VMs; hwloc still knows which node the device hangs under
        if nic.numa_node is None and len(located.get(nic.name, [])) == 1:
            nic.numa_node = located[nic.name][0]
    known = {n.name for n in nics} | {n.rdma_device for n in nics if n.rdma_device}
    for device, ports in (net.rdma_devices.items() if net else []):
        if device not in known:  # an RDMA device without a netdev (or whose netdev is elsewhere)
            nics.append(Nic(device, "infiniband", False, _port_state(ports), None, None, None,
                            net.rdma_pci.get(device), None, None, rdma_device=device, ib_ports=ports))
            known.add(device)
    for name in topo.nics if topo else []:
        if name not in known:  # seen by nvidia-smi only (a topo-only snapshot, or sysfs unreadable)
            nics.append(Nic(name, "unknown", False, None, None, None, None, None, None, None,
                            rdma_device=None if name.startswith("NIC") else name))
    legend = {name: i for i, name in enumerate(topo.nics if topo else [])}
    # nvidia-smi's legend order first (NIC0, NIC1, ...), then the rest with numbers sorted as numbers
    return sorted(nics, key=lambda n: (legend.get(n.rdma_device, legend.get(n.name, len(legend))), natural_key(n.name)))


def _port_state(ports) -> str | None:
    states = {p.state for p in ports}
    return "up" if "ACTIVE" in states else ("down" if states else None)


def _nearest_nics(gpu: int, links: list[Link]) -> list[str]:
    to_nics = [(link_distance(l.type), l.b) for l in links if l.a == gpu and isinstance(l.b, str)]
    if not to_nics:
        return []
    best = min(d for d, _ in to_nics)
    return [name for d, name in to_nics if d == best]


def _remote(said: dict | None) -> dict:
    """An active link's far end as the Report keeps it: {"remote": bus id, "remote_type": gpu|switch|npu|unknown}."""
    return {"remote": said["bus_id"], "remote_type": said.get("type")} if said else {}
