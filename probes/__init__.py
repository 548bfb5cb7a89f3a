"""The probe registry: each probe reads one kind of fact through a Host and parses it.

run_probes() is the one place with a broad `except`: whatever a probe does (raise, hang, return
garbage), the others still run and the outcome is recorded, never raised.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

from nodecheck.errors import NoData, NodecheckError, TimedOut
from nodecheck.host import run_until


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
    timeout: float


def _topo(host, timeout: float):
    from nodecheck.probes import topo

    return topo.parse_topo_matrix(host.command(topo.SOURCE, topo.ARGV, timeout))


def _lstopo(host, timeout: float):
    from nodecheck.probes import lstopo

    return lstopo.parse_lstopo_xml(host.command(lstopo.SOURCE, lstopo.ARGV, timeout))


def _nvml(host, timeout: float):
    from nodecheck.probes import nvml

    return nvml.parse_nvml(host.nvml(timeout, nvml.dump_nvml))  # pynvml is imported only when NVML is asked


def _nics(host, timeout: float):
    from nodecheck.probes import nics

    return nics.collect(host)


PROBES: list[Probe] = [
    Probe("nvidia_smi_topo", _topo, 15.0),
    Probe("nvml", _nvml, 15.0),
    Probe("lstopo", _lstopo, 15.0),
    Probe("nics", _nics, 10.0),
]


def run_probe(probe: Probe, host) -> ProbeResult:
    started = time.monotonic()
    try:
        facts = probe.collect(host, probe.timeout)
    except NoData as error:
        return ProbeResult(probe.name, False, True, time.monotonic() - started, None, str(error))
    except TimedOut as error:
        return ProbeResult(probe.name, False, False, time.monotonic() - started, None, str(error), timed_out=True)
    except NodecheckError as error:
        return ProbeResult(probe.name, False, False, time.monotonic() - started, None, str(error))
    except Exception as error:  # a probe bug must not take the agent down: record it instead
        return ProbeResult(probe.name, False, False, time.monotonic() - started, None,
                           f"internal error: {type(error).__name__}: {error}")
    return ProbeResult(probe.name, True, False, time.monotonic() - started, facts, None)


DISABLED = "disabled by [probes] disable in the config"


def run_probes(host, probes: list[Probe] | None = None, grace: float = 2.0,
               timeout: float | None = None, disabled: tuple[str, ...] | list[str] = ()) -> dict[str, ProbeResult]:
    """Run every probe concurrently (they mostly wait on subprocesses and files); each has a deadline.
    timeout: caps every probe's own (the prolog's time budget). disabled: probes not run at all (a
    misbehaving source switched off), recorded as giving no data and why."""
    probes = PROBES if probes is None else probes
    off = {p.name: ProbeResult(p.name, False, True, 0.0, None, DISABLED) for p in probes if p.name in disabled}
    probes = [p for p in probes if p.name not in off]
    if timeout is not None:
        probes = [dataclasses.replace(p, timeout=min(p.timeout, timeout)) for p in probes]
    launched = time.monotonic()
    deadline = launched + max((p.timeout for p in probes), default=0.0) + grace
    done = run_until({p.name: (lambda p=p: run_probe(p, host)) for p in probes}, deadline, workers=max(1, len(probes)))
    results = {}
    for probe in probes:  # run_probe records every failure itself: what is missing never returned
        result = done.get(probe.name)
        results[probe.name] = result if isinstance(result, ProbeResult) else ProbeResult(
            probe.name, False, False, time.monotonic() - launched, None, f"did not return within {probe.timeout + grace:g} s",
            timed_out=True)
    return {**results, **off}
