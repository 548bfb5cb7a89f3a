"""Each error signal joined to the bandwidth verdict of the path it sits on (issue 23's judgment). Pure.

- A measurement below its threshold names the signals on its path in its finding ("gpu0:host h2d ... = 0.41
  of spec ...; signals on this path: pci:0000:16:00.0 AER correctable 40/min > <= 31/min").
- An error-only signal whose path's last measurements all passed is a warning, not a drain: the link errs but
  carries its bandwidth (the NVLink "unhealthy" for 13 days while NCCL measured 843 GB/s). A drain-now class
  (a drain Xid, fatal AER, link_downed rising) stays an error whatever was measured.
- A PCIe replay rate past its limit is a warning, as DCGM's PCIe watch says it, and an error when a bandwidth test
  over that link failed too.
- A measurement below its threshold on a GPU another process held (NVML's list: not nodecheck's, not its job's) is
  a warning naming the process: it measured the sharing, not the link (`bench` beside a job).
"""

from __future__ import annotations

import dataclasses
import re

from nodecheck.assemble.counters import device_hops
from nodecheck.checks import ESCALATED, SIGNALS, TEMPERED
from nodecheck.core.pci import normal_pci
from nodecheck.core.xid_catalog import xid_entry
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report, measured_on, path_identity

DRAIN_NOW_XID = "no Xid"  # the expected figure of a drain-now Xid's finding
# what an NVSwitch carries: on an HGX board every GPU links to every switch, so GPU pairs and the in-node
# all-reduce cross each of them, and no host link does
NVSWITCH_FABRIC = "nvswitch-fabric"
FABRIC_OF = "nvlink-fabric:"  # + gpu3: that GPU's registration with the NVLink fabric, which only its NVLink traffic uses
C2C_OF = "c2c:"  # + gpu0: that GPU's NVLink-C2C link to its Grace CPU, which only its host copies use
_XID_CODE = re.compile(r"Xid (\d{1,6})\b")  # a gpu_xid finding's measured figure: "Xid 74 NVLink error"


def signal_devices(report: Report, finding: Finding, hops: dict) -> list[str]:
    """The GPUs and NICs (gpu3, ibp26s0) whose traffic a signal's device carries (hops: device_hops(report)); for an
    NVSwitch, the NVLink fabric between the GPUs (NVSWITCH_FABRIC); for a GPU's fabric registration, its NVLink
    traffic only (FABRIC_OF + the GPU), as for an NVLink Xid; for a C2C Xid, the GPU's host copies (C2C_OF + the GPU)."""
    if finding.kind in ("pcie_link_errors", "pcie_aer_fatal") and finding.subject.startswith("pci:"):
        entry = hops.get(normal_pci(finding.subject[4:]) or finding.subject[4:])
        return list(entry[1]) if entry else []
    if finding.kind in ("nvswitch_sxid", "nvlink_bw_reduced") and not finding.subject.startswith("gpu"):
        return [NVSWITCH_FABRIC]  # every NVLink path of the node
    if finding.kind in ("gpu_fabric_not_ready", "gpu_fabric_unhealthy", "nvlink_bw_reduced"):
        return [FABRIC_OF + finding.subject]
    if finding.kind == "gpu_xid" and finding.subject.startswith("gpu") and (code := _XID_CODE.match(finding.measured)):
        path = xid_entry(int(code[1])).path  # an NVLink Xid sits on the GPU's NVLink traffic, a C2C one on its host copies
        if path:
            return [(FABRIC_OF if path == "nvlink" else C2C_OF) + finding.subject]
    if finding.kind in ("ib_port_errors", "ib_link_downed", "rdma_retransmits", "roce_gid_unroutable"):
        device = finding.subject.split("/", 1)[0]
        return [n.name for n in report.nics if n.rdma_device == device]
    if finding.kind in ("nic_link_errors", "nic_module_error", "nic_slot_power"):
        return [finding.subject] if any(n.name == finding.subject for n in report.nics) else []
    if finding.subject.startswith("gpu"):  # a GPU's own signal: gpu_xid, its replays, NVLink, clocks, ECC, recovery
        return [finding.subject]
    return []


def nics_used(report: Report, measurement) -> set[str] | None:
    """The NICs (netdev names) of this node a collective across nodes ran over, as its ranks reported them
    (details["nodes"]: the traffic NIC and the rails of each rank on this host); None where the measurement does
    not say, and any NIC may have carried it."""
    members = (measurement.details or {}).get("nodes")
    host = (report.node or {}).get("hostname")
    if not isinstance(members, list) or not host:
        return None
    names = set()
    for member in members:
        if isinstance(member, dict) and member.get("node") == host:
            names.update(n for n in [member.get("nic"), *[r.get("name") for r in member.get("rails") or [] if isinstance(r, dict)]]
                         if isinstance(n, str) and n)
    used = {n.name for n in report.nics if n.name in names or n.rdma_device in names}
    return used or None


