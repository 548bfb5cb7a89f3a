"""A stand-in for pynvml that replays values read through NVML on a real H100 node
(../shared/captures/h100-pcie-vm/nvml.json). Used only where no GPU exists; values that NVML
refused on that node ("ERR ...") are raised as the NVMLError NVML raised."""

from __future__ import annotations

import ctypes
import types


class NVMLError(Exception):
    value = 999  # NVML_ERROR_UNKNOWN; the subclasses below carry their own code, as pynvml's do


class NVMLError_NotSupported(NVMLError):
    value = 3


class NVMLError_FunctionNotFound(NVMLError):
    value = 13


class NVMLError_GpuIsLost(NVMLError):
    value = 15


class NVMLError_NoPermission(NVMLError):
    value = 4


class NVMLError_CorruptedInforom(NVMLError):
    value = 14


class NVMLError_LibraryNotFound(NVMLError):
    pass


def _value(raw):
    """raw, or the NVMLError a capture's "ERR ..." names: Not Supported unless it says Unknown Error or GPU is lost."""
    if isinstance(raw, str) and raw.startswith("ERR"):
        if "Unknown Error" in raw:
            raise NVMLError("Unknown Error")
        if "GPU is lost" in raw:
            raise NVMLError_GpuIsLost("GPU is lost")
        raise NVMLError_NotSupported("Not Supported")
    return raw


def _p2p_status(a: dict, b: dict, caps: int):
    """The pair's status: the graver of what either GPU's "p2p_read" gives (0 OK)."""
    said = [g["p2p_read"] for g in (a, b) if "p2p_read" in g]
    return _value(max(said) if said else "ERR")


def _handle(gpus: dict):
    """nvmlDeviceGetHandleByIndex: a GPU given as an NVMLError is one NVML counts and refuses to open, as it refuses a
    GPU that fell off the bus (GPU is lost) or failed to initialise (Unknown Error)."""
    def handle(index):
        if isinstance(gpus[index], Exception):
            raise gpus[index]
        return gpus[index]

    return handle


def _memory_info(h, version=None):
    """nvmlDeviceGetMemoryInfo: v1 counts the driver's reservation as used, v2 keeps it apart; the H100's `nvidia-smi
    -q` says "Reserved: 480 MiB, Used: 0 MiB" ("memory_used" and "memory_reserved" give others)."""
    total = _value(h.get("memory_total", "ERR"))
    used, reserved = h.get("memory_used", 0), h.get("memory_reserved", 480 << 20)
    if version is None:
        return types.SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)
    return types.SimpleNamespace(version=version, total=total, reserved=reserved, used=used, free=total - used - reserved)


def _processes(h, graphics: bool):
    listed = _value(h.get("processes", []))
    return [types.SimpleNamespace(pid=p["pid"], usedGpuMemory=p.get("used_memory"), gpuInstanceId=0xFFFFFFFF,
                                  computeInstanceId=0xFFFFFFFF) for p in listed if p.get("graphics", False) == graphics]


