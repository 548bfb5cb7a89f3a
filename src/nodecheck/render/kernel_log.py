"""The kernel log's NVIDIA events as people read them: inspect's lines, `nodecheck kernel-log`'s table and
the records of its JSON."""

from __future__ import annotations

from collections import Counter

from nodecheck.assemble.open_events import NIC_EVENT_NAMES, nic_names, recovery_asked
from nodecheck.core.pci import normal_pci
from nodecheck.core.units import first_of
from nodecheck.core.xid_catalog import sxid_entry, xid_entry
from nodecheck.probes.kernel_aer import AER_FATAL, AER_NO_RECOVERY, AER_NONFATAL, driver_of, unrecovered
from nodecheck.render.table import SEVERITY_STYLE, esc, new_console
from nodecheck.report.events import KernelLog, XidEvent
from nodecheck.report.model import Report

SYMPATHETIC = "info"  # an event that is another's fault ("caused by previous Xid N")


def event_record(event: XidEvent) -> dict:
    """One event of `kernel-log --json`, one per line of the log in its order: `kind` is xid (an `NVRM: Xid`
    line), fallen_off_bus (the driver's message without an Xid line: counted as Xid 79) or sxid (NVSwitch);
    `severity` is what the event alone calls for (the catalog's drain: error, watch: warning, an NVLink 5 Xid
    the driver's line calls Nonfatal: warning; sympathetic: info;
    an Xid 154: error when the recovery action it changes to is not none, else info;
    an SXid: error when fatal by the Fabric Manager guide and the driver's word, signal_rules.switch_xids; a ConnectX
    NIC's module error or slot power event, kind nic: warning, nic_event_rules; an uncorrectable PCIe error, kind
    aer: error when fatal, warning when not, and a device that could not recover: error for a GPU or NIC, else info);
    `pci_bus_id` as the line prints it (the driver: domain:bus:device), `device` normalized (0000:9b:00.0)."""
    kind = "fallen_off_bus" if event.implied else event.kind
    if event.kind == "aer":
        return {"kind": "aer", "xid": None, "sxid": None, "pci_bus_id": event.printed, "device": event.pci, "count": 1,
                "severity": _aer_severity(event), "caused_by": None, "name": AER_NAMES.get(event.code), "switch": None,
                "link": None, "line": event.line, "usec": event.usec, "message": event.message, "instance": None}
    if event.kind == "nic":
        return {"kind": "nic", "xid": None, "sxid": None, "pci_bus_id": event.printed, "device": event.pci, "count": 1,
                "severity": "warning", "caused_by": None, "name": NIC_EVENT_NAMES.get(event.code), "switch": None,
                "link": None, "line": event.line, "usec": event.usec, "message": event.message}
    if event.kind == "sxid":
        severity = "error" if sxid_entry(event.code).fatal(event.driver_word) else "warning"
    elif event.caused_by is not None:
        severity = SYMPATHETIC
    elif (asked := recovery_asked(event)) is not None:  # Xid 154: the action it changes to, none or one to carry out
        severity = "error" if asked[0] else "info"
    else:
        severity = "error" if xid_entry(event.code).action_of(event.driver_word) == "drain" else "warning"
    return {"kind": kind, "xid": event.code if event.kind == "xid" else None,
            "sxid": event.code if event.kind == "sxid" else None,
            "pci_bus_id": event.printed or (event.pci.rsplit(".", 1)[0] if event.pci else None), "device": event.pci, "count": 1,
            "severity": severity, "caused_by": event.caused_by, "name": xid_entry(event.code).name if event.kind == "xid" else sxid_entry(event.code).name or None,
            "switch": event.switch, "link": event.link, "line": event.line, "usec": event.usec, "message": event.message,
            "instance": event.instance}


AER_NAMES = {AER_FATAL: "PCIe uncorrectable error (fatal)", AER_NONFATAL: "PCIe uncorrectable error (non-fatal)",
             AER_NO_RECOVERY: "no AER recovery"}


def _aer_severity(event: XidEvent) -> str:
    """What one AER line calls for by itself: a fatal error, or a GPU or NIC that could not recover, is an error;
    a non-fatal one a warning; another device that could not recover (a GPU's audio function) is said."""
    if event.code == AER_NO_RECOVERY:
        return "error" if unrecovered(event) else "info"
    return "error" if event.code == AER_FATAL else "warning"


def render_kernel_log(log: KernelLog, findings: list) -> None:
    console = new_console()
    for line in kernel_log_lines(Report.from_dict({}), log):
        console.print(esc(line))
    for finding in findings:
        style = SEVERITY_STYLE.get(finding.severity, "")
        console.print(f"[{style}]{finding.severity.upper():8}[/] {esc(finding.message)}")
    if not findings:
        console.print("no finding")


