"""`nodecheck kernel-log FILE` (a pasted dmesg, journal or kmsg dump judged as nodecheck judges its own) and
`nodecheck clear KIND [--gpu N]` (an operator's acknowledgement, kept in the state file for this boot)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import typer

from nodecheck.checks import CLEARABLE
from nodecheck.cli.app import CONFIG_OPTION, EXIT_FINDINGS, EXIT_OK, app, fail
from nodecheck.core.errors import NodecheckError

KERNEL_LOG_SCHEMA_VERSION = 1


@app.command("kernel-log")
def kernel_log(
    path: Path = typer.Argument(..., help="A kernel log: `dmesg` (any format), `journalctl -k` (also -o export/json), "
                                "kern.log or /dev/kmsg records; gzip, xz or bzip2 compressed; UTF-8 or UTF-16."),
    as_json: bool = typer.Option(False, "--json", help="Print events and findings as JSON (schema nodecheck.kernel_log)."),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Judge a kernel log's NVIDIA Xid and SXid events by NVIDIA's catalog, its ConnectX NICs' module and slot
    power events, as nodecheck judges its own, and its uncorrectable PCIe (AER) errors."""
    from nodecheck import config as config_module
    from nodecheck.checks.aer_log import aer_log_findings
    from nodecheck.checks.nic_events import nic_events
    from nodecheck.checks.signals import gpu_xids, switch_xids
    from nodecheck.core.limits import MAX_COMMAND_OUTPUT
    from nodecheck.host.log_file import read_log_file
    from nodecheck.probes.kernel_aer import parse_aer_events
    from nodecheck.probes.kernel_lines import has_kernel_line
    from nodecheck.probes.kernel_log import parse_kernel_log
    from nodecheck.report.events import KernelLog
    from nodecheck.report.findings import at_or_above
    from nodecheck.report.model import Report

    try:
        config = config_module.load(config_path)
        text = read_log_file(path, MAX_COMMAND_OUTPUT)
        if not has_kernel_line(text):  # judged, prose would read as a clean log
            raise NodecheckError(f"{path}: holds no kernel-log line (dmesg, journalctl -k, kern.log or /dev/kmsg "
                                 "records; dmesg -t lines count only where they are NVIDIA's or mlx5's): nothing judged")
        events = sorted(parse_kernel_log(text) + parse_aer_events(text), key=lambda e: e.line)
        log = KernelLog(True, None, str(path), events)
    except NodecheckError as error:
        fail(str(error))
    report = Report.from_dict({})
    report.kernel_log = log
    findings = gpu_xids(report, config) + switch_xids(report, config) + nic_events(report, config) + aer_log_findings(events)
    if as_json:
        from dataclasses import asdict

        from nodecheck.render.kernel_log import event_record

        typer.echo(json.dumps({"schema": "nodecheck.kernel_log", "schema_version": KERNEL_LOG_SCHEMA_VERSION,
                               "source": str(path), "events": [event_record(e) for e in log.events],
                               "findings": [asdict(f) for f in findings]}, indent=2))
    else:
        from nodecheck.render.kernel_log import render_kernel_log

        render_kernel_log(log, findings)
    raise typer.Exit(EXIT_FINDINGS if at_or_above(findings, config.fail_severity) else EXIT_OK)


@app.command()
def clear(
    kind: str = typer.Argument(..., help=f"The finding kind to acknowledge: {', '.join(CLEARABLE)}."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Only this GPU (its index, or its PCI address when NVML no longer lists it), "
                                      "NVSwitch (nvswitch0) or NIC (its netdev, as the finding names it)."),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Acknowledge the events a finding names (after a repair): they stop failing the node until the next one.
    Kept in nodecheck's state file ($STATE_DIRECTORY, else /var/lib/nodecheck) until the node reboots."""
    from nodecheck import config as config_module
    from nodecheck.host.live import LiveHost
    from nodecheck.pipeline import build_report

    if kind not in CLEARABLE:
        fail(f"{kind!r} cannot be cleared: one of {', '.join(CLEARABLE)} (other findings clear when their cause is fixed)")
    try:
        config = config_module.load(config_path)
        report = build_report(LiveHost(), config)
    except NodecheckError as error:
        fail(str(error))
    wanted = _subject(gpu) if gpu is not None else None
    who = os.environ.get("SUDO_USER") or _user()
    try:
        cleared = _clear_counts(report, kind, wanted, who) if kind == "pcie_aer_fatal" else \
            _clear_events(report, config, kind, wanted, who)
    except NodecheckError as error:
        fail(str(error))
    if not cleared:
        typer.echo(f"nothing to clear: no {kind} {'on ' + wanted + ' ' if wanted else ''}is open")
    for line in cleared:
        typer.echo(line)


def _clear_events(report, config, kind: str, wanted: str | None, who: str) -> list[str]:
    """Acknowledge the open Xid, SXid or NIC events, up to the last one seen now."""
    from nodecheck.checks.signals import events_by_subject, open_events
    from nodecheck.host.state import acknowledge
    from nodecheck.report.events import Acknowledgement

    if report.kernel_log is None or not report.kernel_log.known:
        raise NodecheckError("the kernel log cannot be read, so there is nothing known to clear "
                             f"({report.kernel_log.why if report.kernel_log else 'not read'})")
    pending = {s: events for s, events in open_events(report, config, kind).items() if wanted is None or s == wanted}
    every = events_by_subject(report, config, kind)
    lines = []
    for subject, events in sorted(pending.items()):
        stamps = [e.usec for e in events if e.usec is not None]
        written = acknowledge(Acknowledgement(kind, subject, max(stamps) if stamps else None, len(every[subject]), who, time.time()))
        lines.append(f"cleared {subject}: {len(events)} event(s), codes {', '.join(sorted({str(e.code) for e in events}, key=int))} "
                     f"(by {who}; in {written})")
    return lines


def _clear_counts(report, kind: str, wanted: str | None, who: str) -> list[str]:
    """Acknowledge a counter's count since boot (fatal AER): it fails the node again when it rises."""
    from nodecheck.assemble.counters import device_hops
    from nodecheck.host.state import acknowledge
    from nodecheck.report.events import Acknowledgement

    hops = device_hops(report)
    lines = []
    for finding in (f for f in report.findings if f.kind == kind and (wanted is None or f.subject == wanted)):
        count = (hops[finding.subject[4:]][0].aer or {}).get("fatal", 0)
        written = acknowledge(Acknowledgement(kind, finding.subject, None, count, who, time.time()))
        lines.append(f"cleared {finding.subject}: {finding.measured} (by {who}; in {written})")
    return lines


def _subject(gpu: str) -> str:
    from nodecheck.core.pci import normal_pci

    if gpu.isascii() and gpu.isdigit() and len(gpu) < 6:  # ASCII digits: str.isdigit takes a superscript
        return f"gpu{int(gpu)}"
    if gpu.startswith("nvswitch") or gpu.startswith("gpu") or ":" not in gpu:  # a GPU, switch or NIC by name
        return gpu
    given = gpu.removeprefix("pci:")
    address = normal_pci(given if "." in given else f"{given}.0")  # the driver's form leaves the function out
    if address is None:
        fail(f"--gpu {gpu!r}: a GPU index or a PCI address (0000:9b:00.0)")
    return f"pci:{address}"


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"
