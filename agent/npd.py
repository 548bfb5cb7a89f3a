"""node-problem-detector's custom-plugin protocol (issue 25): one area of the Report's checks as NPD reads a
plugin: exit 0 (OK), 1 (a problem), 2 (unknown), and one line of at most 80 characters naming the first failing
check, as a Slurm drain reason names it. Pure: a Report in, (exit code, line) out.

Areas (each a node condition in deploy/kubernetes/npd-nodecheck.json): gpu (the GPUs, their links and their
error signals), fabric (NICs, InfiniBand, the PCIe and platform paths peer traffic takes, NCCL), bandwidth (the
bandwidth tests). Every finding kind is in exactly one area (tests/test_npd.py)."""

from __future__ import annotations

from nodecheck.coverage import unmade_checks
from nodecheck.findings import FINDING_KINDS, SEVERITIES, at_or_above, headline
from nodecheck.model import Report

NPD_OK, NPD_PROBLEM, NPD_UNKNOWN = 0, 1, 2
MAX_LINE = 80
AREAS = {
    "gpu": ("gpu_count_low", "pcie_downtrained", "nvlink_inactive", "nvlink_count_low", "ecc_disabled", "row_remap_failed",
            "row_remap_pending", "gpu_link_changed", "gpu_xid", "nvswitch_sxid", "pcie_replays", "nvlink_errors",
            "ecc_uncorrected", "gpu_clock_slowdown", "gpu_vbios_mismatch", "probe_failed"),
    "fabric": ("nic_missing", "nic_down", "nic_slow", "nic_speed_unknown", "nic_far_from_gpu", "nic_mtu_mismatch",
               "gpudirect_rdma_unavailable", "iommu_translated", "pcie_hop_narrow", "pcie_acs_redirect", "pcie_aer_fatal",
               "pcie_link_errors", "ib_link_downed", "ib_port_errors", "ib_counter_saturated", "nccl_socket_fallback",
               "nccl_no_gdr", "nccl_p2p_disabled", "nccl_rail_mismatch", "nccl_warning", "peer_unreachable",
               "peer_outside_subnet", "peer_slow"),
    "bandwidth": ("bandwidth_below_spec", "bandwidth_above_bound", "bench_failed", "bench_wrong_result", "check_timed_out",
                  "check_failed"),
}


def npd_verdict(report: Report, area: str, severity: str) -> tuple[int, str]:
    """(exit code, line) for one area: a problem when a finding of it is at or above `severity`; unknown when
    none of its checks could be made; else OK, saying how many it could not make."""
    kinds = set(AREAS[area])
    failing = sorted((f for f in at_or_above(report.findings, severity) if f.kind in kinds),
                     key=lambda f: -SEVERITIES.index(f.severity))  # gravest first, as the prolog names them
    if failing:
        more = f" (+{len(failing) - 1} more)" if len(failing) > 1 else ""
        return NPD_PROBLEM, _fit(headline(failing[0]), more)
    unmade = {kind: why for kind, why in unmade_checks(report).items() if kind in kinds}
    made = [kind for kind in kinds if kind in FINDING_KINDS and kind not in unmade]
    if not made:
        why = next(iter(unmade.values()), "no check")
        return NPD_UNKNOWN, _fit(f"{area}: unknown ({why})")
    return NPD_OK, _fit(f"{area}: ok" + (f" ({len(unmade)} check(s) unknown)" if unmade else ""))


def _fit(line: str, tail: str = "") -> str:
    line = " ".join(line.split())  # one line, whatever a message held
    room = MAX_LINE - len(tail)
    return (line if len(line) <= room else line[: room - 3] + "...") + tail
