"""Static rules: facts (+ expectations from config) -> findings. Pure: no I/O.

PCIe downtraining is decided on the link WIDTH. An idle GPU drops its PCIe generation to save
power (an H100 idles at gen 1 on a gen 5 link), so a low current generation is only reported when
the GPU is busy (utilization >= BUSY_UTILIZATION); otherwise the bandwidth test confirms it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from nodecheck.assemble.fingerprint import vbios_mismatch
from nodecheck.checks.compute_mode import compute_mode_findings
from nodecheck.checks.error_counters import aer_findings, ib_findings, netdev_findings
from nodecheck.checks.fabric import bw_mode_findings, fabric_findings
from nodecheck.checks.gpu_errors import gpu_findings
from nodecheck.checks.gpu_presence import gpu_count, inaccessible_gpus, persistence_off
from nodecheck.checks.imex import imex_findings
from nodecheck.checks.nccl_conf import nccl_conf_findings
from nodecheck.checks.nic_events import nic_events
from nodecheck.checks.nvlink import nvlink_findings, usual_nvlinks, wired_nvlinks
from nodecheck.checks.pcie import narrow_links, slow_nic_links
from nodecheck.checks.rail import rail_mtus, rail_rates, rails_down
from nodecheck.checks.roce import roce_gid_findings
from nodecheck.checks.signals import gpu_xids, switch_xids
from nodecheck.config import Config
from nodecheck.core.link_types import link_family
from nodecheck.core.pci import normal_pci
from nodecheck.core.specs import BUSY_UTILIZATION
from nodecheck.core.units import format_bits
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


@dataclass(frozen=True)
class Rule:
    """One static check: a function of the Report and the Config, the finding kinds it may raise, and the
    probe whose facts it reads (its kinds are unknown, not healthy, when that probe failed or was switched
    off: src/nodecheck/checks/coverage.py)."""

    check: Callable[[Report, Config], list[Finding]]
    kinds: tuple[str, ...]
    needs: str | None = None


def evaluate(report: Report, config: Config | None) -> list[Finding]:
    config = config or Config()
    return [finding for rule in RULES for finding in rule.check(report, config)]


def _probe_failures(report: Report, config: Config) -> list[Finding]:
    """Garbled output is a warning (the tool changed, the facts are unknown); a source that hung until
    killed is an error: a hung nvidia-smi or NVML call is how a failing GPU or driver shows (NHC drains on it)."""
    return [Finding("probe_failed", "error" if r.timed_out else "warning", f"probe:{r.name}",
                    "timed out" if r.timed_out else "failed", "ok",
                    f"probe {r.name} {'timed out' if r.timed_out else 'failed'}: {r.error}")
            for r in report.probes if not r.ok and not r.no_data]


def _each_gpu(report: Report, config: Config) -> list[Finding]:
    """The checks of one GPU's own facts (NVML), GPU by GPU."""
    modes = [g.mig_enabled for g in report.gpus]
    mig = partial(_mig, most_whole=modes.count(False) > modes.count(True))
    nvlinks = partial(nvlink_findings, usual=usual_nvlinks(report), wired=wired_nvlinks(report, config))
    return [f for gpu in report.gpus for check in (_pcie, mig, nvlinks, _c2c, _memory, _power_limit) for f in check(gpu, config)]


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
    if busy and gen and gen_max and gen < gen_max and not gpu.c2c:  # over NVLink-C2C the PCIe link carries no host copy
        findings.append(Finding("pcie_downtrained", "warning", subject, f"gen{gen}", f"gen{gen_max}",
                                f"{subject} PCIe gen {gen} < gen {gen_max} while {gpu.utilization_percent}% busy: "
                                "confirm with `nodecheck bench --tests h2d`"))
    return findings


def _memory(gpu, config: Config) -> list[Finding]:
    """ECC off, and row remapping (NVIDIA's A100/H100 memory error handling): pending means the GPU must be
    reset for a remapping to take effect; failed means NVIDIA's guidance is to replace the GPU."""
    subject, findings = f"gpu{gpu.index}", []
    if gpu.ecc_enabled is False and config.ecc is not False:
        set_on = "ECC is set to on and waits for the GPU's reset" if gpu.ecc_pending else f"`nvidia-smi -i {gpu.index} -e 1`"
        findings.append(Finding("ecc_disabled", "error" if config.ecc else "warning", subject, "off", "on",
                                f"{subject} ECC is off: memory errors go undetected; {set_on}, "
                                "then reset the GPU (or set [gpus] ecc = false if that is intended)"))
    elif gpu.ecc_enabled and gpu.ecc_pending is False and config.ecc is not False:  # `nvidia-smi -e 0` awaiting a reset
        findings.append(Finding("ecc_disabled", "warning", subject, "off at the next reset", "on",
                                f"{subject} ECC is on now and set to off at the GPU's next reset or reboot, after which "
                                f"memory errors go undetected: `nvidia-smi -i {gpu.index} -e 1` keeps it on"))
    if gpu.remapped_rows_failed:
        findings.append(Finding("row_remap_failed", "error", subject, "failed", "none",
                                f"{subject} row remapping failed: NVIDIA's guidance is to replace the GPU"))
    if gpu.remapped_rows_pending:
        findings.append(Finding("row_remap_pending", "warning", subject, "pending", "none",
                                f"{subject} has a row remapping pending: reset the GPU when idle (`nvidia-smi -r -i {gpu.index}`)"))
    return findings


