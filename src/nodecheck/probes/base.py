"""What a probe is, and what running one gives (the registry is src/nodecheck/probes/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class ProbeResult:
    name: str
    ok: bool
    no_data: bool
    duration: float
    facts: object | None
    error: str | None
    timed_out: bool = False  # its source hung until killed or abandoned


@dataclass(frozen=True)
class Probe:
    name: str
    collect: Callable[[object, float], object]  # (host, timeout) -> facts
    timeout: float  # its default deadline
    # (report, facts) -> None: puts its facts into the Report. None for the sources build.merge fuses
    # (GPUs come from nvidia-smi, NVML and hwloc together); a source of its own sets it.
    fill: Callable[[object, object], None] | None = None
