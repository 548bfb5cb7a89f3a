"""The NVLinks each GPU should have up. NVML lists every NVLink slot of the chip and answers NVML_FEATURE_DISABLED
for a slot no bridge is wired to as for a link that went down, so what should be up comes from elsewhere: the config,
`nvidia-smi topo -m`'s NV# pairs, the board, the GPU's siblings. Read by the NVLink check, the exporter and the
bench's bounds. Pure."""

from __future__ import annotations

from collections import Counter

from nodecheck.config import Config
from nodecheck.core.link_types import nvlink_count
from nodecheck.core.specs import nvlink_board
from nodecheck.report.model import Report


def active_links(gpu) -> int:
    return sum(1 for link in gpu.nvlinks if link["active"])


def nvlink_pairs(report: Report) -> dict[tuple[int, int], str]:
    """GPU pair (lower index first) -> its `nvidia-smi topo -m` link type (NV18, SYS ...)."""
    return {tuple(sorted((l.a, l.b))): l.type for l in report.links if isinstance(l.a, int) and isinstance(l.b, int)}


def pair_nvlinks(pairs: dict[tuple[int, int], str], index: int) -> int:
    """The NVLinks of GPU `index` summed over its NV# pairs (an NVSwitch board's NV18 to each peer sums past its slots)."""
    return sum(_pair_counts(pairs, index))


def _pair_counts(pairs: dict[tuple[int, int], str], index: int) -> list[int]:
    """The NV# count of each pair GPU `index` is in (0 for a pair that is not NVLink)."""
    return [nvlink_count(t) or 0 for (a, b), t in pairs.items() if index in (a, b)]


def gpu_nvlinks_of_pairs(pairs: dict[tuple[int, int], str], index: int, slots: int) -> int:
    """How many NVLinks `nvidia-smi topo -m`'s NV# pairs give GPU `index`, of the `slots` NVML lists: their sum on a mesh
    of direct links (a DGX-1's NV1 and NV2 pairs, four H100 at NV6 each); on an NVSwitch board, where every pair reads
    all of the GPU's links (NV18 to each of seven peers on HGX H100, NV8 on H800 and A800 boards: NVIDIA/nccl#933),
    so that their sum passes the slots, the largest pair's."""
    counts = _pair_counts(pairs, index)
    return sum(counts) if sum(counts) <= slots else min(slots, max(counts))


def wired_nvlinks(report: Report, config: Config) -> dict[int, tuple[int, str]]:
    """GPU index -> (how many of its NVLinks should be up, what says so), for the GPUs something says it of. NVML
    lists every NVLink slot of the chip and answers NVML_FEATURE_DISABLED for a slot no bridge is wired to as for a
    link that went down (an H100 NVL with its 3 bridges uses 12 of 18; an A100 PCIe without a bridge lists 12, all
    down), so a down slot is a fault only where something says it should be up: [gpus] nvlinks_per_gpu; the NV# pairs
    of the config's [links] or of `nvidia-smi topo -m` (at most the slots NVML lists); the board's bridges, once one
    of its links is up (specs.toml [[nvlink_boards]]); the most any sibling of the same model has up, unless the
    board is a bridged card with none up (a card without a bridge is no fault). A GPU nothing links by NVLink, and a
    one-GPU VM whose NVLink peers are outside it, get no entry."""
    pairs = nvlink_pairs(report)
    by_model: dict[str, list[tuple[int, int]]] = {}  # model -> (active links, index), most first
    for gpu in report.gpus:
        if gpu.name and not gpu.mig_enabled:
            by_model.setdefault(gpu.name, []).append((active_links(gpu), gpu.index))
    for siblings in by_model.values():
        siblings.sort(key=lambda s: (-s[0], s[1]))
    wired = {}
    for gpu in report.gpus:
        if gpu.mig_enabled:
            continue
        slots, active, said = len(gpu.nvlinks), active_links(gpu), []
        if config.nvlinks_per_gpu:
            said.append((config.nvlinks_per_gpu, "[gpus] nvlinks_per_gpu"))
        for links, where in ((config.links, "the config's [links]"), (pairs, "`nvidia-smi topo -m`")):
            total = gpu_nvlinks_of_pairs(links, gpu.index, slots)
            if total and slots:
                said.append((total, f"{where} NV# pairs"))
        board = nvlink_board(gpu.name)
        bridged = (board or {}).get("bridged_links")
        if bridged and active:
            said.append((min(bridged, slots or bridged), f"its board's {bridged} bridged links"))
        sibling, by = next((s for s in by_model.get(gpu.name or "", []) if s[1] != gpu.index), (0, -1))  # another's most
        if sibling and not (bridged and not active):
            said.append((min(sibling, slots or sibling), f"gpu{by}, a sibling of the same model, has {sibling} up"))
        if said:
            wired[gpu.index] = max(said)
    return wired


def usual_nvlinks(report: Report) -> dict[str, int]:
    """GPU model -> the number of NVLinks NVML lists for most of the node's GPUs of that model (more than half of
    them, MIG aside): what each of them should list."""
    counts: dict[str, Counter] = {}
    for gpu in report.gpus:
        if gpu.name and not gpu.mig_enabled:
            counts.setdefault(gpu.name, Counter())[len(gpu.nvlinks)] += 1
    return {name: links for name, c in counts.items() for links, n in c.most_common(1) if n * 2 > sum(c.values())}