def replaying(captured: list[dict], driver: str = "580.159.04", fail_init: Exception | None = None,
              nvlink_bw_mode: int | str = "ERR"):
    """A module object with the pynvml functions dump_nvml() calls, answering from `captured`; the node's NVLink
    bandwidth mode as nvmlSystemGetNvlinkBwMode returns it (NVML_GPU_NVLINK_BW_MODE_*), else Not Supported."""
    m = types.SimpleNamespace(NVMLError=NVMLError, NVML_NVLINK_MAX_LINKS=18)
    gpus = {i: g for i, g in enumerate(captured)}

    def init():
        if fail_init:
            raise fail_init

    m.nvmlInit, m.nvmlShutdown = init, lambda: None
    m.nvmlSystemGetDriverVersion = lambda: driver
    m.nvmlSystemGetCudaDriverVersion = lambda: 13000
    m.nvmlSystemGetNvlinkBwMode = lambda: _value(nvlink_bw_mode)
    # each GPU's "p2p_read": its nvmlGpuP2PStatus_t toward every peer (0 OK); else Not Supported, as no capture says it
    m.nvmlDeviceGetP2PStatus = _p2p_status
    m.NVML_P2P_CAPS_INDEX_READ = 0
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = _handle(gpus)
    m.nvmlDeviceGetName = lambda h: h["name"]
    m.nvmlDeviceGetVbiosVersion = lambda h: _value(h.get("vbios", "ERR"))
    m.nvmlDeviceGetArchitecture = lambda h: _value(h.get("arch", "ERR"))
    m.nvmlDeviceGetUUID = lambda h: h["uuid"]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h["pci"])
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: _value(h["gen"])
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: _value(h["maxgen"])
    m.nvmlDeviceGetGpuMaxPcieLinkGeneration = lambda h: _value(h["gpumaxgen"])
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: _value(h["width"])
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: _value(h["maxwidth"])
    m.nvmlDeviceGetPcieSpeed = lambda h: _value(h["pcie_speed"])
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=h.get("util", 0), memory=0)
    m.nvmlDeviceGetMemoryInfo = _memory_info
    m.nvmlMemory_v2 = 0x02000028
    # the processes holding the GPU: none, as the H100's `nvidia-smi -q` says (<processes></processes>), unless a test
    # gives others ({pid, used_memory (None: NVML's "not available"), graphics}); objects as pynvml returns them
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: _processes(h, graphics=False)
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: _processes(h, graphics=True)
    m.nvmlDeviceGetNumaNodeId = lambda h: _value(h["numa"])
    m.nvmlDeviceGetEccMode = lambda h: _value(h["ecc_mode"])
    m.nvmlDeviceGetRemappedRows = lambda h: tuple(_value(h["retired"]))
    # like pynvml: a ctypes array of unsigned longs, and a tuple for the remapped rows
    m.nvmlDeviceGetCpuAffinity = lambda h, n: (ctypes.c_ulonglong * n)(*_value(h["cpuaff"])[:n])

    def nvlink(h, link, field):
        links = {entry[0]: entry[1:] for entry in h["nvlink"]}
        if link not in links:
            raise NVMLError_NotSupported("Not Supported")
        raw = links[link]
        return _value(raw[0] if field == "state" else raw[1] if len(raw) > 1 else "ERR")

    m.nvmlDeviceGetNvLinkState = lambda h, link: nvlink(h, link, "state")
    m.nvmlDeviceGetNvLinkVersion = lambda h, link: nvlink(h, link, "version")

    # each active link's far end, {link: (bus id, NVML_NVLINK_DEVICE_TYPE_*)}, where a test gives it (no capture has
    # it: Not Supported, as an older driver answers)
    def remote(h, link, part):
        said = h.get("nvlink_remote", {}).get(link)
        if said is None:
            raise NVMLError_NotSupported("Not Supported")
        return types.SimpleNamespace(busId=said[0].encode()) if part == 0 else _value(said[1])

    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: remote(h, link, 0)
    m.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: remote(h, link, 1)
    # error signals: the capture's PCIe replay counter (0 on that node); clock event reasons and volatile
    # uncorrectable ECC as its `nvidia-smi -q` says them (every reason "Not Active": 0; DRAM Uncorrectable 0)
    # unless a test gives others; NVLink error counters per link as NVML returns them (an int per counter)
    m.nvmlDeviceGetPcieReplayCounter = lambda h: _value(h.get("replay", "ERR"))
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: _value(h.get("clock_reasons", 0))
    m.nvmlDeviceGetTotalEccErrors = lambda h, error_type, counter_type: _value(h.get("ecc_volatile_uncorrected", 0))

    def nvlink_error(h, link, counter):
        counts = h.get("nvlink_errors", {}).get(link)
        if counts is None:
            raise NVMLError_NotSupported("Not Supported")
        return _value(counts[counter])

    m.nvmlDeviceGetNvLinkErrorCounter = nvlink_error
    # the power limit in force and the default, in mW: 700 W both, as the H100's `nvidia-smi -q` says them
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: _value(h.get("power_limit", 700000))
    m.nvmlDeviceGetPowerManagementDefaultLimit = lambda h: _value(h.get("power_limit_default", 700000))
    # MIG mode [current, pending] as pynvml returns it: off and off, as the H100's `nvidia-smi -q` says ("MIG Mode
    # Current: Disabled, Pending: Disabled"), unless a test gives another ("ERR": a GPU without MIG)
    m.nvmlDeviceGetMigMode = lambda h: list(_value(h.get("mig", [0, 0])))
    # persistence mode: on, as the H100's `nvidia-smi -q` says ("Persistence Mode: Enabled"), unless a test gives another
    m.nvmlDeviceGetPersistenceMode = lambda h: _value(h.get("persistence", 1))
    # compute mode: default (0), as the H100's `nvidia-smi -q` says ("Compute Mode: Default"), unless a test gives another
    m.nvmlDeviceGetComputeMode = lambda h: _value(h.get("compute_mode", 0))
    _fabric_calls(m)
    _field_values(m)
    _memory_calls(m)
    return m


