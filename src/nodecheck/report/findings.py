"""What the rules raise: a Finding, its severities, and every kind with the figure it puts in a Slurm
drain reason."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nodecheck.core.typed_json import ESSENTIAL

SEVERITIES = ("info", "warning", "error", "critical")


def at_or_above(findings: list, severity: str) -> list:
    """The findings at or above `severity`, in their order (what fails a run)."""
    floor = SEVERITIES.index(severity)
    return [f for f in findings if SEVERITIES.index(f.severity) >= floor]


# Every finding kind nodecheck raises, with the figure it puts in a Slurm drain reason ({subject},
# {measured}, {expected}; {head}: the message up to its first ": "). The rules raise only these
# (tests/test_finding_kinds.py), docs/report-schema.md lists each, and the exporter publishes one
# health gauge per kind.
FINDING_KINDS = {
    "gpu_count_low": "GPUs {measured} < {expected}",
    "gpu_inaccessible": "{subject} {measured}",
    "pcie_downtrained": "{subject} PCIe {measured} < {expected}",
    "nvlink_inactive": "{subject} NVLinks active {measured} < {expected}",
    "nvlink_count_low": "{subject} NVLinks {measured} < {expected}",
    "c2c_link_down": "{subject} C2C links {measured} < {expected}",
    "ecc_disabled": "{subject} ECC off",
    "row_remap_failed": "{subject} row remapping failed",
    "row_remap_pending": "{subject} row remapping pending",
    "sram_threshold_exceeded": "{subject} SRAM errors past the RMA threshold",
    "retired_pages_limit": "{subject} {measured} pages, expected {expected}",
    "retired_pages_pending": "{subject} page retirement pending",
    "inforom_corrupted": "{subject} InfoROM corrupted",
    "gpu_power_limit_lowered": "{subject} power limit {measured} < {expected}",
    "gpu_persistence_off": "GPU persistence mode {measured}",
    "gpu_compute_mode": "{subject} compute mode {measured}, {expected} expected",
    "gpu_in_use": "{subject} held outside any job: {measured}",
    "gpu_process_gone": "{subject} lists {measured}, not in /proc",
    "gpu_memory_held": "{subject} {measured} held with no process",
    "nic_module_error": "{subject} cable or transceiver: {measured}",
    "nic_slot_power": "{subject} {measured}",
    "gpu_mig_mode": "{subject} MIG {measured}",
    "gpu_link_changed": "{subject} link {measured} != {expected}",
    "nic_missing": "{subject} missing",
    "nic_down": "{subject} {measured} != {expected}",
    "nic_slow": "{subject} {measured} < {expected}",
    "nic_speed_unknown": "{subject} speed unknown, {expected} expected",
    "nic_far_from_gpu": "{head}",
    "nic_mtu_mismatch": "{subject} MTU {measured} != {expected}",
    "nic_rate_mismatch": "{subject} {measured} < {expected} of the other rails",
    "nic_rail_down": "{subject} {measured}, other rails {expected}",
    "gpudirect_rdma_unavailable": "no GPUDirect RDMA peer-memory module",
    "iommu_translated": "{subject} IOMMU {measured}",
    "pcie_hop_narrow": "{subject} PCIe {measured} < {expected}",
    "pcie_hop_slow": "{subject} PCIe {measured} < {expected}",
    "pcie_acs_redirect": "{subject} ACS redirects peer traffic",
    "probe_failed": "{subject} {measured}",
    "bandwidth_below_spec": "{subject} bandwidth {measured} of spec, {expected} expected",
    "bandwidth_above_bound": "{subject} {measured} x its bound: path misread",
    "bench_failed": "{head} failed",
    "bench_wrong_result": "{head} returned wrong data",
    "nccl_socket_fallback": "NCCL over sockets, RDMA NICs up",
    "nccl_no_gdr": "NCCL without GPUDirect RDMA",
    "nccl_p2p_disabled": "NCCL over {measured} inside the node",
    "nccl_rail_mismatch": "{subject} NCCL on {measured}, nearest {expected}",
    "nccl_warning": "{head}",
    "nccl_config": "{subject}={measured}",
    "nccl_setting": "NCCL run took {measured}",
    "roce_gid_unroutable": "{subject} {measured}",
    "gpu_xid": "{subject} {measured}",
    "nvswitch_sxid": "{subject} {measured}",
    "pcie_aer_fatal": "{subject} {measured}",
    "pcie_link_errors": "{subject} {measured} > {expected}",
    "ib_link_downed": "{subject} {measured}",
    "ib_port_errors": "{subject} {measured}",
    "ib_counter_saturated": "{subject} {measured} saturated",
    "rdma_retransmits": "{subject} retransmits: {measured}",
    "nic_link_errors": "{subject} {measured}",
    "pcie_replays": "{subject} {measured} > {expected}",
    "nvlink_errors": "{subject} {measured}",
    "ecc_uncorrected": "{subject} {measured} ECC errors",
    "gpu_clock_slowdown": "{subject} clocks: {measured}",
    "gpu_recovery_action": "{subject} needs {measured}",
    "gpu_vbios_mismatch": "{subject} VBIOS {measured} != {expected}",
    "gpu_fabric_not_ready": "{subject} {measured}",
    "gpu_fabric_unhealthy": "{subject} {measured}",
    "imex_unhealthy": "{subject} {measured}",
    "nvlink_bw_reduced": "NVLink bandwidth {measured}",
    # raised by `nodecheck prolog` / `healthcheck` only
    "check_timed_out": "{subject} timed out after {expected}",
    "check_failed": "{head}",
    "peer_unreachable": "{subject} unreachable",
    "peer_outside_subnet": "{subject} {measured} outside {expected}",
    "peer_slow": "{subject} round trip {measured}, peers' median {expected}",
}


# a face that keeps one line (a Slurm drain reason, which `scontrol show node --oneliner` shows and the prolog reads
# back; a node condition; NPD's output): a newline from a NIC's or a GPU's name (sysfs, NVML, a config, a snapshot)
# would end it, an escape sequence would reach the admin's terminal
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(text: str) -> str:
    """Text made of a finding's parts as one printable line: control characters, newlines and tabs become '?'."""
    return _UNPRINTABLE.sub("?", text)


def headline(finding) -> str:
    """The finding's figure as a Slurm drain reason or an NPD condition names it ("gpu3 PCIe x8 < x16")."""
    template = FINDING_KINDS.get(finding.kind, "{head}")
    return template.format(subject=finding.subject, measured=finding.measured, expected=finding.expected,
                           head=finding.message.split(": ")[0])


@dataclass
class Finding:
    kind: str = field(metadata=ESSENTIAL)  # gpu_count_low, pcie_downtrained, nvlink_inactive, ...
    severity: str = field(metadata=ESSENTIAL)  # one of SEVERITIES
    subject: str = field(metadata=ESSENTIAL)  # gpu0, gpu0-gpu1, eth0, node
    measured: object
    expected: object
    message: str  # one line a person can act on
