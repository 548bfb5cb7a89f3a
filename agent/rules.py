"""Static rules: facts (+ expectations from config) -> findings. Pure: no I/O.

PCIe downtraining is decided on the link WIDTH. An idle GPU drops its PCIe generation to save
power (an H100 idles at gen 1 on a gen 5 link), so a low current generation is only reported when
the GPU is busy (utilization >= BUSY_UTILIZATION); otherwise the bandwidth test confirms it.
"""

from __future__ import annotations

import dataclasses

from nodecheck.config import Config
from nodecheck.findings import Finding
from nodecheck.model import Report, link_family
from nodecheck.pci import narrow_hops, normal_pci
from nodecheck.specs import BUSY_UTILIZATION
from nodecheck.units import format_bits, format_path_rate


def evaluate(report: Report, config: Config | None) -> list[Finding]:
    config = config or Config()
    findings: list[Finding] = []
    findings += _probe_failures(report)
    findings += _gpu_count(report, config)
    for gpu in report.gpus:
        findings += _pcie(gpu, config)
        findings += _nvlinks(gpu, config)
        findings += _memory(gpu, config)
    findings += _links(report, config)
    findings += _nics(report, config)
    findings += _far_nics(report)
    findings += _platform(report)
    paths = report.hops()  # both checks walk the same PCIe paths
    findings += _pcie_hops(report, paths)
    findings += _acs_redirect(report, paths)
    return findings


def _probe_failures(report: Report) -> list[Finding]:
    """Garbled output is a warning (the tool changed, the facts are unknown); a source that hung until
    killed is an error: a hung nvidia-smi or NVML call is how a failing GPU or driver shows (NHC drains on it)."""
    return [Finding("probe_failed", "error" if r.timed_out else "warning", f"probe:{r.name}",
                    "timed out" if r.timed_out else "failed", "ok",
                    f"probe {r.name} {'timed out' if r.timed_out else 'failed'}: {r.error}")
            for r in report.probes if not r.ok and not r.no_data]


def _gpu_count(report: Report, config: Config) -> list[Finding]:
    if config.gpu_count is None or len(report.gpus) >= config.gpu_count:
        return []
    why = f" ({report.gpus_absent_reason})" if report.gpus_absent_reason else ""
    return [Finding("gpu_count_low", "error", "node", len(report.gpus), config.gpu_count,
                    f"{len(report.gpus)} GPUs visible, {config.gpu_count} expected{why}: {_missing_gpu_advice(report)}")]


def _missing_gpu_advice(report: Report) -> str:
    """No GPU at all because NVML found no driver is a software fault: reseating a GPU would not help."""
    from nodecheck.probes.nvml import NO_DRIVER

    nvml = next((r for r in report.probes if r.name == "nvml"), None)
    stack_absent = not report.gpus and nvml is not None and nvml.no_data and (nvml.error or "").startswith(NO_DRIVER)
    if stack_absent and "Permission" in nvml.error:
        return "NVML may not open the GPUs: run as a user that can read /dev/nvidia* (the driver's device permissions)"
    if stack_absent and not report.node.get("driver_version"):
        return ("the NVIDIA driver is not loaded (no kernel module, or no NVML library): `lsmod | grep nvidia`, "
                "`modprobe nvidia` and dmesg for why it did not load (often a new kernel without the module rebuilt: "
                "`dkms status`), or install the driver")
    if stack_absent:
        return (f"the NVIDIA kernel module {report.node['driver_version']} is loaded but NVML's library is missing: "
                "install the driver's user-space part of the same version (libnvidia-ml)")
    return "check `nvidia-smi -L`, dmesg for Xid/fallen-off-the-bus errors, and reseat or replace the missing GPU"


