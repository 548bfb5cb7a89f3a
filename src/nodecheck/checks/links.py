"""The links between the node's GPUs against the config's `[links]` (a known-good node's `nvidia-smi topo -m`). Pure."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.core.link_types import link_family
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def changed_links(report: Report, config: Config) -> list[Finding]:
    seen = {tuple(sorted((l.a, l.b))): l.type for l in report.links if isinstance(l.a, int) and isinstance(l.b, int)}
    in_mig = {g.index for g in report.gpus if g.mig_enabled}
    findings = []
    for (a, b), expected in sorted(config.links.items()):
        measured = seen.get((a, b))
        if measured is None or measured == expected:
            continue  # a GPU missing altogether is gpu_count_low's finding
        if link_family(expected) == "NV" and in_mig & {a, b}:
            continue  # no NVLink under MIG: _mig says so
        severity = "error" if link_family(expected) == "NV" or measured == "SYS" else "warning"
        findings.append(Finding("gpu_link_changed", severity, f"gpu{a}-gpu{b}", measured, expected,
                                f"gpu{a}-gpu{b} linked by {measured}, {expected} expected: "
                                + ("NVLink down? check `nvidia-smi nvlink -s`" if link_family(expected) == "NV"
                                   else "the GPUs sit on a different PCIe path than on the golden node")))
    return findings


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
GPU_LINK_CHANGED = Kind("gpu_link_changed", "gpu", "{subject} link {measured} != {expected}",
    doc=(
        ("error/warning",
         "a GPU pair's link type differs from `[links]` (error when NVLink expected or SYS found)"),
    ))

CHECK = Check((GPU_LINK_CHANGED,), changed_links, needs="nvidia_smi_topo")
