"""host -> probes -> facts -> merged Report (GPUs, NICs, links, path specs); rules add findings."""

from __future__ import annotations

import dataclasses
import re
import time

from nodecheck import specs
from nodecheck.errors import NodecheckError
from nodecheck.limits import MAX_GPUS
from nodecheck.link_types import link_class, link_distance, nvlink_count
from nodecheck.log_memory import to_remember, with_memory
from nodecheck.model import (
    Cpu,
    Gpu,
    GpuFabric,
    GpuProcess,
    GpuSignals,
    InaccessibleGpu,
    Link,
    Nic,
    PathSpec,
    ProbeOutcome,
    Report,
)
from nodecheck.pci import SYSFS_ADDRESS, Hop, normal_pci
from nodecheck.probes import PROBES, ProbeResult, run_probes
from nodecheck.probes.lstopo import LstopoFacts
from nodecheck.probes.nics import NicFacts
from nodecheck.probes.nvml import COMPUTE_MODES, NvmlFacts
from nodecheck.probes.topo import GpuTopology
from nodecheck.units import natural_key


def build_report(host, config=None, probe_timeout: float | None = None, judge: bool = True) -> Report:
    """probe_timeout caps each probe's own deadline (the prolog's budget). judge=False: the facts and path
    specs only, no findings or advice (what `bench --measure-only` needs to plan its tests)."""
    from nodecheck.advice import binding_advice
    from nodecheck.rules import evaluate

    started = time.time()
    results = run_probes(host, timeout=probe_timeout, disabled=config.disabled_probes if config else ())
    report = merge(results, _identity(host), host.label, started)
    for probe in PROBES:  # the sources that fill their own part of the Report
        result = results.get(probe.name)
        if probe.fill is not None and result is not None and result.ok:
            probe.fill(report, result.facts)
    report.kernel_log = with_memory(report.kernel_log, report.history)
    report.paths = path_specs(report, config)
    if not judge:
        return report
    _remember(host, report, config)
    mark_wired_nvlinks(report, config)
    report.findings = evaluate(report, config)
    report.advice = binding_advice(report)
    return report


def judged_again(report: Report, config) -> Report:
    """A saved Report's facts judged by `config` (`config check --from REPORT`): its path specs (a NIC's expected
    speed is the config's), findings and advice made anew, as build_report makes them from the probes' facts.
    Its measurements are kept as they were: config_check.as_the_prolog_judges judges them by the config."""
    from nodecheck.advice import binding_advice
    from nodecheck.rules import evaluate

    report = dataclasses.replace(report, paths=[])
    report.paths = path_specs(report, config)
    mark_wired_nvlinks(report, config)
    report.findings = evaluate(report, config)
    report.advice = binding_advice(report)
    return report


def mark_wired_nvlinks(report: Report, config) -> None:
    """Each GPU's NVLinks that should be up, for the exporter's NodecheckNvlinkDown and the GPU table."""
    from nodecheck.config import Config
    from nodecheck.nvlink_rules import wired_nvlinks

    wired = wired_nvlinks(report, config or Config())
    for gpu in report.gpus:
        gpu.nvlinks_wired = wired[gpu.index][0] if gpu.index in wired else None


def _remember(host, report: Report, config) -> None:
    """This run's error counters (for the next run's rates) and the kernel log's events (for the runs after the
    ring buffer overwrote them) into nodecheck's state; both were read before it (history)."""
    from nodecheck.config import Config
    from nodecheck.error_rules import counter_sample
    from nodecheck.events import CounterSample

    history = report.history
    if history is None:
        return
    counters = counter_sample(report) if history.uptime_s is not None else None
    sample = CounterSample(history.uptime_s, counters) if counters else None
    log = to_remember(report.kernel_log)
    if sample or log:
        host.remember(sample, (config or Config()).errors.limit("min_rate_interval_s")[0], log)


_DRIVER = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)")


def _identity(host) -> dict:
    try:
        identity = dict(host.identity())
    except NodecheckError as error:  # identity is decoration: never lose the report over it
        identity = {"error": str(error)}
    # The loaded kernel module's version, readable even when NVML's library is missing.
    driver = _DRIVER.search(host.read_text("/proc/driver/nvidia/version") or "")
    identity["kernel_module_version"] = driver[1] if driver else None
    # The GPUs the loaded module manages, whether or not NVML can start: a container sees only those its runtime
    # passed (the NVIDIA toolkit mounts their entries alone); None where the module is not loaded
    managed = [name for name in host.list_dir("/proc/driver/nvidia/gpus") if SYSFS_ADDRESS.fullmatch(name)][:MAX_GPUS]
    identity["driver_gpus"] = managed or None
    return identity


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
