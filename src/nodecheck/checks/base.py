"""What a check declares: the finding kinds it may raise, each with every fact a face needs about it, and how the
Report tells that it could not look. checks/__init__.py lists the checks in order and derives every table from
these declarations: FINDING_KINDS, the areas of node conditions and NPD, what `clear` accepts, the signals the
bandwidth verdicts join, coverage, and docs/checks.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

AREAS = ("gpu", "fabric", "bandwidth")  # a node condition and an NPD check each (docs/kubernetes.md)


@dataclass(frozen=True)
class Kind:
    """One finding kind. `headline`: the figure it puts in a Slurm drain reason and a node condition ({subject},
    {measured}, {expected}; {head}: the message up to its first ": "). `doc`: (severity, when) rows for
    docs/checks.md. `signal`: an error signal joined to the bandwidth verdicts of the paths its device carries;
    `tempered`: an error of it is a warning when every bandwidth test over its paths passed; `escalated`: a
    warning of it is an error when one failed; `clearable`: `nodecheck clear` acknowledges its events."""

    name: str
    area: str
    headline: str
    doc: tuple[tuple[str, str], ...] = ()
    signal: bool = False
    tempered: bool = False
    escalated: bool = False
    clearable: bool = False

    def __post_init__(self) -> None:
        if self.area not in AREAS:
            raise ValueError(f"{self.name}: area {self.area!r} is none of {AREAS}")


@dataclass(frozen=True)
class Check:
    """One check: `judge(report, config) -> findings`, the kinds it may raise, the probe whose facts it reads
    (`needs`: its kinds are unknown, not healthy, while that probe failed or was switched off), and `unknown(report)
    -> {kind: why}` for the kinds the Report cannot say anything of; `rates`: the kinds judged on a counter family's
    rates, unknown in a run that cannot take them (a first sample), unless `unknown` says another why. `made_by` names who judges a check the report
    run does not (the bandwidth verdicts, an NCCL run, the prolog); its judge is then None."""

    kinds: tuple[Kind, ...]
    judge: Callable | None = None
    needs: str | None = None
    unknown: Callable | None = None
    made_by: str | None = None
    rates: tuple[tuple[str, tuple[Kind, ...]], ...] = ()  # (counter family prefix, the kinds judged on its rates)
