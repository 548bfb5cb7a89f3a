"""The NVLink fabric registration of a GPU, as NVML's nvmlGpuFabricInfo says it: on NVSwitch systems Fabric Manager
registers each GPU, and CUDA refuses work until that completes. dump_fabric() asks NVML (src/nodecheck/probes/nvml.py calls it for
each GPU), parse_fabric() turns its answer into facts."""

from __future__ import annotations

import ctypes

from nodecheck.core.errors import ParseError
from nodecheck.core.units import is_int
from nodecheck.probes.nvml_calls import ask_struct

# NVML_GPU_FABRIC_STATE_* 0..3, in this order
FABRIC_STATES = ("not_supported", "not_started", "in_progress", "completed")
# nvmlGpuFabricInfo structures nodecheck asks for, newest first: a driver older than one answers "Argument
# version mismatch" (or lacks nvmlDeviceGetGpuFabricInfoV), and the next is tried
FABRIC_INFO_STRUCTS = ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t")
_NVML_FUNCTION_NOT_FOUND, _NVML_ARGUMENT_VERSION_MISMATCH = 13, 25


def dump_fabric(pynvml, handle, error_string) -> dict:
    """The GPU's registration with the NVLink fabric, as nvmlGpuFabricInfo says it: on NVSwitch systems Fabric
    Manager registers each GPU, and CUDA refuses work until that completes. {"error": ...} where NVML refuses
    (a GPU without the fabric may answer Not Supported, or the state not_supported)."""
    asks = [(getattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", None), getattr(pynvml, name, None))
            for name in FABRIC_INFO_STRUCTS]
    asks.append((getattr(pynvml, "nvmlDeviceGetGpuFabricInfo", None), getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)))
    answer = {"error": "not in this nvidia-ml-py"}
    for ask, struct in asks:
        if ask is None or struct is None:
            continue
        info = struct()
        try:
            ask(handle, ctypes.byref(info))  # pynvml passes it on as it is: by reference, as NVML writes into it
        except pynvml.NVMLError as error:
            if getattr(error, "value", None) in (_NVML_FUNCTION_NOT_FOUND, _NVML_ARGUMENT_VERSION_MISMATCH):
                answer = {"error": f"not in this driver ({error})"}
                continue  # an older driver: ask with the older structure
            return {"error": str(error)}
        status = int(info.status)
        return {
            "state": int(info.state) & 0xFF,  # an unsigned char in NVML's header, a wider field in some bindings
            "status": status,
            "status_text": "Success" if status == 0 else error_string(status),
            "clique_id": int(info.cliqueId),
            "cluster_uuid": bytes(info.clusterUuid).hex(),
            "health_mask": int(info.healthMask) if hasattr(info, "healthMask") else None,
            "health_summary": int(info.healthSummary) if hasattr(info, "healthSummary") else None,
        }
    return answer


def dump_bw_mode(pynvml, handle) -> dict:
    """The NVLink bandwidth mode a Blackwell GPU runs in (nvmlDeviceGetNvlinkBwMode: Blackwell sets the reduced
    bandwidth mode per GPU, where Hopper sets one for the node): {"best": 1 when it is the GPU's best mode, "mode":
    the mode's number}, or {"error": ...} (Not Supported before Blackwell)."""
    mode = ask_struct(pynvml, "nvmlDeviceGetNvlinkBwMode", "c_nvmlNvlinkGetBwMode_v1_t", handle)
    return mode if isinstance(mode, dict) else {"best": int(mode.bIsBest), "mode": int(mode.bwMode)}


def reduced_bw_mode(raw) -> int | None:
    """The mode number of a GPU NVML says runs below its best NVLink bandwidth mode; None at its best, or unsaid."""
    if isinstance(raw, dict) and raw.get("best") == 0 and is_int(raw.get("mode")) and 0 <= raw["mode"] < 256:
        return raw["mode"]
    return None