def _pcie(gpu, config: Config) -> list[Finding]:
    pcie = gpu.pcie or {}
    subject, findings = f"gpu{gpu.index}", []
    width, width_max = pcie.get("width_current"), pcie.get("width_max")
    expected_width = config.pcie_width or width_max
    if width and expected_width and width < expected_width:
        findings.append(Finding("pcie_downtrained", "error", subject, f"x{width}", f"x{expected_width}",
                                f"{subject} PCIe x{width} < x{expected_width}: reseat the GPU or its riser, check the slot"))
    gen, gen_max = pcie.get("gen_current"), pcie.get("gen_max")
    if config.pcie_gen and gen_max and gen_max < config.pcie_gen:
        findings.append(Finding("pcie_downtrained", "error", subject, f"gen{gen_max}", f"gen{config.pcie_gen}",
                                f"{subject} PCIe link can reach gen {gen_max} only, gen {config.pcie_gen} expected: "
                                "check BIOS PCIe speed settings and the riser"))
    busy = (gpu.utilization_percent or 0) >= BUSY_UTILIZATION
    if busy and gen and gen_max and gen < gen_max:
        findings.append(Finding("pcie_downtrained", "warning", subject, f"gen{gen}", f"gen{gen_max}",
                                f"{subject} PCIe gen {gen} < gen {gen_max} while {gpu.utilization_percent}% busy: "
                                "confirm with `nodecheck bench --tests h2d`"))
    return findings


def _memory(gpu, config: Config) -> list[Finding]:
    """ECC off, and row remapping (NVIDIA's A100/H100 memory error handling): pending means the GPU must be
    reset for a remapping to take effect; failed means NVIDIA's guidance is to replace the GPU."""
    subject, findings = f"gpu{gpu.index}", []
    if gpu.ecc_enabled is False and config.ecc is not False:
        findings.append(Finding("ecc_disabled", "error" if config.ecc else "warning", subject, "off", "on",
                                f"{subject} ECC is off: memory errors go undetected; `nvidia-smi -i {gpu.index} -e 1`, "
                                "then reset the GPU (or set [gpus] ecc = false if that is intended)"))
    if gpu.remapped_rows_failed:
        findings.append(Finding("row_remap_failed", "error", subject, "failed", "none",
                                f"{subject} row remapping failed: NVIDIA's guidance is to replace the GPU"))
    if gpu.remapped_rows_pending:
        findings.append(Finding("row_remap_pending", "warning", subject, "pending", "none",
                                f"{subject} has a row remapping pending: reset the GPU when idle (`nvidia-smi -r -i {gpu.index}`)"))
    return findings


def _nvlinks(gpu, config: Config) -> list[Finding]:
    subject = f"gpu{gpu.index}"
    inactive = [l["link"] for l in gpu.nvlinks if not l["active"]]
    active = len(gpu.nvlinks) - len(inactive)
    findings = []
    if inactive:
        findings.append(Finding("nvlink_inactive", "error", subject, active, len(gpu.nvlinks),
                                f"{subject} NVLink link(s) {', '.join(map(str, inactive))} inactive: "
                                "check `nvidia-smi nvlink -s`, fabric manager, and the NVSwitch tray"))
    if config.nvlinks_per_gpu and gpu.pcie is not None and active < config.nvlinks_per_gpu:
        findings.append(Finding("nvlink_count_low", "error", subject, active, config.nvlinks_per_gpu,
                                f"{subject} has {active} active NVLinks, {config.nvlinks_per_gpu} expected"))
    return findings


def _links(report: Report, config: Config) -> list[Finding]:
    seen = {tuple(sorted((l.a, l.b))): l.type for l in report.links if isinstance(l.a, int) and isinstance(l.b, int)}
    findings = []
    for (a, b), expected in sorted(config.links.items()):
        measured = seen.get((a, b))
        if measured is None or measured == expected:
            continue  # a GPU missing altogether is gpu_count_low's finding
        severity = "error" if link_family(expected) == "NV" or measured == "SYS" else "warning"
        findings.append(Finding("gpu_link_changed", severity, f"gpu{a}-gpu{b}", measured, expected,
                                f"gpu{a}-gpu{b} linked by {measured}, {expected} expected: "
                                + ("NVLink down? check `nvidia-smi nvlink -s`" if link_family(expected) == "NV"
                                   else "the GPUs sit on a different PCIe path than on the golden node")))
    return findings


