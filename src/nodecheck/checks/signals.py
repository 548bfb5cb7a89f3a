"""Error signals judged: the kernel log's Xid and SXid events, by NVIDIA's catalogs (src/nodecheck/core/data/xid.toml,
src/nodecheck/core/data/sxid.toml). Pure: reads the Report and the Config.

- A drain-now Xid is an error until the GPU's node reboots or an operator clears it (`nodecheck clear`).
- A watched Xid is a warning; [errors] xid_repeat_count of it on one GPU within xid_repeat_window_s is an
  error (a sustained one, 92, drains only so).
- A sympathetic Xid ("caused by previous Xid N", or 45 following another Xid) is its cause's fault: named in
  the cause's finding, never counted against the GPU it names.
- A GPU that fell off the bus is gone from NVML, so an event is named by its GPU's index only while NVML
  lists a GPU at that address, else by the address (pci:0000:9b:00.0).
"""

from __future__ import annotations

import re
from collections import defaultdict

from nodecheck.assemble.open_events import RECOVERY_XID, nic_names, recovery_asked
from nodecheck.checks.base import Check, Kind
from nodecheck.checks.gpu_errors import RECOVERY_ACTIONS
from nodecheck.config import Config
from nodecheck.core.pci import normal_pci
from nodecheck.core.xid_catalog import sxid_entry, xid_entry
from nodecheck.probes.kernel_log import NIC_MODULE_ERROR, NIC_SLOT_POWER
from nodecheck.report.events import Acknowledgement, XidEvent
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def judged_events(report: Report, config: Config) -> list[XidEvent]:
    """The kernel log's events inside [errors] kernel_log_lookback_s (all since boot when 0 or when the log
    has no time stamps)."""
    log = report.kernel_log
    if log is None or not log.known:
        return []
    lookback = config.errors.kernel_log_lookback_s
    if not lookback or log.uptime_usec is None:
        return list(log.events)
    since = log.uptime_usec - lookback * 1_000_000
    return [e for e in log.events if e.usec is None or e.usec >= since]


def xid_subject(gpus: dict[str | None, str], event: XidEvent) -> str:
    """gpuN while NVML lists a GPU at the event's address (gpus: address -> gpuN), else pci:ADDRESS; nvswitchN
    for an SXid."""
    if event.kind == "sxid":
        return f"nvswitch{event.switch}" if event.switch is not None else f"pci:{event.pci}"
    if event.pci and event.pci in gpus:
        return gpus[event.pci]
    return f"pci:{event.pci}" if event.pci else ("nic?" if event.kind == "nic" else "gpu?")


def _acknowledged(kind: str, subject: str, position: int, event: XidEvent, acks: list[Acknowledgement]) -> bool:
    """Cleared by an operator: at or before the last event they saw (by time since boot; by position in a
    log without time stamps)."""
    for ack in acks:
        if ack.kind != kind or ack.subject not in (None, subject):
            continue
        if event.usec is not None and ack.upto_usec is not None:
            if event.usec <= ack.upto_usec:
                return True
        elif position < ack.count:
            return True
    return False


# finding kind -> the events it judges: their kind, and their code where one kind of event holds several
EVENT_KIND = {"gpu_xid": ("xid", None), "nvswitch_sxid": ("sxid", None), "nic_module_error": ("nic", NIC_MODULE_ERROR),
              "nic_slot_power": ("nic", NIC_SLOT_POWER)}


def events_by_subject(report: Report, config: Config, kind: str) -> dict[str, list[XidEvent]]:
    """Subject -> its events of the kind this finding judges, in log order, cleared or not."""
    event_kind, code = EVENT_KIND[kind]
    names = (nic_names(report) if event_kind == "nic" else  # once: a log holds up to 10,000 events
             {normal_pci(g.pci_bus_id): f"gpu{g.index}" for g in report.gpus})
    grouped: dict[str, list[XidEvent]] = defaultdict(list)
    for event in judged_events(report, config):
        if event.kind == event_kind and code in (None, event.code):
            grouped[xid_subject(names, event)].append(event)
    return dict(grouped)