def _memory_calls(m) -> None:
    """The SRAM error status, retired pages and InfoROM check, as the captured H100's `nvidia-smi -q` says them: "SRAM
    Threshold Exceeded: No" and every SRAM uncorrectable count 0 (nvidia-ml-py's own structure, filled as NVML fills
    it), "Retired Pages: N/A" (Not Supported: an H100 remaps rows), and no InfoROM warning. A GPU's "sram" {field:
    value}, "retired_pages" {"sbe": n, "dbe": n} (NVML returns that many page addresses), "retired_pending" (0 or 1)
    and "inforom" ("corrupted", or an exception to raise) give other answers; "ERR" is Not Supported."""
    import pynvml as real

    m.c_nvmlEccSramErrorStatus_v1_t = real.c_nvmlEccSramErrorStatus_v1_t

    def sram(h, pointer):
        answer = h.get("sram", {})
        if answer == "ERR" or isinstance(answer, Exception):
            raise answer if isinstance(answer, Exception) else NVMLError_NotSupported("Not Supported")
        for key, value in answer.items():
            setattr(pointer._obj, key, value)

    def retired(h, cause):
        pages = _value(h.get("retired_pages", "ERR"))
        return [0x1000 * (i + 1) for i in range(pages["sbe" if cause == 0 else "dbe"])]

    def inforom(h):
        answer = h.get("inforom")
        if answer == "corrupted":
            raise NVMLError_CorruptedInforom("Corrupted infoROM")
        if isinstance(answer, Exception):
            raise answer

    m.nvmlDeviceGetSramEccErrorStatus = sram
    m.nvmlDeviceGetRetiredPages = retired
    m.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: _value(h.get("retired_pending", "ERR"))
    m.nvmlDeviceValidateInforom = inforom


def _fabric_calls(m) -> None:
    """nvmlDeviceGetGpuFabricInfoV and the older nvmlDeviceGetGpuFabricInfo. A GPU's "fabric" is None (NVML says
    Not Supported, as nvidia-smi's N/A on the captured H100 PCIe node), an exception to raise, or the values
    NVML writes: state, status, cliqueId, clusterUuid (16 bytes), healthMask, healthSummary. "fabric_api": "v1"
    is a driver from before nvmlDeviceGetGpuFabricInfoV. The structures are nvidia-ml-py's own (importing it
    needs no GPU), so the probe reads what it will read on a node."""
    import pynvml as real

    for name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t", "c_nvmlGpuFabricInfo_t"):
        setattr(m, name, getattr(real, name))

    def fill(h, pointer, versioned):
        info = pointer._obj  # the caller passes ctypes.byref(structure), as NVML writes into it
        if versioned and h.get("fabric_api") == "v1":
            raise NVMLError_FunctionNotFound("Function Not Found")
        fabric = h.get("fabric")
        if fabric is None:
            raise NVMLError_NotSupported("Not Supported")
        if isinstance(fabric, Exception):
            raise fabric
        for key, value in fabric.items():
            if key == "clusterUuid":
                info.clusterUuid[:] = list(value)
            elif hasattr(info, key):
                setattr(info, key, value)

    m.nvmlDeviceGetGpuFabricInfoV = lambda h, info: fill(h, info, True)
    m.nvmlDeviceGetGpuFabricInfo = lambda h, info: fill(h, info, False)
    # Blackwell's per-GPU NVLink bandwidth mode: a GPU's "bw_mode" {"bIsBest": 0 or 1, "bwMode": n}; without one,
    # Not Supported, as NVML answers before Blackwell
    m.c_nvmlNvlinkGetBwMode_v1_t = real.c_nvmlNvlinkGetBwMode_v1_t

    def bw_mode(h, pointer):
        if h.get("bw_mode") is None:
            raise NVMLError_NotSupported("Not Supported")
        for key, value in h["bw_mode"].items():
            setattr(pointer._obj, key, value)

    m.nvmlDeviceGetNvlinkBwMode = bw_mode
    m.nvmlErrorString = lambda code: {3: b"Not Supported", 23: b"Insufficient Resources"}.get(code, b"Unknown Error")