def _nics(report: Report, config: Config) -> list[Finding]:
    findings = []
    specs = {p.path: p for p in report.paths}
    present = {n.name for n in report.nics} | {n.rdma_device for n in report.nics if n.rdma_device}
    for name in sorted(config.nics):
        if name not in present:
            findings.append(Finding("nic_missing", "error", name, "absent", "present",
                                    f"{name} expected but not found: check the driver (`ip link`, `ibstat`) and the card"))
    for nic in report.nics:
        expectation = config.nic_expectation(nic)
        if expectation is None:
            continue
        if expectation.state != "any" and nic.state != expectation.state:
            findings.append(Finding("nic_down", "error", nic.name, nic.state or "unknown", expectation.state,
                                    f"{nic.name} is {nic.state or 'in an unknown state'}, {expectation.state} expected: "
                                    "check the cable, the switch port and `ip link`"))
            continue
        spec = specs.get(f"nic:{nic.name}")
        if expectation.speed_mbps and spec:
            findings += _nic_speed(nic.name, spec, expectation.speed_mbps)
    return findings


def _nic_speed(name: str, spec, expected_mbps: int) -> list[Finding]:
    expected = expected_mbps * 1e6 / 8
    if spec.bytes_per_second is None:
        return [Finding("nic_speed_unknown", "warning", name, "unknown", format_bits(expected),
                        f"{name} does not report its speed, {format_bits(expected)} expected")]
    if spec.bytes_per_second < expected * 0.999:
        return [Finding("nic_slow", "error", name, format_bits(spec.bytes_per_second), format_bits(expected),
                        f"{name} negotiated {format_bits(spec.bytes_per_second)} < {format_bits(expected)}: "
                        "check the cable/transceiver and the switch port (`ethtool`, `ibstat`)")]
    return []


def _far_nics(report: Report) -> list[Finding]:
    findings = []
    for gpu in report.gpus:
        types = [l.type for l in report.links if l.a == gpu.index and isinstance(l.b, str) and l.b in gpu.nearest_nics]
        if types and all(link_family(t) in ("SYS", "SOC") for t in types):
            findings.append(Finding("nic_far_from_gpu", "warning", f"gpu{gpu.index}", "SYS", "NODE or closer",
                                    f"gpu{gpu.index}'s nearest NIC ({', '.join(gpu.nearest_nics)}) is across the socket "
                                    "interconnect: GPUDirect RDMA traffic crosses sockets"))
    return findings


FABRIC_KINDS = ("infiniband", "ethernet")


def _what_to_check(m) -> str:
    """Advice for the kind of path that was slow: a GPU's host link is not a network cable, a PCIe box has
    no NVLink to check."""
    kind = m.details.get("path_kind")
    if m.scope == "host-link":
        return ("check the GPU's PCIe link (`nvidia-smi -q -d PCI`: generation and width now vs max), that nothing else "
                "was copying over it, and the host memory's NUMA node")
    if m.scope == "cluster" or kind in FABRIC_KINDS:
        return "check that node's cable, switch port and NIC speed"
    if kind == "nvlink-no-peer":
        return ("the GPUs are linked by NVLink but have no peer access, so the copies went through host memory: check "
                "the fabric manager on NVSwitch systems (`systemctl status nvidia-fabricmanager`), `nvidia-smi topo -p2p r`, "
                "NCCL_P2P_DISABLE, and that both GPUs are passed to this VM or container")
    if kind == "nvlink":
        return "check the GPUs' NVLink state (`nvidia-smi nvlink -s`) and that no other job was using them"
    return ("check the GPUs' PCIe links (`nvidia-smi -q -d PCI`: generation and width now vs max), ACS and the IOMMU on "
            "their path (`nodecheck inspect`), and that no other job was using them")


def algorithm_bound(m) -> float | None:
    """For an all-reduce across nodes judged against the ring bound of its rails: the most any algorithm can
    reach, as a ratio to that bound. A ring sends 2(n-1)/n x S of each node's data over its rails, a tree
    or SHARP about S, so busbw (algbw x 2(n-1)/n) can reach 2(n-1)/n x the ring bound and no more.
    None for other measurements."""
    if m.test != "allreduce" or m.scope != "cluster" or not m.ranks or m.ranks < 2 or m.details.get("path_kind") not in FABRIC_KINDS:
        return None
    return 2 * (m.ranks - 1) / m.ranks