def open_events(report: Report, config: Config, kind: str) -> dict[str, list[XidEvent]]:
    """Subject -> its events not yet cleared (`nodecheck clear`), in log order."""
    acks = report.history.acknowledgements if report.history else []
    open_ = {subject: [e for position, e in enumerate(events) if not _acknowledged(kind, subject, position, e, acks)]
             for subject, events in events_by_subject(report, config, kind).items()}
    return {subject: events for subject, events in open_.items() if events}


def gpu_xids(report: Report, config: Config) -> list[Finding]:
    findings = []
    by_subject = open_events(report, config, "gpu_xid")
    causes_logged = any(not _sympathetic(e, True) for events in by_subject.values() for e in events)
    for subject, events in by_subject.items():
        sympathetic: list[XidEvent] = []
        by_code: dict[int, list[XidEvent]] = defaultdict(list)
        for event in events:  # one pass: `event not in sympathetic` compared whole events, pair by pair
            if _sympathetic(event, causes_logged):
                sympathetic.append(event)
            else:
                by_code[event.code].append(event)
        recovery = _recovery_xid(report, subject, by_code.get(RECOVERY_XID, []))
        if recovery is not None:
            del by_code[RECOVERY_XID]
            findings += recovery
        for code, same in sorted(by_code.items()):
            findings.append(_xid_finding(report, config, subject, code, same, [e for e in sympathetic if e.caused_by in (code, None)]))
    return findings


def _recovery_xid(report: Report, subject: str, events: list[XidEvent]) -> list[Finding] | None:
    """Xid 154 names the recovery action the driver now asks for; its last line on a GPU is what holds. An action
    other than 0x0 (None) is an error (drain now), unless NVML reads the GPU's live action as none (the reset
    done: gpu_recovery_action judges the live one); back to none, nothing. None: no Xid 154, or one whose words
    this does not read (judged as a watched Xid)."""
    asked = recovery_asked(events[-1]) if events else None
    if asked is None:
        return None
    action, label = asked
    if action == 0 or _live_recovery_action(report, subject) == 0:
        return []
    where = f" ({events[-1].pci})" if not subject.startswith("pci:") else ""
    return [Finding("gpu_xid", "error", subject, f"Xid 154 {label}", "no Xid",
                    f"{subject}{where} logged Xid 154 {since_boot(events)}, last: GPU recovery action changed to 0x{action:x} "
                    f"({label}): the driver asks for it before the GPU is used again; carry it out (`nvidia-smi -q` names "
                    f"the GPU Recovery Action), then `nodecheck clear gpu_xid --gpu {_gpu_argument(subject)}`")]


def _sympathetic(event: XidEvent, causes_logged: bool) -> bool:
    return event.caused_by is not None or (xid_entry(event.code).sympathetic and causes_logged)


def _xid_finding(report: Report, config: Config, subject: str, code: int, events: list[XidEvent],
                 sympathetic: list[XidEvent]) -> Finding:
    entry = xid_entry(code)
    now = entry.drains_now([e.driver_word for e in events])
    asked = _recovery_action(report, subject) if not entry.listed else None
    if asked:  # an Xid newer than the catalog, after which the driver asks for a recovery: its word decides
        now = True
    recent = _within_window(report, config, events)
    repeated = len(recent) >= config.errors.xid_repeat_count
    processes = None
    if entry.resolution == "RESTART_APP" and not _live_recovery_action(report, subject):
        # NVIDIA's catalog resolves these by restarting the application, and the driver's line names its process:
        # one job's faults are that job's; only faults of several processes count against the GPU
        processes = _processes(recent)
        repeated = processes >= config.errors.xid_repeat_count
    pci = events[0].pci
    where = f" ({pci})" if not subject.startswith("pci:") else ""
    timed = all(e.usec is not None for e in events) and not now
    from_processes = f", from {processes} process(es)" if processes else ""
    window = since_boot(events) + (f" ({len(recent)} within {config.errors.xid_repeat_window_s:g} s{from_processes})"
                                   if timed else from_processes and f" ({from_processes[2:]})")
    followed = f"; followed by {len(sympathetic)} sympathetic Xid(s) {_codes(sympathetic)}" if sympathetic else ""
    said = _in_line(entry, events)
    if now or repeated:
        why = "drain now" if now else "repeated"
        if asked:
            why = f"drain now: NVML's recovery action for the GPU is {asked}"
        message = (f"{subject}{where} logged Xid {code} ({entry.name}) {window}{said}{followed}: {why}; "
                   f"{entry.advice(subject)}, then `nodecheck clear gpu_xid --gpu {_gpu_argument(subject)}` once it is dealt with")
    else:
        by = " from as many processes (one job's own faults are the job's)" if processes is not None else ""
        message = (f"{subject}{where} logged Xid {code} ({entry.name}) {window}{said}{followed}: watched, an error at "
                   f"{config.errors.xid_repeat_count} within {config.errors.xid_repeat_window_s:g} s{by} ([errors]); "
                   f"{entry.advice(subject)}")
    return Finding("gpu_xid", "error" if now or repeated else "warning", subject, f"Xid {code} {entry.label}",
                   "no Xid" if now else f"< {config.errors.xid_repeat_count} in {config.errors.xid_repeat_window_s:g} s", message)