def _power_limit(gpu, config: Config) -> list[Finding]:
    """A power limit below the board's default (`nvidia-smi -pl`): said (info), since a busy GPU then runs on its
    power cap and the cap is no finding of its own; on purpose it may be, so it never fails a node."""
    limit, default = gpu.power_limit_w, gpu.power_limit_default_w
    if limit is None or not default or limit >= default:
        return []
    subject = f"gpu{gpu.index}"
    return [Finding("gpu_power_limit_lowered", "info", subject, f"{limit:g} W", f"{default:g} W",
                    f"{subject} power limit {limit:g} W, below its default {default:g} W: busy, it runs on its power cap; "
                    f"`nvidia-smi -i {gpu.index} -pl {default:g}` restores it, if it was not lowered on purpose")]


def _mig(gpu, config: Config, most_whole: bool = False) -> list[Finding]:
    """MIG mode: the driver enables no NVLink under it and CUDA has no peer-to-peer, so the GPU's NVLink checks
    and in-node bandwidth tests are skipped (they would read as a broken fabric). Said as info; a warning where most
    of the node's GPUs are not in MIG mode (`most_whole`: one GPU partitioned by mistake leaves a job of the whole
    node with slices and no NVLink); an error where `[gpus] mig` expects the other mode; a change waiting for the
    GPU's reset is a warning."""
    subject, findings, on = f"gpu{gpu.index}", [], gpu.mig_enabled
    if on is None:
        return []
    mode = "on" if on else "off"
    if config.mig is not None and on != config.mig:
        expected = "on" if config.mig else "off"
        findings.append(Finding("gpu_mig_mode", "error", subject, mode, expected,
                                f"{subject} MIG mode is {mode}, [gpus] mig expects {expected}: "
                                f"`nvidia-smi -i {gpu.index} -mig {int(config.mig)}`, then reset the GPU"))
    elif on and most_whole:
        findings.append(Finding("gpu_mig_mode", "warning", subject, "on", "off, as most of its siblings",
                                f"{subject} is in MIG mode, most of its siblings are not: a job of the whole node "
                                f"gets its slices and no NVLink to it; `nvidia-smi -i {gpu.index} -mig 0` and reset the GPU "
                                "if it was not partitioned on purpose (set [gpus] mig to require a mode)"))
    elif on:
        findings.append(Finding("gpu_mig_mode", "info", subject, "on", "-",
                                f"{subject} is in MIG mode: NVLink and GPU peer-to-peer are off by design, so its NVLink "
                                "checks and in-node bandwidth tests are skipped (set [gpus] mig to require a mode)"))
    if gpu.mig_pending is not None and gpu.mig_pending != on:
        pending = "on" if gpu.mig_pending else "off"
        findings.append(Finding("gpu_mig_mode", "warning", subject, f"{mode}, {pending} pending", pending,
                                f"{subject} MIG mode is {mode} until the GPU is reset, then {pending}: "
                                f"`nvidia-smi -r -i {gpu.index}` when idle"))
    return findings


def _c2c(gpu, config: Config) -> list[Finding]:
    """An NVLink-C2C link NVML says is not active: the GPU reaches its Grace CPU's memory over the others only
    (Azure's GB200 health checks fail a node on it: `nvidia-smi c2c -s` naming a link without its speed)."""
    down = (gpu.c2c or {}).get("inactive") or []
    if not down:
        return []
    subject, active = f"gpu{gpu.index}", gpu.c2c.get("links") or 0
    return [Finding("c2c_link_down", "error", subject, active, active + len(down),
                    f"{subject} NVLink-C2C link(s) {', '.join(map(str, down))} inactive: host copies run over {active} of "
                    f"{active + len(down)} links; check `nvidia-smi c2c -s -i {gpu.index}` and the kernel log for an Xid")]