def with_measurements(report: Report, measurements: list, measured_at: float, config: Config | None) -> Report:
    """The Report with these measurements attached and judged: the one way `bench` and `serve` add them."""
    config = config or Config()
    measurements = [with_threshold(m, config) for m in measurements]
    return dataclasses.replace(report, measurements=measurements, measured_at=measured_at,
                               findings=report.findings + measurement_findings(measurements, config)
                               + _what_nccl_did(report, measurements))


def with_threshold(m, config: Config):
    """The measurement with the threshold it is judged by, and where that comes from, in its details
    (details["threshold"], ["threshold_basis"]): the exporter publishes it for the alert to compare with.
    None where no figure is judged (a failed test, an unknown spec)."""
    if not m.ok or m.ratio is None:
        return m
    ratio, basis = config.threshold(m.test, m.details.get("path_kind"), m.direction)
    return dataclasses.replace(m, details=dict(m.details, threshold=ratio, threshold_basis=basis))


def _what_nccl_did(report: Report, measurements: list) -> list[Finding]:
    """The findings of what NCCL logged during the measurements (details["nccl"]), each named once."""
    from nodecheck.nccl_run import nccl_findings, nccl_run_from_details

    findings, seen = [], set()
    for m in measurements:
        run = nccl_run_from_details((m.details or {}).get("nccl") if isinstance(m.details, dict) else None)
        for finding in nccl_findings(run, report) if run else []:
            if (finding.kind, finding.subject, finding.message) not in seen:
                seen.add((finding.kind, finding.subject, finding.message))
                findings.append(finding)
    return findings


def _pcie_hops(report: Report, paths: dict) -> list[Finding]:
    """A link on a GPU's or NIC's PCIe path (a switch port, a riser, the root port) trained narrower than
    both its ends allow, named once per link with every device behind it. A GPU's own link is NVML's to
    judge (pcie_downtrained)."""

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


def _acs_redirect(report: Report, paths: dict) -> list[Finding]:
    """For every GPU pair and GPU-RDMA NIC pair under a common switch, the bridges between them (the ports
    below the switch's upstream port where each one's traffic enters it): one with ACS P2P request or
    completion redirect on sends their peer traffic up to the root complex. Named once per bridge."""
    redirect = report.acs_redirects() or {}
    if not any(redirect.values()):
        return []
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


def _platform(report: Report) -> list[Finding]:
    """GPUDirect RDMA without its peer-memory module, and IOMMU translation on a GPU's or an RDMA NIC's
    group (NCCL's troubleshooting guide: both slow or break inter-node and peer-to-peer traffic)."""
    from nodecheck.probes.platform import TRANSLATED

    facts = report.platform
    findings = []
    rdma = report.rdma_nics_up()
    if report.gpus and rdma and facts and facts.modules_known and not facts.peer_memory and facts.dma_buf is not True:
        why = "and the driver's proprietary kernel modules" if facts.open_kernel_modules is False else \
            f"and kernel {facts.kernel} is older than 5.12" if facts.dma_buf is False else \
            "and DMA-BUF support is unknown"
        findings.append(Finding("gpudirect_rdma_unavailable", "warning", "node", "not loaded", "nvidia_peermem",
                                f"GPUDirect RDMA: neither nvidia_peermem nor nv_peer_mem is loaded, {why} cannot give NICs "
                                "DMA-BUF access to GPU memory: inter-node data bounces through host memory; "
                                "`modprobe nvidia_peermem`, or the open kernel modules on Linux >= 5.12"))
    groups = report.iommu_modes()
    devices = [(f"gpu{g.index}", g.pci_bus_id) for g in report.gpus] + [(n.name, n.pci_address) for n in rdma]
    for subject, pci in devices:
        kind = groups.get(normal_pci(pci))
        if kind in TRANSLATED:
            cmdline = " ".join(facts.iommu_cmdline if facts else []) or "no iommu parameter"
            findings.append(Finding("iommu_translated", "warning", subject, kind, "identity",
                                    f"{subject}'s IOMMU group translates its DMA ({kind}; kernel command line: {cmdline}): "
                                    "peer-to-peer and RDMA traffic pays for it; boot with iommu=pt (or the group in "
                                    "identity mode)"))
    return findings