# NVML's answers that mean the GPU has no fabric to register with, and those that mean nodecheck cannot ask
_FABRIC_NOT_SUPPORTED = ("Not Supported",)
_FABRIC_NOT_ASKED = ("not in this driver", "not in this nvidia-ml-py")


# nvmlGpuFabricInfo's health mask, NVML_GPU_FABRIC_HEALTH_MASK_*: (shift, the value that raises it, its name)
_FABRIC_CONDITIONS = ((0, 1, "bandwidth degraded"), (2, 1, "route recovery in progress"), (4, 1, "route unhealthy"),
                      (6, 1, "access timeout recovery in progress"), (14, 2, "global fabric manager disconnected"))
_INCORRECT_CONFIGURATION = {2: "incorrect system GUID", 3: "incorrect chassis serial number", 4: "no partition",
                            5: "insufficient NVLinks", 6: "incompatible GPU firmware", 7: "invalid location",
                            8: "GPU state invalid"}  # 4 bits at shift 8; 0 not supported, 1 none
_FABRIC_SUMMARY = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*; 0 not said


def health_conditions(mask: int) -> list[str]:
    """The conditions a GPU's fabric health mask raises (NVML_GPU_FABRIC_HEALTH_MASK_*: two bits each, 1 raised, 2
    not; 0 not reported; four bits of incorrect configuration at shift 8): 0xaa, every condition "not", is healthy."""
    health = [name for shift, raised, name in _FABRIC_CONDITIONS if (mask >> shift) & 0x3 == raised]
    incorrect = _INCORRECT_CONFIGURATION.get((mask >> 8) & 0xF)
    return health + ([f"incorrect configuration: {incorrect}"] if incorrect else [])


def parse_fabric(index: int, refused: str | None, raw: dict | None) -> dict | None:
    """{state, status, clique_id, cluster_uuid, health_summary, health} from a dump_fabric() answer: the state
    by name (FABRIC_STATES, or "unknown (N)"); the status (NVML's words) only once the state is completed, as
    NVML documents it; the cluster UUID None when all zero (an NVSwitch node outside a multi-node NVLink domain);
    health the conditions the mask raises. "unreadable" (status: NVML's error) where NVML refused for another
    reason than Not Supported; None where it could not be asked (a driver without the call, an older dump)."""
    if raw is None:
        if refused is None or any(words.lower() in refused.lower() for words in _FABRIC_NOT_ASKED):
            return None
        if any(words.lower() in refused.lower() for words in _FABRIC_NOT_SUPPORTED):
            return {"state": "not_supported"}
        return {"state": "unreadable", "status": refused[:120]}  # NVML failed: the state is unknown, not healthy
    values = {name: raw.get(name) for name in ("state", "status", "clique_id", "health_mask", "health_summary")}
    if not all(value is None or is_int(value) and 0 <= value < 1 << 32 for value in values.values()) \
            or values["state"] is None:
        raise ParseError(f"NVML dump: gpu {index} fabric is {raw!r:.120}, expected unsigned integers")
    uuid, text = raw.get("cluster_uuid"), raw.get("status_text")
    if uuid is not None and not (isinstance(uuid, str) and len(uuid) == 32 and all(c in "0123456789abcdef" for c in uuid)):
        raise ParseError(f"NVML dump: gpu {index} fabric cluster_uuid is {uuid!r:.60}, expected 32 hex digits")
    state = values["state"]
    named = FABRIC_STATES[state] if state < len(FABRIC_STATES) else f"unknown ({state})"
    status = None
    if named == "completed" and values["status"] is not None:
        status = "Success" if values["status"] == 0 else text[:80] if isinstance(text, str) and text else f"NVML error {values['status']}"
    health = health_conditions(values["health_mask"] or 0)
    return {"state": named, "status": status, "clique_id": values["clique_id"],
            "cluster_uuid": "-".join((uuid[:8], uuid[8:12], uuid[12:16], uuid[16:20], uuid[20:])) if uuid and uuid.strip("0") else None,
            "health_summary": _FABRIC_SUMMARY.get(values["health_summary"]), "health": health}
