"""Report + Config -> findings. The checks, in the order they run: each family module declares its finding kinds
and its checks (checks/base.py), and every table a face reads derives from this list: FINDING_KINDS (the drain
headline of each kind), the areas of node conditions and NPD, what `clear` accepts, the signals the bandwidth
verdicts join, which checks a Report could not make, and docs/checks.md. Adding a check: its module and one line
here."""

from __future__ import annotations

from nodecheck.assemble.counters import unknown_rates
from nodecheck.checks import (
    compute_mode,
    error_counters,
    fabric,
    gpu,
    gpu_errors,
    gpu_presence,
    gpu_processes,
    imex,
    links,
    measured,
    nccl,
    nccl_conf,
    nccl_topo,
    nic_events,
    nics,
    pcie,
    platform,
    probe_failures,
    prolog,
    rail,
    roce,
    signals,
)
from nodecheck.checks.base import AREAS as AREA_NAMES
from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.probes import DISABLED
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

CHECKS: tuple[Check, ...] = (
    probe_failures.CHECK,
    gpu_presence.COUNT,
    gpu_presence.INACCESSIBLE,
    gpu.CHECK,
    links.CHECK,
    links.MESH,
    nics.EXPECTED,
    nics.FAR,
    rail.MTU,
    rail.RATES,
    rail.DOWN,
    platform.CHECK,
    pcie.NARROW,
    pcie.SLOW,
    pcie.ACS,
    signals.XID,
    signals.SXID,
    nic_events.CHECK,
    error_counters.AER,
    error_counters.IB,
    error_counters.NETDEV,
    nccl_conf.CHECK,
    roce.CHECK,
    gpu_errors.CHECK,
    gpu_errors.VBIOS,
    gpu_presence.PERSISTENCE,
    compute_mode.CHECK,
    fabric.CHECK,
    fabric.BW_MODE,
    imex.CHECK,
    # judged where their input is: the bandwidth verdicts, an NCCL run's log, the prolog
    measured.CHECK,
    nccl.CHECK,
    nccl_topo.CHECK,
    gpu_processes.CHECK,
    prolog.CHECK,
)

KINDS: dict[str, Kind] = {kind.name: kind for check in CHECKS for kind in check.kinds}
FINDING_KINDS: dict[str, str] = {name: kind.headline for name, kind in KINDS.items()}
AREAS: dict[str, tuple[str, ...]] = {area: tuple(n for n, k in KINDS.items() if k.area == area) for area in AREA_NAMES}
CLEARABLE = tuple(n for n, k in KINDS.items() if k.clearable)
SIGNALS = tuple(n for n, k in KINDS.items() if k.signal)
TEMPERED = tuple(n for n, k in KINDS.items() if k.tempered)
ESCALATED = tuple(n for n, k in KINDS.items() if k.escalated)


def evaluate(report: Report, config: Config | None) -> list[Finding]:
    """Every check the report run makes, in order."""
    config = config or Config()
    return [finding for check in CHECKS if check.judge is not None for finding in check.judge(report, config)]


def headline(finding: Finding) -> str:
    """The finding's figure as a Slurm drain reason or an NPD condition names it ("gpu3 PCIe x8 < x16")."""
    template = FINDING_KINDS.get(finding.kind, "{head}")
    return template.format(subject=finding.subject, measured=finding.measured, expected=finding.expected,
                           head=finding.message.split(": ")[0])


def unmade_checks(report: Report) -> dict[str, str]:
    """Finding kind -> why the Report cannot say whether it holds (absent: the check was made): each check asked
    why it could not look. A check whose probe failed or was switched off says so first; a check made elsewhere
    (the prolog) says by whom. Unknown is never healthy: the exporter publishes it as nodecheck_check_unknown."""
    outcomes = {p.name: p for p in report.probes}
    # the counter families' rates, worked out once (a first sample: each counter's change asks the state file)
    rates = unknown_rates(report, Config(), {prefix for check in CHECKS for prefix, _ in check.rates})
    unmade: dict[str, str] = {}
    # a check made elsewhere says so first (the reason NPD names); a stable sort keeps the registry's order otherwise
    for check in sorted(CHECKS, key=lambda c: not (c.unknown is None and c.made_by is not None)):
        outcome = outcomes.get(check.needs) if check.needs else None
        if outcome is not None and not outcome.ok and (not outcome.no_data or outcome.error == DISABLED):
            unmade.update({kind.name: f"probe {check.needs}: {outcome.error or 'failed'}" for kind in check.kinds})
        if check.unknown is not None:
            for kind, why in check.unknown(report).items():
                unmade.setdefault(kind, why)
        for prefix, kinds in check.rates:
            if prefix in rates:
                for kind in kinds:
                    unmade.setdefault(kind.name, rates[prefix])
        if check.unknown is None and check.made_by is not None:
            unmade.update({kind.name: f"made by {check.made_by} only" for kind in check.kinds})
    raised = {f.kind for f in report.findings}
    return {kind: why for kind, why in unmade.items() if kind not in raised}
