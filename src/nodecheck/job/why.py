"""Why a named rank is slow, from its node's Report: the GPU the process holds (NVML's process list, or the GPU RAS
names), that GPU's findings, its rails' (the NICs nearest it) and the node's. A rank is named from NCCL's data; what
made it late or stuck is in what nodecheck saw of its node: a braked GPU, a rail's symbol errors, an Xid."""

from __future__ import annotations

from nodecheck.core.units import to_int
from nodecheck.job.ranks import Named
from nodecheck.report.model import Report

MAX_SAID = 6  # findings a rank's explanation lists (the worst first)
_ORDER = {"error": 0, "warning": 1}


def explain(named: list[Named], reports: list[Report]) -> None:
    """Fill each entry's `because` from the Report of its host (by host name, short name or an address of a NIC)."""
    for entry in named:
        report = _report_of(entry.host, reports)
        if report is None:
            entry.because = [f"no Report of {entry.host} among those given"]
            continue
        name = str((report.node or {}).get("hostname") or entry.host)
        gpu = _gpu_of(entry, report)
        subjects = {"node"}
        where = name
        if gpu is not None:
            where = f"{name} gpu{gpu.index}"
            subjects |= {f"gpu{gpu.index}", *gpu.nearest_nics, *(n.rdma_device for n in report.nics if n.name in gpu.nearest_nics and n.rdma_device)}
        said = sorted((f for f in report.findings if f.severity in _ORDER and _subject_in(f.subject, subjects)),
                      key=lambda f: _ORDER[f.severity])
        rails = f" (rails {', '.join(gpu.nearest_nics)})" if gpu is not None and gpu.nearest_nics else ""
        if not said:
            entry.because = [f"{where}{rails}: its Report finds nothing on the GPU, its rails or the node: look at what else runs "
                             "there (data loading, CPU binding, another job)"]
            continue
        entry.because = [f"{where}{rails}: {f.kind} ({f.severity}) {f.message}"[:300] for f in said[:MAX_SAID]]
        if gpu is None:
            entry.because.append(f"{name}: which GPU the process held is not in its Report (NVML listed no such pid)")


def _report_of(host: str, reports: list[Report]) -> Report | None:
    for report in reports:
        name = str((report.node or {}).get("hostname") or "")
        if name and (name == host or name.split(".")[0] == host.split(".")[0]):
            return report
    for report in reports:
        if any(a.get("address") == host for nic in report.nics for a in nic.addresses):
            return report  # RAS names nodes by the address its sockets use
    return None


def _gpu_of(entry: Named, report: Report):
    for gpu in report.gpus:
        if entry.pid is not None and any(p.pid == entry.pid for p in gpu.processes or []):
            return gpu
    if (index := to_int(entry.gpu)) is not None:
        return next((gpu for gpu in report.gpus if gpu.index == index), None)
    return None


def _subject_in(subject: str, subjects: set[str]) -> bool:
    return subject in subjects or any(part in subjects for part in subject.replace("->", "/").split("/"))