def kernel_log_lines(report: Report, log: KernelLog | None = None) -> list[str]:
    """The NVIDIA events of the kernel log since boot, one line per device and code with the catalog's name and
    what it calls for, or why the log could not be read; nothing when no probe read it."""
    log = log or report.kernel_log
    if log is None:
        return []
    if not log.known:
        return [f"Kernel log: {log.why}"]
    since = "since boot" if log.lost_before_usec is None else f"from {_after_boot(log.lost_before_usec)} after boot"
    lost = (["  events before then are unknown: the kernel's ring buffer overwrote them, and neither the journal nor an "
             "earlier nodecheck run of this boot read them"] if log.lost_before_usec is not None else [])
    if not log.events:
        return [f"Kernel log ({log.source}): no NVIDIA Xid or SXid {since}"] + lost
    names = {normal_pci(g.pci_bus_id): f"gpu{g.index}" for g in report.gpus}
    counts = Counter((e.kind, e.pci, e.code) for e in log.events)
    drains = {(e.kind, e.pci, e.code) for e in log.events  # a code drains where one of its events does (NVLink 5)
              if e.kind == "xid" and xid_entry(e.code).action_of(e.driver_word) == "drain"}
    last_asked = {(e.kind, e.pci, e.code): asked for e in log.events if (asked := recovery_asked(e))}
    drivers = {(e.kind, e.pci, e.code): driver_of(e) for e in log.events if e.kind == "aer"}
    instances: dict[tuple, set[str]] = {}  # the MIG instances each GPU's Xid was attributed to, in one pass
    for e in log.events:
        if e.instance:
            instances.setdefault((e.kind, e.pci, e.code), set()).add(e.instance)
    remembered = sum(e.remembered for e in log.events)
    held = (f", {remembered} of them remembered from earlier runs (the ring buffer no longer holds them: dmesg does not "
            "show them)") if remembered else ""
    aer = sum(e.kind == "aer" for e in log.events)  # a pasted log's AER lines (kernel-log): the PCIe tree's, not NVIDIA's
    also = f", and {aer} uncorrectable PCIe (AER) line(s)" if aer else ""
    lines = [f"Kernel log ({log.source}): {len(log.events) - aer} NVIDIA event(s) {since}{held}{also}"] + lost
    names.update(nic_names(report))
    for (kind, pci, code), n in counts.items():
        device = f"{names[pci]} ({pci})" if pci in names else (pci or "unknown device")
        if kind == "nic":
            lines.append(f"  {device}: NIC {NIC_EVENT_NAMES.get(code, 'event')} x{n} (watch)")
            continue
        if kind == "aer":
            lines.append(f"  {device} ({drivers[kind, pci, code]}): {AER_NAMES.get(code, 'AER event')} x{n}")
            continue
        if kind == "sxid":
            switch = sxid_entry(code)
            lines.append(f"  {device}: NVSwitch SXid {code} {switch.name or '(not in the catalog)'} x{n} ({switch.klass})")
            continue
        entry = xid_entry(code)
        asked = last_asked.get((kind, pci, code))  # Xid 154: its last line's action is what the driver asks now
        what = ("drain" if (kind, pci, code) in drains else
                f"the driver asks: {asked[1]}" if asked and asked[0] else "the driver asks nothing now" if asked else "watch")
        mig = sorted(instances.get((kind, pci, code), ()))
        lines.append(f"  {device}: Xid {code} {entry.name} x{n} ({what})" + (f" on MIG {first_of(mig, 4)}" if mig else ""))
    return lines


def _after_boot(usec: int) -> str:
    minutes = usec // 60_000_000
    if minutes >= 60:
        return f"{minutes // 60} h {minutes % 60} min"
    return f"{minutes} min" if minutes else f"{usec / 1e6:.0f} s"


def counter_lines(report: Report) -> list[str]:
    """What the error counters cover and the sample their rates are taken against (the findings name what
    they found); nothing when none was read."""
    from nodecheck.assemble.counters import counter_sample, previous_sample
    from nodecheck.config import Config

    sample = counter_sample(report)
    if not sample:
        return []
    families = {"aer/": "PCIe devices with AER", "ib/": "InfiniBand ports", "net/": "NIC links", "gpu/": "GPUs (NVML)"}
    counts = {label: len({k.rsplit("/", 1)[0] for k in sample if k.startswith(prefix)}) for prefix, label in families.items()}
    covered = ", ".join(f"{n} {label}" for label, n in counts.items() if n)
    found = [previous_sample(report, Config(), key) for key in sample]
    previous, why = next(((p, w) for p, w in found if p is not None), found[0])
    history = report.history
    against = (f"rates over the last {history.uptime_s - previous.uptime_s:.0f} s" if previous and history and history.uptime_s
               else (why or "rates unknown"))
    return [f"Error counters: {covered}; {against}"] + _brake_lines(report)


def _brake_lines(report: Report) -> list[str]:
    """How long each GPU's clocks have been slowed since the driver loaded, per reason (NVML's clock event counters),
    where any has: a GPU its cooling or power supply keeps braking shows here before any one sample holds it."""
    from nodecheck.report.gpu import REASON_NAMES

    uptime = report.history.uptime_s if report.history else None
    said = []
    for gpu in report.gpus:
        for label, ns in sorted(((gpu.signals.clock_event_ns or {}) if gpu.signals else {}).items()):
            if ns > 0 and label in REASON_NAMES:
                share = f" ({100 * ns / 1e9 / uptime:.1f}% of the {_duration(uptime)} since boot)" if uptime else ""
                said.append(f"gpu{gpu.index} {REASON_NAMES[label]} {_duration(ns / 1e9)}{share}")
    return [f"Clocks slowed since the driver loaded: {'; '.join(said)}"] if said else []


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"

