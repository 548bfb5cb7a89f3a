"""Which checks a Report could not make, and why: a check whose input is missing (a probe that failed or
was switched off, ACS unreadable without root, no bandwidth test run, no NCCL log) is unknown, never
healthy. Pure: reads the Report only. The exporter leaves such a check out of nodecheck_check_healthy and
names it in nodecheck_check_unknown."""

from __future__ import annotations

from nodecheck.assemble.roce_gid import active_roce_ports
from nodecheck.checks.error_counters import unknown_rates
from nodecheck.checks.rules import RULES
from nodecheck.config import Config
from nodecheck.probes import DISABLED
from nodecheck.report.findings import FINDING_KINDS
from nodecheck.report.model import Report

MEASURED = ("bandwidth_below_spec", "bandwidth_above_bound", "bench_failed", "bench_wrong_result")
FROM_NCCL = ("nccl_socket_fallback", "nccl_no_gdr", "nccl_p2p_disabled", "nccl_rail_mismatch", "nccl_warning", "nccl_setting")
# judged on the change since a previous sample, by the counters' family
RATE_KINDS = {"aer/": ("pcie_link_errors",), "ib/": ("ib_link_downed", "ib_port_errors", "rdma_retransmits"), "gpu/": ("pcie_replays", "nvlink_errors"),
              "net/": ("nic_link_errors",)}
FABRIC_KINDS = ("gpu_fabric_not_ready", "gpu_fabric_unhealthy")
PROLOG_ONLY = ("check_timed_out", "check_failed", "peer_unreachable", "peer_outside_subnet", "peer_slow", "gpu_in_use",
               "gpu_process_gone", "gpu_memory_held")


def unmade_checks(report: Report) -> dict[str, str]:
    """Finding kind -> why the Report cannot say whether it holds (absent: the check was made)."""
    unmade = {kind: "made by `nodecheck prolog`/`healthcheck` only" for kind in PROLOG_ONLY}
    outcomes = {p.name: p for p in report.probes}
    for rule in RULES:  # a fact-based check is unknown when the probe it reads failed or was switched off
        outcome = outcomes.get(rule.needs) if rule.needs else None
        if outcome is not None and not outcome.ok and (not outcome.no_data or outcome.error == DISABLED):
            unmade.update({kind: f"probe {rule.needs}: {outcome.error or 'failed'}" for kind in rule.kinds})
    if report.gpus and all(g.mig_enabled for g in report.gpus):
        for kind in ("nvlink_inactive", "nvlink_count_low"):
            unmade.setdefault(kind, "every GPU is in MIG mode: the driver enables no NVLink under MIG")
    if report.acs_redirects() is None:
        unmade["pcie_acs_redirect"] = (report.pcie_acs and report.pcie_acs.why) or "ACS not read"
    platform = report.platform
    if platform is None:
        unmade["iommu_translated"] = unmade["gpudirect_rdma_unavailable"] = "platform probe: no data"
    elif not platform.modules_known:
        unmade["gpudirect_rdma_unavailable"] = "kernel modules unknown"
    log = report.kernel_log
    if log is None or not log.known:
        why = log.why if log is not None else "kernel log not read"
        for kind in ("gpu_xid", "nvswitch_sxid", "nic_module_error", "nic_slot_power"):
            unmade.setdefault(kind, why)
    for kind, why in _unsaid_gpu_signals(report).items():
        unmade.setdefault(kind, why)
    for kind, attribute, what in (("gpu_persistence_off", "persistent", "persistence mode"),
                                  ("gpu_compute_mode", "compute_mode", "compute mode")):
        unsaid = next((g for g in report.gpus if getattr(g, attribute) is None), None)
        if unsaid is not None:
            unmade.setdefault(kind, f"gpu{unsaid.index}: NVML did not report its {what}")
    if report.pcie_paths and not any(hop.aer for hops in report.pcie_paths.values() for hop in hops):
        for kind in ("pcie_aer_fatal", "pcie_link_errors"):  # a VM's virtual bridges, or AER off (pci=noaer)
            unmade.setdefault(kind, "no device on the GPUs' and NICs' PCIe paths has AER counters (aer_dev_*) to read")
    roce = next((f"{p.device}/{p.port}: its GID table was not read (a snapshot from before nodecheck read it?)"
                 for p in active_roce_ports(report) if p.gids is None), None)
    if roce:  # a RoCE rail whose GIDs are unknown: NCCL's choice there is unknown, not routable
        unmade.setdefault("roce_gid_unroutable", roce)
    unread = _unread_ib_ports(report)
    if unread:  # one active port's counters unreadable while the others read: that port is unknown, not healthy
        for kind in ("ib_link_downed", "ib_port_errors"):
            unmade.setdefault(kind, unread)
    if report.imex is None and report.in_nvlink_domain():
        outcome = outcomes.get("imex")
        unmade.setdefault("imex_unhealthy", (outcome.error if outcome and outcome.error else "IMEX not read")
                          + " (this node is in a multi-node NVLink domain)")
    fabric_unknown = _fabric_unknown(report)
    if fabric_unknown:
        for kind in FABRIC_KINDS:
            unmade.setdefault(kind, fabric_unknown)
    for prefix, why in unknown_rates(report, Config(), RATE_KINDS).items():
        for kind in RATE_KINDS[prefix]:
            unmade.setdefault(kind, why)
    if not report.measurements:
        unmade.update({kind: "no bandwidth test has run" for kind in MEASURED})
    if not any(isinstance(m.details, dict) and m.details.get("nccl") for m in report.measurements):
        unmade.update({kind: "no NCCL run recorded what it chose" for kind in FROM_NCCL})
    raised = {f.kind for f in report.findings}
    return {kind: why for kind, why in unmade.items() if kind in FINDING_KINDS and kind not in raised}