_PID = re.compile(r"\bpid=(\d{1,10})\b")


def _processes(events: list[XidEvent]) -> int:
    """How many processes the events come from, by the driver's `pid=N` (an event that names none is a process of
    its own: it cannot be laid on another's)."""
    found = [_PID.search(e.message) for e in events]
    return len({pid[1] for pid in found if pid}) + found.count(None)


def _live_recovery_action(report: Report, subject: str) -> int | None:
    """The recovery action NVML reads for the GPU `subject` names now (NVML_GPU_RECOVERY_ACTION_*); None where unread."""
    gpu = next((g for g in report.gpus if f"gpu{g.index}" == subject), None)
    return gpu.signals.recovery_action if gpu is not None and gpu.signals is not None else None


def _recovery_action(report: Report, subject: str) -> str | None:
    """The recovery action NVML reads for this GPU now, in words, when it is not none; else None."""
    action = _live_recovery_action(report, subject)
    if not action:
        return None
    return f"{action} ({RECOVERY_ACTIONS.get(action, ('not one nodecheck knows',))[0]})"


def _in_line(entry, events: list[XidEvent]) -> str:
    """What the driver's own line says of a row whose severity it carries (NVLink 5): how many events it called
    fatal, on which links, and the last line ("; the driver's line: 1 of 3 fatal, links 5, 8, last: NETIR_LINK_EVT ...")."""
    if not entry.severity_in_line:
        return ""
    words = [e.driver_word for e in events]
    fatal = sum(word != "non-fatal" for word in words)
    links = sorted({e.link for e in events if e.link is not None})
    unsaid = f" ({words.count(None)} without it)" if None in words else ""
    named = f", link{'s' if len(links) > 1 else ''} {', '.join(map(str, links[:8]))}" if links else ""
    return f"; the driver's line: {fatal} of {len(events)} fatal{unsaid}{named}, last: {events[-1].message[:80]}"


def _gpu_argument(subject: str) -> str:
    return subject[3:] if subject.startswith("gpu") else subject[4:]


def _within_window(report: Report, config: Config, events: list[XidEvent]) -> list[XidEvent]:
    """The events inside the repeat window that ends now (the log's uptime; the last event's time when the
    log gave none): all of them when the log has no time stamps."""
    stamps = [e.usec for e in events if e.usec is not None]
    if len(stamps) < len(events):
        return events
    log = report.kernel_log
    end = log.uptime_usec if log and log.uptime_usec is not None else max(stamps)
    start = end - config.errors.xid_repeat_window_s * 1_000_000
    return [e for e in events if e.usec >= start]


def since_boot(events: list[XidEvent]) -> str:
    """How often since boot, and how many of those only nodecheck's memory holds (dmesg no longer shows them)."""
    remembered = sum(e.remembered for e in events)
    return f"x{len(events)} since boot" + (f" ({remembered} remembered by nodecheck: the kernel's ring buffer no longer "
                                           "holds them)" if remembered else "")


def _codes(events: list[XidEvent]) -> str:
    return ", ".join(sorted({str(e.code) for e in events}, key=int))


