"""What the checks raise: a Finding and its severities. The kinds, with the figure each puts in a Slurm drain
reason, are declared by the checks (checks/__init__.py FINDING_KINDS)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nodecheck.core.typed_json import ESSENTIAL

SEVERITIES = ("info", "warning", "error", "critical")


def at_or_above(findings: list, severity: str) -> list:
    """The findings at or above `severity`, in their order (what fails a run)."""
    floor = SEVERITIES.index(severity)
    return [f for f in findings if SEVERITIES.index(f.severity) >= floor]


# a face that keeps one line (a Slurm drain reason, which `scontrol show node --oneliner` shows and the prolog reads
# back; a node condition; NPD's output): a newline from a NIC's or a GPU's name (sysfs, NVML, a config, a snapshot)
# would end it, an escape sequence would reach the admin's terminal
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(text: str) -> str:
    """Text made of a finding's parts as one printable line: control characters, newlines and tabs become '?'."""
    return _UNPRINTABLE.sub("?", text)


@dataclass
class Finding:
    kind: str = field(metadata=ESSENTIAL)  # gpu_count_low, pcie_downtrained, nvlink_inactive, ...
    severity: str = field(metadata=ESSENTIAL)  # one of SEVERITIES
    subject: str = field(metadata=ESSENTIAL)  # gpu0, gpu0-gpu1, eth0, node
    measured: object
    expected: object
    message: str  # one line a person can act on
