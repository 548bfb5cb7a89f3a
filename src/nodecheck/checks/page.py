"""docs/checks.md, written from the checks' declarations: every finding kind, its area, the probe its check reads,
the figure it puts in a drain reason, and when it is raised. tests/unit/checks/test_finding_kinds.py keeps the page fresh."""

from __future__ import annotations

import sys

from nodecheck.checks import AREAS, CHECKS
from nodecheck.checks.base import Check

AREA_TITLES = {"gpu": "the GPUs, their links and their error signals",
               "fabric": "NICs, InfiniBand, the PCIe and platform paths peer traffic takes, NCCL",
               "bandwidth": "the bandwidth tests"}


def _module_of(check: Check) -> str:
    """The family module that declares the check (checks/<module>.py)."""
    for name, module in sys.modules.items():
        if name.startswith("nodecheck.checks.") and any(value is check for value in vars(module).values()):
            return name.rsplit(".", 1)[1]
    return "?"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def checks_page() -> str:
    lines = ["# The checks", "",
             "Every finding kind nodecheck raises, by area: the area is a node condition (`serve --kubernetes-conditions`)",
             "and a node-problem-detector check (`check --npd AREA`); the drain reason is the figure a Slurm drain reason and a",
             "node condition name (`{subject}`, `{measured}`, `{expected}` are the finding's; `{head}` its message up to the",
             "first colon). A check whose probe failed or was switched off is unknown, never healthy",
             "(`nodecheck_check_unknown{check=KIND}`). Marks: **signal**, an error signal joined to the bandwidth verdicts",
             "of the paths its device carries ([error-signals.md](error-signals.md)); **tempered**, an error of it is a",
             "warning while every bandwidth test over its paths passes; **escalated**, a warning of it is an error when",
             "one fails; **clearable**, `nodecheck clear KIND` acknowledges its events.", "",
             "This page is written from the checks' declarations in `src/nodecheck/checks/`.", ""]
    where = {kind.name: check for check in CHECKS for kind in check.kinds}
    for area, kinds in AREAS.items():
        lines += [f"## {area}: {AREA_TITLES[area]}", "",
                  "| kind | check (reads) | drain reason | severity | when |", "| --- | --- | --- | --- | --- |"]
        for name in kinds:
            check = where[name]
            kind = next(k for k in check.kinds if k.name == name)
            source = f"`{_module_of(check)}`" + (f" ({check.needs})" if check.needs else "") + \
                (f", made by {check.made_by}" if check.made_by else "")
            marks = [mark for mark in ("signal", "tempered", "escalated", "clearable") if getattr(kind, mark)]
            for i, (severity, when) in enumerate(kind.doc or (("", ""),)):
                head = (f"`{name}`" + (" " + ", ".join(f"**{m}**" for m in marks) if marks else ""), source,
                        f"`{_cell(kind.headline)}`") if i == 0 else ("", "", "")
                lines.append(f"| {' | '.join(head)} | {_cell(severity)} | {_cell(when)} |")
        lines.append("")
    return "\n".join(lines)