def switch_xids(report: Report, config: Config) -> list[Finding]:
    """NVSwitch SXid events, one finding per switch and code, named and judged by the Fabric Manager guide's
    catalog (xid_catalog.SxidEntry.fatal): an error when fatal, else a warning."""
    findings = []
    for subject, events in sorted(open_events(report, config, "nvswitch_sxid").items()):
        by_code: dict[int, list[XidEvent]] = defaultdict(list)
        for event in events:
            by_code[event.code].append(event)
        for code, same in sorted(by_code.items()):
            entry = sxid_entry(code)
            fatal = any(entry.fatal(e.driver_word) for e in same)
            links = sorted({e.link for e in same if e.link is not None})
            where = f" on link{'s' if len(links) > 1 else ''} {', '.join(map(str, links))}" if links else ""
            named = (f"{entry.name}, {entry.klass} by NVIDIA's Fabric Manager guide" if entry.listed
                     else "not in nodecheck's SXid catalog: judged by the driver's word")
            findings.append(Finding("nvswitch_sxid", "error" if fatal else "warning", subject,
                                    f"SXid {code} {entry.name}".rstrip(), "no SXid",
                                    f"{subject} ({same[0].pci}) logged SXid {code} ({named}){where} {since_boot(same)}: "
                                    f"{same[-1].message[:120]}; {entry.advice(fatal)}; check "
                                    "the fabric manager log and `nvidia-smi nvlink -s` on the GPUs behind it, then "
                                    f"`nodecheck clear nvswitch_sxid --gpu {subject}` once it is dealt with"))
    return findings


def log_unread(report: Report, *kinds) -> dict[str, str]:
    """The kernel log unread (no /dev/kmsg, journal or dmesg this process may read): its events are unknown."""
    log = report.kernel_log
    if log is not None and log.known:
        return {}
    why = log.why if log is not None else "kernel log not read"
    return {kind.name: why for kind in kinds}


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
GPU_XID = Kind("gpu_xid", "gpu", "{subject} {measured}", signal=True, tempered=True, clearable=True,
    doc=(
        ("error, warning",
         "a GPU logged an Xid since boot (or within `[errors] kernel_log_lookback_s`) that no `nodecheck clear` acknowledged: "
         "error for a drain-now Xid of `src/nodecheck/core/data/xid.toml` (48, 62, 64, 74, 79, 95, 119, 120, 140, 143, 144-150,"
         " and every row NVIDIA's catalog resolves by a GPU reset, a reboot, a VM restart or a look at the mechanicals: 46, 54,"
         " 109, 110, 136, 151, 155, 156, 158; of Blackwell's NVLink 5 Xids 144-150 only an event whose line the driver calls "
         "`Fatal`, or does not say: a `Nonfatal` one is watched, and the message says how many were fatal and on which links) "
         "and for a watched one (121 C2C among them) repeated `[errors] xid_repeat_count` times within `xid_repeat_window_s` on"
         " one GPU (92 drains only so), else warning. A sympathetic Xid (\"caused by previous Xid N\", 45 after another) is "
         "named in its cause's finding, never counted against its GPU. Xid 154 (\"GPU recovery action changed from 0x0 (None) "
         "to 0x1 (GPU Reset Required)\"): the GPU's last one holds, an error naming the action unless it is back to none or "
         "NVML reads the live action as none. Subject `gpuN`, or `pci:ADDRESS` when NVML no longer lists a GPU there (fallen "
         "off the bus). Joined to the GPU's paths: an NVLink Xid (74, 136, 144-150, 155) to its NVLink traffic only (its pairs,"
         " the in-node all-reduce), a C2C Xid (121) to its host copies only, any other to all its paths"),
    ))
NVSWITCH_SXID = Kind("nvswitch_sxid", "gpu", "{subject} {measured}", signal=True, clearable=True,
    doc=(
        ("error, warning",
         "an NVSwitch logged an SXid since boot, named by the Fabric Manager guide's catalog "
         "(src/nodecheck/core/data/sxid.toml): error when the guide calls it always fatal, when its row drains (11004, 12028, "
         "19084: NVLink traffic stalls), when the driver printed \"Fatal\", or, where the line has no word, when the guide "
         "calls it fatal; `measured` is `SXid N NAME`"),
    ))

XID = Check((GPU_XID,), gpu_xids, needs="kernel_log", unknown=lambda report: log_unread(report, GPU_XID))
SXID = Check((NVSWITCH_SXID,), switch_xids, needs="kernel_log", unknown=lambda report: log_unread(report, NVSWITCH_SXID))