def _links(report: Report, config: Config) -> list[Finding]:
    seen = {tuple(sorted((l.a, l.b))): l.type for l in report.links if isinstance(l.a, int) and isinstance(l.b, int)}
    in_mig = {g.index for g in report.gpus if g.mig_enabled}
    findings = []
    for (a, b), expected in sorted(config.links.items()):
        measured = seen.get((a, b))
        if measured is None or measured == expected:
            continue  # a GPU missing altogether is gpu_count_low's finding
        if link_family(expected) == "NV" and in_mig & {a, b}:
            continue  # no NVLink under MIG: _mig says so
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
    expected, negotiated = expected_mbps * 1e6 / 8, spec.link_bytes_per_second
    if negotiated is None:
        return [Finding("nic_speed_unknown", "warning", name, "unknown", format_bits(expected),
                        f"{name} does not report its speed, {format_bits(expected)} expected")]
    if negotiated < expected * 0.999:
        return [Finding("nic_slow", "error", name, format_bits(negotiated), format_bits(expected),
                        f"{name} negotiated {format_bits(negotiated)} < {format_bits(expected)}: "
                        "check the cable/transceiver and the switch port (`ethtool`, `ibstat`)")]
    return []


def _far_nics(report: Report, config: Config) -> list[Finding]:
    findings = []
    for gpu in report.gpus:
        types = [l.type for l in report.links if l.a == gpu.index and isinstance(l.b, str) and l.b in gpu.nearest_nics]
        if types and all(link_family(t) in ("SYS", "SOC") for t in types):
            findings.append(Finding("nic_far_from_gpu", "warning", f"gpu{gpu.index}", "SYS", "NODE or closer",
                                    f"gpu{gpu.index}'s nearest NIC ({', '.join(gpu.nearest_nics)}) is across the socket "
                                    "interconnect: GPUDirect RDMA traffic crosses sockets"))
    return findings


def _acs_redirect(report: Report, config: Config) -> list[Finding]:
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


def _platform(report: Report, config: Config) -> list[Finding]:
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


RULES = [
    Rule(_probe_failures, ("probe_failed",)),
    Rule(gpu_count, ("gpu_count_low",)),
    Rule(inaccessible_gpus, ("gpu_inaccessible",), needs="nvml"),
    Rule(_each_gpu, ("pcie_downtrained", "nvlink_inactive", "nvlink_count_low", "c2c_link_down", "ecc_disabled", "row_remap_failed",
                     "row_remap_pending", "gpu_power_limit_lowered", "gpu_mig_mode"), needs="nvml"),
    Rule(_links, ("gpu_link_changed",), needs="nvidia_smi_topo"),
    Rule(_nics, ("nic_missing", "nic_down", "nic_slow", "nic_speed_unknown"), needs="nics"),
    Rule(_far_nics, ("nic_far_from_gpu",), needs="nvidia_smi_topo"),
    Rule(rail_mtus, ("nic_mtu_mismatch",), needs="nics"),
    Rule(rail_rates, ("nic_rate_mismatch",), needs="nics"),
    Rule(rails_down, ("nic_rail_down",), needs="nics"),
    Rule(_platform, ("gpudirect_rdma_unavailable", "iommu_translated")),
    Rule(narrow_links, ("pcie_hop_narrow",), needs="pcie_paths"),
    Rule(slow_nic_links, ("pcie_hop_slow",), needs="pcie_paths"),
    Rule(_acs_redirect, ("pcie_acs_redirect",)),
    Rule(gpu_xids, ("gpu_xid",), needs="kernel_log"),
    Rule(switch_xids, ("nvswitch_sxid",), needs="kernel_log"),
    Rule(nic_events, ("nic_module_error", "nic_slot_power"), needs="kernel_log"),
    Rule(aer_findings, ("pcie_aer_fatal", "pcie_link_errors"), needs="pcie_paths"),
    Rule(ib_findings, ("ib_link_downed", "ib_port_errors", "ib_counter_saturated", "rdma_retransmits"), needs="nics"),
    Rule(netdev_findings, ("nic_link_errors",), needs="nics"),
    Rule(nccl_conf_findings, ("nccl_config",), needs="platform"),
    Rule(roce_gid_findings, ("roce_gid_unroutable",), needs="nics"),
    Rule(gpu_findings, ("pcie_replays", "nvlink_errors", "ecc_uncorrected", "gpu_clock_slowdown", "gpu_recovery_action",
                        "sram_threshold_exceeded", "retired_pages_limit", "retired_pages_pending", "inforom_corrupted"),
         needs="nvml"),
    Rule(vbios_mismatch, ("gpu_vbios_mismatch",), needs="nvml"),
    Rule(persistence_off, ("gpu_persistence_off",), needs="nvml"),
    Rule(compute_mode_findings, ("gpu_compute_mode",), needs="nvml"),
    Rule(fabric_findings, ("gpu_fabric_not_ready", "gpu_fabric_unhealthy"), needs="nvml"),
    Rule(bw_mode_findings, ("nvlink_bw_reduced",), needs="nvml"),
    Rule(imex_findings, ("imex_unhealthy",), needs="imex"),
]