def on_path(measurement, devices: list[str], used: set[str] | None = None) -> bool:
    """Whether the measurement's traffic crossed one of these devices: a GPU's host link or pair for its GPU,
    an all-reduce inside the node for any GPU, one across nodes for a NIC it ran over (`used`: nics_used; any
    NIC where unknown) or, run in one multi-node NVLink domain, for any GPU, a NIC's own test for that NIC.
    Another node's measurement (a job's Report holds them as "node5/gpu0:host") crosses none of this node's
    devices."""
    if measured_on(measurement.path) is not None:
        return False
    scope, endpoints, _ = path_identity(measurement.path)
    # a job in one multi-node NVLink domain (GB200 NVL72) crosses the GPUs' NVLinks, not the rails
    over_nvlink = scope == "cluster" and (measurement.details or {}).get("path_kind") == "nvlink"
    if NVSWITCH_FABRIC in devices:
        return scope in ("gpu-pair", "node") or over_nvlink
    over_c2c = [d[len(C2C_OF):] for d in devices if d.startswith(C2C_OF)]
    if over_c2c:
        return scope == "host-link" and any(e in over_c2c for e in endpoints)
    registered = [d[len(FABRIC_OF):] for d in devices if d.startswith(FABRIC_OF)]
    if registered:
        return scope == "node" or over_nvlink or scope == "gpu-pair" and any(e in registered for e in endpoints)
    gpus = [d for d in devices if d.startswith("gpu")]
    nics = [d for d in devices if not d.startswith("gpu")]
    if scope in ("host-link", "gpu-pair"):
        return any(e in gpus for e in endpoints)
    if scope == "node" or over_nvlink:
        return bool(gpus)
    if scope == "cluster":
        return bool(nics) if used is None else any(n in used for n in nics)
    if scope == "nic":
        return bool(endpoints) and endpoints[0] in nics
    return False


def _failed(measurement) -> bool:
    """A test that did not complete, or measured below the threshold it was judged by."""
    threshold = (measurement.details or {}).get("threshold")
    return not measurement.ok or measurement.ratio is not None and threshold is not None and measurement.ratio < threshold


def passed(measurement) -> bool:
    threshold = (measurement.details or {}).get("threshold")
    return measurement.ok and measurement.ratio is not None and threshold is not None and measurement.ratio >= threshold


def joined(report: Report, measurements: list, findings: list[Finding]) -> list[Finding]:
    """The findings with each signal joined to its path's verdict (see the module's text)."""
    hops = device_hops(report)
    signals = [(f, signal_devices(report, f, hops)) for f in findings if f.kind in SIGNALS]
    devices_of = {id(f): devices for f, devices in signals}
    used = {id(m): nics_used(report, m) for m in measurements}
    out = []
    held = held_gpus(report)
    for finding in findings:
        if finding.kind == "bandwidth_below_spec":
            measurement = next((m for m in measurements if finding.message.startswith(f"{m.path} {m.test} ")), None)
            if measurement is not None:
                finding = _shared(_naming_signals(finding, measurement, signals, used[id(measurement)]), measurement, held)
        elif finding.kind in TEMPERED and finding.severity == "error" and finding.expected != DRAIN_NOW_XID:
            devices = devices_of.get(id(finding), [])
            crossing = [m for m in measurements if devices and on_path(m, devices, used[id(m)])]
            if crossing and all(passed(m) for m in crossing):
                figures = ", ".join(f"{m.test} on {m.path} {m.ratio:.2f} of spec" for m in crossing[:3])
                finding = dataclasses.replace(finding, severity="warning", message=(
                    f"{finding.message} (its path's last bandwidth test passed: {figures}; a warning, not a drain, "
                    "until the bandwidth drops or the errors grow)"))
        elif finding.kind in ESCALATED and finding.severity == "warning":
            devices = devices_of.get(id(finding), [])
            failing = [m for m in measurements if devices and on_path(m, devices, used[id(m)]) and _failed(m)]
            if failing:
                figures = ", ".join(f"{m.test} on {m.path} " + (f"{m.ratio:.2f} of spec" if m.ok else "failed") for m in failing[:3])
                finding = dataclasses.replace(finding, severity="error", message=(
                    f"{finding.message} (and its path's bandwidth test failed: {figures}: an error)"))
        out.append(finding)
    return out


def _naming_signals(finding: Finding, measurement, signals: list, used: set[str] | None) -> Finding:
    named = [f"{s.subject} {s.measured}" for s, devices in signals if on_path(measurement, devices, used)]
    if not named:
        return finding
    return dataclasses.replace(finding, message=f"{finding.message}; error signals on this path: {'; '.join(named)}")


def held_gpus(report: Report) -> dict[str, str]:
    """GPU ("gpu3") -> the first process another holds it with ("pid 4242 python3"), nodecheck's own and its job's apart."""
    held = {}
    for gpu in report.gpus:
        others = [p for p in gpu.processes or [] if not p.ours and not p.gone and p.type != "graphics"]
        if others:
            held[f"gpu{gpu.index}"] = f"pid {others[0].pid} {others[0].name or '?'}"
    return held


def _shared(finding: Finding, measurement, held: dict[str, str]) -> Finding:
    sharing = [f"{gpu} ({who})" for gpu, who in held.items() if on_path(measurement, [gpu])]
    if not sharing:
        return finding
    return dataclasses.replace(finding, severity="warning", message=(
        f"{finding.message}; measured while another process held {', '.join(sharing)}: the figure is shared with "
        "it, so it is a warning, not a verdict on the link; measure again with the GPUs free"))
