"""The probe registry: each probe reads one kind of fact through a Host and parses it.

run_probes() is the one place with a broad `except`: whatever a probe does (raise, hang, return
garbage), the others still run and the outcome is recorded, never raised.
"""

from __future__ import annotations

import dataclasses
import time

from nodecheck.core.errors import NoData, NodecheckError, TimedOut
from nodecheck.host.commands import probe_deadline, run_until
from nodecheck.probes import acs, history, imex, kernel_log, lstopo, nics, nvml, pcie, platform, topo
from nodecheck.probes.base import Probe, ProbeResult

__all__ = ["PROBES", "Probe", "ProbeResult", "run_probe", "run_probes"]


# Every source of facts, in the order the Report lists them. A probe module declares itself once
# (PROBE: its name, its collect(host, timeout), its default timeout, and how it fills the Report when
# no other source's facts are fused with its own); adding a source is its module, its tests and a row here.
PROBES: list[Probe] = [topo.PROBE, nvml.PROBE, lstopo.PROBE, nics.PROBE, platform.PROBE, pcie.PROBE, acs.PROBE,
                       imex.PROBE, kernel_log.PROBE, history.PROBE]


def run_probe(probe: Probe, host) -> ProbeResult:
    started = time.monotonic()
    try:
        with probe_deadline(probe.timeout):  # every read of the host past it raises TimedOut
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
        if isinstance(result, ProbeResult) and result.duration > probe.timeout + grace:  # its own deadline, not the slowest's
            result = ProbeResult(probe.name, False, False, result.duration, None,
                                 f"took {result.duration:.1f} s, past its deadline of {probe.timeout:g} s: its facts are not used",
                                 timed_out=True)
        results[probe.name] = result if isinstance(result, ProbeResult) else ProbeResult(
            probe.name, False, False, time.monotonic() - launched, None, f"did not return within {probe.timeout + grace:g} s",
            timed_out=True)
    return {**results, **off}
