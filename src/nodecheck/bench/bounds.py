"""What bounds a collective inside one node: the slowest GPU pair, or on a partial NVLink mesh (a DGX-1's hybrid cube
mesh, where some pairs are SYS and NCCL's rings run over NVLink only) the smallest per-GPU NVLink total; and whether
GPUs on PCIe reach each other peer-to-peer or only through host memory (a staged path). Pure: no I/O."""

from __future__ import annotations

import re

from nodecheck.assemble.nvlinks import nvlink_pairs, pair_nvlinks
from nodecheck.report.model import PathSpec, Report
from nodecheck.verdicts.bandwidth import PARTIAL_MESH

# GeForce boards have no peer-to-peer in NVIDIA's driver (nccl-tests#287: 4x RTX 5090, "CANNOT Access Peer", NCCL
# over SHM); a driver patched to allow it (tinygrad's open-gpu-kernel-modules) says so in NVML's P2P status
_NO_P2P_BOARD = re.compile(r"\bGeForce\b")


def slowest_pair(report: Report) -> PathSpec | None:
    """The path that bounds a collective inside the node: its slowest GPU<->GPU PathSpec, or where every GPU has
    NVLink to some peer but not every pair is NVLink, the smallest per-GPU NVLink total (nvlink_total); None when
    there is no pair, or any pair's spec is unknown."""
    pairs = [p for p in report.paths if p.scope == "gpu-pair"]
    if not pairs or not all(p.bytes_per_second for p in pairs):
        return None
    return nvlink_total(report, pairs) or min(pairs, key=lambda p: p.bytes_per_second)


def nvlink_total(report: Report, pairs: list[PathSpec]) -> PathSpec | None:
    """On a partial NVLink mesh (every GPU linked to some peer by NVLink, some of the node's GPU pairs `pairs` not): the
    smallest per-GPU sum of its NVLinks' one-way rates, each GPU's links from `nvidia-smi topo -m`'s NV# pairs; None
    elsewhere."""
    from nodecheck.assemble.paths import gpu_nvlink_spec

    topo = nvlink_pairs(report)
    links = {g.index: pair_nvlinks(topo, g.index) for g in report.gpus}
    if len(links) < 3 or not all(links.values()) or all(p.kind == "nvlink" for p in pairs):
        return None
    totals = []
    for gpu in report.gpus:
        spec, _ = gpu_nvlink_spec(gpu, links[gpu.index])
        if spec is None:
            return None
        totals.append((spec.bytes_per_second, gpu, spec))
    rate, gpu, spec = min(totals, key=lambda t: t[0])
    return PathSpec(f"gpu{gpu.index}:nvlink", "nvlink", rate,
                    f"{PARTIAL_MESH}: a ring runs over NVLink only, bounded by the GPU with the fewest links, gpu{gpu.index}'s "
                    f"{links[gpu.index]} ({spec.basis})", spec.source, scope="node")


def calibration(report: Report, ranks: int, kind: str | None) -> str | None:
    """The calibration variant of a collective inside the node over NVLink: "gen5x4" for 4 ranks on NVLink 5 (a
    GB200/GB300 tray's GPUs, which reach less of NVLink than 8 A100s do: specs.toml [thresholds]); None elsewhere."""
    from nodecheck.core.specs import architecture_row

    if kind != "nvlink" or not report.gpus:
        return None
    generation = architecture_row(report.gpus[0].architecture, report.gpus[0].name).get("nvlink_generation")
    return f"gen{generation}x{ranks}" if generation else None


def peer_access(report: Report) -> tuple[bool | None, str]:
    """Whether the node's GPUs reach each other peer-to-peer: NVML's P2P read status of every pair (`nvidia-smi topo
    -p2p r`), else the board (GeForce: no P2P); (None, why) when nothing says."""
    said = {status for gpu in report.gpus for status in (gpu.p2p_read or {}).values()}
    if said:
        refused = sorted(s for s in said if s != "ok")
        return (False, f"NVML's P2P read status: {refused[0]}") if refused else (True, "NVML's P2P read status: ok for every pair")
    names = {gpu.name for gpu in report.gpus if gpu.name}
    if names and all(_NO_P2P_BOARD.search(name) for name in names):
        return False, f"{sorted(names)[0]}: GeForce boards have no peer-to-peer (NCCL talks through host memory, SHM)"
    return None, "neither NVML's P2P status nor the GPU model says whether the GPUs have peer-to-peer access"
