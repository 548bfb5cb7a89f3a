"""node-problem-detector's custom-plugin protocol (issue 25): one area of the Report's checks as NPD reads a
plugin: exit 0 (OK), 1 (a problem), 2 (unknown), and one line of at most 80 characters naming the first failing
check, as a Slurm drain reason names it. Pure: a Report in, (exit code, line) out.

Areas (each a node condition in deploy/kubernetes/npd-nodecheck.json): gpu (the GPUs, their links and their
error signals), fabric (NICs, InfiniBand, the PCIe and platform paths peer traffic takes, NCCL), bandwidth (the
bandwidth tests). Every finding kind is in exactly one area (tests/system/test_npd.py). `serve --kubernetes-conditions`
(src/nodecheck/kubernetes/node_health.py) patches the same areas as the same node conditions, from the same verdicts."""

from __future__ import annotations

from dataclasses import dataclass

from nodecheck.checks import AREAS, FINDING_KINDS, headline, unmade_checks
from nodecheck.report.findings import SEVERITIES, Finding, at_or_above, one_line
from nodecheck.report.model import Report

NPD_OK, NPD_PROBLEM, NPD_UNKNOWN = 0, 1, 2
MAX_LINE = 80


@dataclass(frozen=True)
class AreaVerdict:
    """One area's answer: a problem (its gravest failing finding first), ok, or unknown (why)."""

    area: str
    failing: tuple[Finding, ...]  # gravest first, as the prolog names them
    unknown: dict[str, str]  # kind -> why, for the area's checks that could not be made
    made: int  # checks of the area that were made

    @property
    def state(self) -> str:
        return "problem" if self.failing else "unknown" if not self.made else "ok"

    def line(self, width: int = MAX_LINE, full: bool = False) -> str:
        """What NPD shows, and what a node condition's message says: the first failing check (its headline, or
        with `full` its whole message) and how many more; else ok (and how many checks could not be made) or
        unknown (why)."""
        if self.failing:
            first = self.failing[0]
            more = f" (+{len(self.failing) - 1} more)" if len(self.failing) > 1 else ""
            return fit(first.message if full else headline(first), width, more)
        if not self.made:
            return fit(f"{self.area}: unknown ({next(iter(self.unknown.values()), 'no check')})", width)
        return fit(f"{self.area}: ok" + (f" ({len(self.unknown)} check(s) unknown)" if self.unknown else ""), width)


def area_verdict(report: Report, area: str, severity: str) -> AreaVerdict:
    """A problem when a finding of the area is at or above `severity`; unknown when none of its checks could
    be made; else ok."""
    kinds = set(AREAS[area])
    failing = sorted((f for f in at_or_above(report.findings, severity) if f.kind in kinds),
                     key=lambda f: -SEVERITIES.index(f.severity))
    unknown = {kind: why for kind, why in unmade_checks(report).items() if kind in kinds}
    made = sum(1 for kind in kinds if kind in FINDING_KINDS and kind not in unknown)
    return AreaVerdict(area, tuple(failing), unknown, made)


def npd_verdict(report: Report, area: str, severity: str) -> tuple[int, str]:
    """(exit code, line) for one area, as NPD reads a custom plugin."""
    verdict = area_verdict(report, area, severity)
    code = {"problem": NPD_PROBLEM, "unknown": NPD_UNKNOWN, "ok": NPD_OK}[verdict.state]
    return code, verdict.line()


def fit(line: str, width: int, tail: str = "") -> str:
    line = one_line(" ".join(line.split()))  # one printable line, whatever a message held
    room = width - len(tail)
    return (line if len(line) <= room else line[: room - 3] + "...") + tail
