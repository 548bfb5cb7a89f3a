"""The one run: host -> probes -> the merged Report -> path specs -> checks -> advice; and a saved Report judged
again by a config."""

from __future__ import annotations

import dataclasses
import re
import time

from nodecheck.assemble.fusion import merge
from nodecheck.assemble.gpu_specs import mark_gpu_specs
from nodecheck.assemble.open_events import to_remember, with_memory
from nodecheck.assemble.paths import path_specs
from nodecheck.core.errors import NodecheckError
from nodecheck.core.limits import MAX_GPUS
from nodecheck.core.pci import SYSFS_ADDRESS
from nodecheck.probes import PROBES, run_probes
from nodecheck.report.model import Report


def build_report(host, config=None, probe_timeout: float | None = None, judge: bool = True) -> Report:
    """probe_timeout caps each probe's own deadline (the prolog's budget). judge=False: the facts and path
    specs only, no findings or advice (what `bench --measure-only` needs to plan its tests)."""
    from nodecheck.assemble.advice import binding_advice
    from nodecheck.checks import evaluate

    started = time.time()
    results = run_probes(host, timeout=probe_timeout, disabled=config.disabled_probes if config else ())
    report = merge(results, _identity(host), host.label, started)
    for probe in PROBES:  # the sources that fill their own part of the Report
        result = results.get(probe.name)
        if probe.fill is not None and result is not None and result.ok:
            probe.fill(report, result.facts)
    report.kernel_log = with_memory(report.kernel_log, report.history)
    report.paths = path_specs(report, config)
    mark_gpu_specs(report)
    if not judge:
        return report
    _remember(host, report, config)
    mark_wired_nvlinks(report, config)
    report.findings = evaluate(report, config)
    report.advice = binding_advice(report)
    return report


def judged_again(report: Report, config) -> Report:
    """A saved Report's facts judged by `config` (`config check --from REPORT`): its path specs (a NIC's expected
    speed is the config's), findings and advice made anew, as build_report makes them from the probes' facts.
    Its measurements are kept as they were: config_check.as_the_prolog_judges judges them by the config."""
    from nodecheck.assemble.advice import binding_advice
    from nodecheck.checks import evaluate

    report = dataclasses.replace(report, paths=[])
    report.paths = path_specs(report, config)
    mark_wired_nvlinks(report, config)
    mark_gpu_specs(report)
    report.findings = evaluate(report, config)
    report.advice = binding_advice(report)
    return report


def mark_wired_nvlinks(report: Report, config) -> None:
    """Each GPU's NVLinks that should be up, for the exporter's NodecheckNvlinkDown and the GPU table."""
    from nodecheck.assemble.nvlinks import wired_nvlinks
    from nodecheck.config import Config

    wired = wired_nvlinks(report, config or Config())
    for gpu in report.gpus:
        gpu.nvlinks_wired = wired[gpu.index][0] if gpu.index in wired else None


def _remember(host, report: Report, config) -> None:
    """This run's error counters (for the next run's rates) and the kernel log's events (for the runs after the
    ring buffer overwrote them) into nodecheck's state; both were read before it (history)."""
    from nodecheck.assemble.counters import counter_sample
    from nodecheck.config import Config
    from nodecheck.report.events import CounterSample

    history = report.history
    if history is None:
        return
    counters = counter_sample(report) if history.uptime_s is not None else None
    sample = CounterSample(history.uptime_s, counters) if counters else None
    log = to_remember(report.kernel_log)
    if sample or log:
        host.remember(sample, (config or Config()).errors.limit("min_rate_interval_s")[0], log)


_DRIVER = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)")


def _identity(host) -> dict:
    try:
        identity = dict(host.identity())
    except NodecheckError as error:  # identity is decoration: never lose the report over it
        identity = {"error": str(error)}
    # The loaded kernel module's version, readable even when NVML's library is missing.
    driver = _DRIVER.search(host.read_text("/proc/driver/nvidia/version") or "")
    identity["kernel_module_version"] = driver[1] if driver else None
    # The GPUs the loaded module manages, whether or not NVML can start: a container sees only those its runtime
    # passed (the NVIDIA toolkit mounts their entries alone); None where the module is not loaded
    managed = [name for name in host.list_dir("/proc/driver/nvidia/gpus") if SYSFS_ADDRESS.fullmatch(name)][:MAX_GPUS]
    identity["driver_gpus"] = managed or None
    return identity
