"""Whether each pair of GPUs may read each other's memory directly (nvmlDeviceGetP2PStatus with
NVML_P2P_CAPS_INDEX_READ; `nvidia-smi topo -p2p r` prints the same matrix). Without it NCCL and CUDA copies between
the two go through host memory: a staged path, half or less of the link (GeForce cards, P2P disabled, an IOMMU or a
chipset that refuses it)."""

from __future__ import annotations

from nodecheck.core.limits import MAX_GPUS
from nodecheck.core.units import is_int

# nvmlGpuP2PStatus_t, in NVML's words (`nvidia-smi topo -p2p r`'s legend: OK, CNS, GNS, TNS, NS, U)
P2P_STATUS = {0: "ok", 1: "chipset not supported", 2: "GPU not supported", 3: "topology not supported",
              4: "disabled by regkey", 5: "not supported", 6: "unknown"}
P2P_CAPS_INDEX_READ = 0  # NVML_P2P_CAPS_INDEX_READ


def dump_p2p(pynvml, count: int, ask) -> list | dict:
    """[[a, b, status], ...] for every pair a < b whose handles open; {"error": ...} where this nvidia-ml-py has no
    such call."""
    call = getattr(pynvml, "nvmlDeviceGetP2PStatus", None)
    if call is None:
        return {"error": "not in this nvidia-ml-py"}
    handles = {}
    for index in range(min(count, MAX_GPUS)):
        try:
            handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError:
            continue  # a GPU NVML cannot open: the GPU record says why
    caps = getattr(pynvml, "NVML_P2P_CAPS_INDEX_READ", P2P_CAPS_INDEX_READ)
    return [[a, b, ask(pynvml, call, handles[a], handles[b], caps)] for a in handles for b in handles if a < b]


def parse_p2p(raw) -> dict[tuple[int, int], str] | None:
    """(a, b) with a < b -> NVML's status in words; None where NVML did not say (an older snapshot, no such call)."""
    if not isinstance(raw, list):
        return None
    said = {}
    for entry in raw[: MAX_GPUS * MAX_GPUS]:
        if isinstance(entry, list) and len(entry) == 3 and all(is_int(v) for v in entry) and 0 <= entry[0] < entry[1] < MAX_GPUS:
            said[(entry[0], entry[1])] = P2P_STATUS.get(entry[2], "unknown")  # NVML's refusal ({"error"}) says nothing
    return said or None
