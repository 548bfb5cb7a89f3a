"""The links between the node's GPUs against the config's `[links]` (a known-good node's `nvidia-smi topo -m`). Pure."""

from __future__ import annotations

from nodecheck.assemble.nvlinks import nvlink_pairs
from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.core.link_types import link_family
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def changed_links(report: Report, config: Config) -> list[Finding]:
    seen = nvlink_pairs(report)
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


MESH_AT_LEAST = 3  # siblings that link each other all by NVLink: an NVSwitch board or a full mesh (HGX A100 4-GPU)


def left_out_of_mesh(report: Report, config: Config) -> list[Finding]:
    """A GPU that `nvidia-smi topo -m` links by NVLink to none of its siblings of the same model while they all link
    each other by NVLink: on an NVSwitch board (HGX/DGX: every pair NV#) or a full-mesh one, its links are down or it
    left the NVSwitch fabric (vllm-project/vllm#16336: a B200 whose GPU2 reads NODE and SYS to the seven others, which
    read NV18 among themselves). Bridged pairs and hybrid meshes link only some pairs: never such a mesh. A config's
    `[links]` judges pairs itself (gpu_link_changed)."""
    if config.links:
        return []
    pairs = nvlink_pairs(report)
    findings = []
    for gpu in report.gpus:
        siblings = [g.index for g in report.gpus if g.name == gpu.name and g.index != gpu.index and not g.mig_enabled]
        if gpu.mig_enabled or not gpu.name or len(siblings) < MESH_AT_LEAST:
            continue
        mesh = [t for i, a in enumerate(siblings) for b in siblings[i + 1:] if (t := pairs.get((min(a, b), max(a, b))))]
        own = [t for s in siblings if (t := pairs.get((min(gpu.index, s), max(gpu.index, s))))]
        if min(len(mesh), len(own)) < MESH_AT_LEAST or any(link_family(t) != "NV" for t in mesh) \
                or any(link_family(t) == "NV" for t in own):
            continue
        kinds = ", ".join(sorted(set(own)))
        findings.append(Finding("gpu_off_nvlink", "error", f"gpu{gpu.index}", kinds, max(set(mesh), key=mesh.count),
                                f"gpu{gpu.index} reaches none of its {len(siblings)} siblings ({gpu.name}) by NVLink ({kinds} in "
                                f"`nvidia-smi topo -m`) while they all reach each other by it: its NVLinks are down or it "
                                "left the NVSwitch fabric; check `nvidia-smi nvlink -s`, the Fabric section of "
                                "`nvidia-smi -q` (Hopper and later), the fabric manager's log, and the kernel log for an Xid"))
    return findings


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
GPU_LINK_CHANGED = Kind("gpu_link_changed", "gpu", "{subject} link {measured} != {expected}",
    doc=(
        ("error/warning",
         "a GPU pair's link type differs from `[links]` (error when NVLink expected or SYS found)"),
    ))

CHECK = Check((GPU_LINK_CHANGED,), changed_links, needs="nvidia_smi_topo")

GPU_OFF_NVLINK = Kind("gpu_off_nvlink", "gpu", "{subject} off the NVLink mesh ({measured})",
    doc=(
        ("error",
         "`nvidia-smi topo -m` links the GPU by NVLink to none of its siblings of the same model (at least three) while "
         "they all link each other by NVLink, as every pair of an NVSwitch board or a full mesh does: its NVLinks are down "
         "or it left the NVSwitch fabric. Not judged where the config's `[links]` says each pair (`gpu_link_changed`), nor "
         "under MIG; bridged pairs and hybrid meshes (DGX-1) link only some pairs and never read so"),
    ))

MESH = Check((GPU_OFF_NVLINK,), left_out_of_mesh, needs="nvidia_smi_topo")