def measurement_findings(measurements, config: Config) -> list[Finding]:
    """Bandwidth below the test's ratio x spec, and tests that failed, each naming its path (and the slow node)."""
    findings = []
    for m in measurements:
        threshold = config.ratio_for(m.test, m.details.get("path_kind"), m.direction)
        if not m.ok:
            findings.append(Finding("bench_failed", "error", m.path, "failed", "completed", f"{m.test} on {m.path}: {m.error}"))
            continue
        check = m.details.get("data_check") if isinstance(m.details, dict) else None
        wrong = check.get("wrong_elements") if isinstance(check, dict) else None
        if isinstance(wrong, int) and wrong > 0:
            findings.append(Finding("bench_wrong_result", "error", m.path, f"{wrong} wrong", "0 wrong",
                                    f"{m.test} on {m.path} returned wrong data: {wrong} of {check.get('elements')} elements arrived "
                                    f"wrong (expected: {check.get('expected')}): a link or GPU corrupts data at whatever speed; "
                                    "check Xid and ECC errors (`nodecheck inspect`), and run nccl-tests with -c 1 or nvbandwidth"))
        if m.ratio is not None and (algorithm_bound(m) or float("inf")) < m.ratio:
            bound = algorithm_bound(m)
            findings.append(Finding(
                "bandwidth_above_bound", "warning", m.path, f"{m.ratio:.2f}", f"<= {bound:.2f}",
                f"{m.path} {m.test} {format_path_rate(m.scope, m.bytes_per_second)} = {m.ratio:.2f} x the ring bound of the rails nodecheck "
                f"read, more than any all-reduce algorithm moves over them ({bound:.2f} x): NCCL used other or more NICs, "
                "or a rail's rate was misread (set [nics] speed_mbps); this verdict cannot be trusted"))
        elif m.ratio is not None and m.ratio < threshold:
            suspects = _slow_nodes(m, threshold)
            where = "; slow: " + ", ".join(f"{name} at {ratio:.2f} of spec" + (f" (rail {rails})" if rails else "")
                                           for name, ratio, rails in suspects) if suspects else ""
            findings.append(Finding(
                "bandwidth_below_spec", "error", suspects[0][0] if suspects else m.path, f"{m.ratio:.2f}", f">= {threshold:g}",
                f"{m.path} {m.test} {format_path_rate(m.scope, m.bytes_per_second)} = {m.ratio:.2f} of spec "
                f"{format_path_rate(m.scope, m.spec_bytes_per_second)}{where}: {_what_to_check(m)}"))
    return findings


def _slow_nodes(m, threshold: float) -> list[tuple[str, float, str]]:
    """From the pair exchanges (nodecheck.pairing): the nodes with a rank whose every exchange was slow
    against that exchange's own rails, each with its best ratio and the rails of its slow ranks; with only
    two nodes, both ends of the slow pairs."""
    from nodecheck.pairing import node_groups, rank_ratio, slow_ranks

    members = [n for n in m.details.get("nodes", []) if isinstance(n, dict) and isinstance(n.get("rank"), int)]
    by_rank = {n["rank"]: n for n in members}
    exchanges = m.details.get("pair_exchanges") or []
    if not exchanges or not m.spec_bytes_per_second:
        return []
    nodes = len(node_groups(members)) if members else 1 + max(max(e["a"], e["b"]) for e in exchanges)
    slow, undecided = slow_ranks(exchanges, nodes, threshold, m.spec_bytes_per_second)
    suspects = slow or sorted({rank for pair in undecided for rank in pair})
    named: dict[str, tuple[float, set]] = {}
    for rank in suspects:
        member = by_rank.get(rank, {})
        name = f"{member.get('node', f'rank{rank}')} ({member.get('address') or 'rank ' + str(rank)})"
        ratio = rank_ratio(exchanges, rank, m.spec_bytes_per_second) or 0.0
        rails = {r.get("name") for r in member.get("rails") or [] if isinstance(r, dict) and r.get("name")}
        best, seen = named.get(name, (ratio, set()))
        named[name] = (min(best, ratio), seen | rails)
    return sorted(((name, ratio, ",".join(sorted(rails))) for name, (ratio, rails) in named.items()), key=lambda s: s[1])