def _field_values(m) -> None:
    """nvmlDeviceGetFieldValues for the recovery action: 0 ("GPU Recovery Action: None" in the H100's `nvidia-smi -q`)
    unless a test gives a GPU's "recovery": another value, or "ERR" for a driver that does not know the field (NVML
    then sets that field's nvmlReturn to Not Supported, and the call succeeds); and for a link's state
    (NVML_FI_DEV_NVLINK_GET_STATE, scoped to the link) from a GPU's "nvlink_field_state" {link: value}, else Not
    Supported; the GPU's NVLink count from its "nvlink_count", else Not Supported (no capture says it); its NVLink
    speed (MB/s) from its "nvlink_speed", else Not Supported; Blackwell's
    NVLink 5 counters summed over its links (scope UINT_MAX) from its "nvlink5" {name: count}, else Not Supported,
    as a GPU before Blackwell answers; its NVLink-C2C links from its "c2c" [(status, MB/s[, power state]) per
    link], else Not Supported, as a PCIe GPU answers (and a power state not given); its clock event counters (ns) from
    its "clock_event_ns" {reason: ns}, else 0 each, as the H100's `nvidia-smi -q` says them ("Clocks Event Reasons
    Counters": 0 us each on driver 580; "ERR": a driver without the fields). nvidia-ml-py's own structure."""
    import pynvml as real

    from nodecheck.probes.nvml_clock_events import CLOCK_EVENT_COUNTERS
    from nodecheck.probes.nvml_nvlink5 import ALL_LINKS, NVLINK5_COUNTERS

    for name in ("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "NVML_FI_DEV_NVLINK_GET_STATE", "NVML_FI_DEV_NVLINK_LINK_COUNT",
                 "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON",
                 "NVML_VALUE_TYPE_UNSIGNED_INT", "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "c_nvmlFieldValue_t",
                 "NVML_FI_DEV_C2C_LINK_COUNT", "NVML_FI_DEV_C2C_LINK_GET_STATUS", "NVML_FI_DEV_C2C_LINK_GET_MAX_BW",
                 "NVML_FI_DEV_C2C_LINK_POWER_STATE",
                 *NVLINK5_COUNTERS.values(), *CLOCK_EVENT_COUNTERS.values()):
        setattr(m, name, getattr(real, name))  # `real` may be an earlier stand-in, which copied them too
    nvlink5 = {getattr(m, field): name for name, field in NVLINK5_COUNTERS.items()}
    clocks = {getattr(m, field): name for name, field in CLOCK_EVENT_COUNTERS.items()}

    def answer_for(h, field_id, scope):
        if field_id == m.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            return h.get("recovery", 0)
        if field_id == m.NVML_FI_DEV_NVLINK_GET_STATE:
            return h.get("nvlink_field_state", {}).get(scope, "ERR")
        if field_id == m.NVML_FI_DEV_NVLINK_LINK_COUNT:
            return h.get("nvlink_count", "ERR")
        if field_id == m.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON:
            return h.get("nvlink_speed", "ERR")
        if field_id in nvlink5 and scope == ALL_LINKS:
            return h.get("nvlink5", {}).get(nvlink5[field_id], "ERR")
        if field_id in clocks:
            said = h.get("clock_event_ns", {})
            return said if said == "ERR" else said.get(clocks[field_id], 0)
        c2c = h.get("c2c")  # [(status, MB/s) or (status, MB/s, power state) per link]
        if c2c is not None and field_id == m.NVML_FI_DEV_C2C_LINK_COUNT:
            return len(c2c)
        fields = (m.NVML_FI_DEV_C2C_LINK_GET_STATUS, m.NVML_FI_DEV_C2C_LINK_GET_MAX_BW, m.NVML_FI_DEV_C2C_LINK_POWER_STATE)
        if c2c is not None and field_id in fields and scope < len(c2c):
            said = c2c[scope]
            return said[fields.index(field_id)] if fields.index(field_id) < len(said) else "ERR"
        return "ERR"

    def ask(h, field_ids):
        values = (m.c_nvmlFieldValue_t * len(field_ids))()
        for value, asked in zip(values, field_ids, strict=True):
            field_id, scope = asked if isinstance(asked, tuple) else (asked, 0)
            value.fieldId, value.scopeId = field_id, scope
            answer = answer_for(h, field_id, scope)
            if answer == "ERR":
                value.nvmlReturn = NVMLError_NotSupported.value
            elif field_id in nvlink5 or field_id in clocks:  # these counters come as unsigned long longs
                value.valueType, value.value.ullVal = m.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, answer
            else:
                value.valueType, value.value.uiVal = m.NVML_VALUE_TYPE_UNSIGNED_INT, answer
        return values

    m.nvmlDeviceGetFieldValues = ask