# a GPU's NVML signal -> the finding kind judged from it, and what NVML was asked
GPU_SIGNALS = {"pcie_replays": ("pcie_replays", "its PCIe replay counter"),
               "clock_event_reasons": ("gpu_clock_slowdown", "its clock event reasons"),
               "ecc_uncorrected_volatile": ("ecc_uncorrected", "its uncorrectable ECC count"),
               "recovery_action": ("gpu_recovery_action", "its recovery action (a driver without the field?)"),
               "nvlink_errors": ("nvlink_errors", "the error counters of its active NVLinks"),
               "sram_threshold_exceeded": ("sram_threshold_exceeded", "its SRAM error status (it needs root)"),
               "retired_pages": ("retired_pages_limit", "its retired pages"),
               "retired_pages_pending": ("retired_pages_pending", "whether a page retirement is pending"),
               "inforom_valid": ("inforom_corrupted", "whether its InfoROM is valid")}
AMPERE = 7  # NVML_DEVICE_ARCH_AMPERE: the SRAM error status from here on; page retirement before it (rows remap)


def _unsaid_gpu_signals(report: Report) -> dict[str, str]:
    """Finding kind -> why, where NVML did not report a GPU's signal: one GPU's refusal must not read as healthy
    because the other GPUs answered (an HGX node whose 144 active NVLinks have no readable error counter passed
    the NVLink error check). NVLink counters are asked only of a GPU with an active NVLink outside MIG mode."""
    unsaid: dict[str, str] = {}
    for gpu in report.gpus:
        for name, (kind, what) in GPU_SIGNALS.items():
            if name == "nvlink_errors" and (gpu.mig_enabled or not any(link["active"] for link in gpu.nvlinks)):
                continue
            if not _asked_of(name, gpu.architecture):
                continue
            if gpu.signals is None or getattr(gpu.signals, name) is None:
                unsaid.setdefault(kind, f"gpu{gpu.index}: NVML did not report {what}")
    return unsaid


def _asked_of(signal: str, architecture: int | None) -> bool:
    """Whether a GPU of this NVML architecture has the signal: the SRAM status from Ampere on, retired pages before
    it; neither is expected of a GPU whose architecture NVML did not say."""
    if signal == "sram_threshold_exceeded":
        return architecture is not None and architecture >= AMPERE
    if signal.startswith("retired_pages"):
        return architecture is not None and architecture < AMPERE
    return True


def _unread_ib_ports(report: Report) -> str | None:
    """Why an active RDMA port's error counters are unknown: none of them read as a count ("N/A (no PMA)": the port
    has no Performance Management Agent, or the files are missing); None where every active port's read."""
    for nic in report.nics:
        for port in nic.ib_ports:
            if port.state == "ACTIVE" and not any(value is not None for value in port.counters.values()):
                return f"{port.device}/{port.port}: its error counters are unreadable (no count in counters/ or hw_counters/)"
    return None


def _fabric_unknown(report: Report) -> str | None:
    """Why the NVLink fabric registration is unknown: a GPU with NVLinks whose fabric state NVML refused, or that
    this driver cannot be asked for (before nvmlDeviceGetGpuFabricInfo); None where every GPU said."""
    for gpu in report.gpus:
        if gpu.nvlinks and gpu.fabric is None:
            return f"gpu{gpu.index}: this driver or nvidia-ml-py has no nvmlDeviceGetGpuFabricInfo"
        if gpu.fabric is not None and gpu.fabric.state == "unreadable":
            return f"gpu{gpu.index}: NVML did not say its fabric state ({gpu.fabric.status})"
    return None
