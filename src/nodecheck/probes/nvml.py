"""NVML (nvidia-ml-py, imported as pynvml): per GPU identity, PCIe link state, NVLink state, NUMA node, ECC and
remapped rows, NVLink fabric registration (src/nodecheck/probes/nvml_fabric.py), NVLink-C2C (probes/nvml_c2c.py), driver version;
and the error signals: the PCIe replay counter, NVLink error counters (Blackwell's NVLink 5 counters:
probes/nvml_nvlink5.py), clock event reasons, volatile uncorrectable ECC errors, the recovery action the driver
asks for.

dump_nvml() is the thin reader: it asks NVML and returns plain JSON-able values, each either the
value or {"error": "..."}; a snapshot stores exactly this. parse_nvml() turns it into facts. A GPU NVML counts but
cannot open is recorded as such, and the others are read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from nodecheck.core.errors import NO_DRIVER, NoData, ParseError, ProbeFailed
from nodecheck.core.limits import MAX_GPUS, MAX_NVLINK_MBPS, MAX_NVLINKS
from nodecheck.core.units import format_cpulist, is_int, mask_words_to_cpus
from nodecheck.probes.base import Probe
from nodecheck.probes.nvml_c2c import dump_c2c, parse_c2c
from nodecheck.probes.nvml_calls import as_text, ask_counters
from nodecheck.probes.nvml_clock_events import dump_clock_events, parse_clock_events
from nodecheck.probes.nvml_fabric import dump_bw_mode, dump_fabric, parse_fabric, reduced_bw_mode
from nodecheck.probes.nvml_memory import dump_memory, parse_memory
from nodecheck.probes.nvml_nvlink5 import dump_nvlink5, parse_nvlink5
from nodecheck.probes.nvml_nvlink_remote import dump_remote, parse_remotes
from nodecheck.probes.nvml_p2p import dump_p2p, parse_p2p
from nodecheck.probes.nvml_processes import describe_owners, dump_memory_used, dump_processes, parse_memory_used, parse_processes

SOURCE = "nvml.json"
MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC = 1, 0  # nvmlMemoryErrorType_t, nvmlEccCounterType_t
# nvmlNvLinkErrorCounter_t 0..3, in this order
NVLINK_ERROR_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")
NVLINK_STATE_SLEEP = 2  # NVML_FI_DEV_NVLINK_GET_STATE's NVML_NVLINK_STATE_SLEEP
BLACKWELL = 10  # NVML_DEVICE_ARCH_BLACKWELL
NVLINK_BW_MODES = ("FULL", "OFF", "MIN", "HALF", "3QUARTER")  # NVML_GPU_NVLINK_BW_MODE_* 0..4
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}  # NVML_COMPUTEMODE_*


def collect(host, timeout: float) -> "NvmlFacts":
    facts = parse_nvml(host.nvml(timeout, dump_nvml))  # pynvml is imported only when NVML is asked
    # who holds each GPU, as /proc says (read through host: a snapshot keeps it)
    describe_owners(host, [p for gpu in facts.gpus for p in gpu.processes or []], facts.asked_by_pid)
    return facts


PROBE = Probe("nvml", collect, 15.0)

# NVML error class names that mean "there is no NVIDIA GPU stack here", not "it is broken".
_ABSENT = ("LibraryNotFound", "DriverNotLoaded", "NoPermission")


def dump_nvml() -> dict:
    try:
        import pynvml
    except ImportError:
        raise NoData("nvidia-ml-py (pynvml) is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        if any(name in type(error).__name__ for name in _ABSENT):
            raise NoData(f"{NO_DRIVER}: {error}") from None
        raise ProbeFailed(f"NVML initialisation failed: {error}") from None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if not 0 <= count <= MAX_GPUS:  # a confused driver must not make us ask for millions of handles
            raise ProbeFailed(f"NVML reports {count} GPUs: more than a node has (at most {MAX_GPUS} accepted)")
        return {
            "driver_version": _ask(pynvml, pynvml.nvmlSystemGetDriverVersion),
            "cuda_driver_version": _ask(pynvml, pynvml.nvmlSystemGetCudaDriverVersion),
            # the node's NVLink bandwidth mode (Hopper: FULL, OFF, MIN, HALF, 3QUARTER; `nvidia-smi nvlink -sBwMode`):
            # below FULL, peer-to-peer over NVLink uses fewer links while every link reads active
            "nvlink_bw_mode": _ask(pynvml, getattr(pynvml, "nvmlSystemGetNvlinkBwMode", None)),
            "gpus": [_dump_gpu_or_why(pynvml, index) for index in range(count)],
            "p2p_read": dump_p2p(pynvml, count, _ask),  # which GPU pairs may read each other directly
            "asked_by_pid": os.getpid(),  # nodecheck's own: its processes on a GPU (a bench's) are not another's
        }
    except pynvml.NVMLError as error:
        raise ProbeFailed(f"NVML: {error}") from None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _ask(pynvml, fn, *args):
    if fn is None:  # an nvidia-ml-py older than the call
        return {"error": "not in this nvidia-ml-py"}
    try:
        value = fn(*args)
    except pynvml.NVMLError as error:
        return {"error": str(error)}
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, tuple) or hasattr(value, "_length_"):  # _length_: a ctypes array
        return list(value)  # remapped rows come as a tuple, the CPU affinity as a ctypes array
    return value


def _dump_gpu_or_why(pynvml, index: int) -> dict:
    """One GPU's record; {"index", "handle_error", "handle_error_code"} for one NVML counts but cannot open: NVML counts
    a GPU that fell off the bus or failed to initialise (GPU is lost, Unknown Error) or that this user may not open
    (No Permission), and refuses its handle. The other GPUs are still read."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as error:
        code = getattr(error, "value", None)
        return {"index": index, "handle_error": str(error)[:200], "handle_error_code": code if isinstance(code, int) else None}
    return _dump_gpu(pynvml, index, handle)


def _dump_gpu(pynvml, index: int, handle) -> dict:
    pci = _ask(pynvml, pynvml.nvmlDeviceGetPciInfo, handle)
    words = max(1, ((os.cpu_count() or 64) + 63) // 64)
    utilization = _ask(pynvml, pynvml.nvmlDeviceGetUtilizationRates, handle)
    memory = _ask(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle)
    return {
        "index": index,
        "name": _ask(pynvml, pynvml.nvmlDeviceGetName, handle),
        "vbios": _ask(pynvml, getattr(pynvml, "nvmlDeviceGetVbiosVersion", None), handle),
        "architecture": _ask(pynvml, getattr(pynvml, "nvmlDeviceGetArchitecture", None), handle),
        "uuid": _ask(pynvml, pynvml.nvmlDeviceGetUUID, handle),
        "pci_bus_id": pci if isinstance(pci, dict) else as_text(pci.busId),
        "pcie_gen_current": _ask(pynvml, pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "pcie_gen_max": _ask(pynvml, pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        "pcie_gen_gpu_max": _ask(pynvml, pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle),
        "pcie_width_current": _ask(pynvml, pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        "pcie_width_max": _ask(pynvml, pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
        "pcie_speed_mts": _ask(pynvml, pynvml.nvmlDeviceGetPcieSpeed, handle),
        "utilization_gpu": utilization if isinstance(utilization, dict) else utilization.gpu,
        "memory_total_bytes": memory if isinstance(memory, dict) else memory.total,
        "numa_node": _ask(pynvml, pynvml.nvmlDeviceGetNumaNodeId, handle),
        "ecc_mode": _ask(pynvml, pynvml.nvmlDeviceGetEccMode, handle),
        "remapped_rows": _ask(pynvml, pynvml.nvmlDeviceGetRemappedRows, handle),
        "cpu_affinity_words": _ask(pynvml, pynvml.nvmlDeviceGetCpuAffinity, handle, words),
        "nvlinks": _dump_nvlinks(pynvml, handle),
        "nvlink5_errors": dump_nvlink5(pynvml, handle, lambda code: _error_text(pynvml, code)),
        "c2c": dump_c2c(pynvml, handle, lambda code: _error_text(pynvml, code)),
        # how many NVLinks the GPU says it has: recorded, not judged (benchmarks/nvml_nvlink_check.py prints it)
        "nvlink_count": _field_value(pynvml, handle, "NVML_FI_DEV_NVLINK_LINK_COUNT"),
        # its links' per-link speed, MB/s, as `nvidia-smi nvlink -s` prints it (26562 Hopper): src/nodecheck/core/specs.py reads it
        "nvlink_speed_mbps": _field_value(pynvml, handle, "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON"),
        "fabric": dump_fabric(pynvml, handle, lambda code: _error_text(pynvml, code)),
        "nvlink_bw_mode": dump_bw_mode(pynvml, handle),  # Blackwell's, per GPU (Hopper's is the node's, below)
        # error signals (src/nodecheck/checks/error_counters.py): counters since the driver loaded, and what slows the clocks now
        "pcie_replays": _ask(pynvml, getattr(pynvml, "nvmlDeviceGetPcieReplayCounter", None), handle),
        "clock_event_reasons": _ask(pynvml, getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                                    or getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None), handle),
        "clock_event_ns": dump_clock_events(pynvml, handle, lambda code: _error_text(pynvml, code)),
        "ecc_uncorrected_volatile": _ask(pynvml, getattr(pynvml, "nvmlDeviceGetTotalEccErrors", None), handle,
                                         MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC),
        # the power limit in force and the board's default, in milliwatts: one lowered (`nvidia-smi -pl`) keeps a
        # busy GPU on its power cap, which its peers of the same type show (nodecheck fleet)
        "power_limit_mw": _ask(pynvml, getattr(pynvml, "nvmlDeviceGetEnforcedPowerLimit", None), handle),
        "power_limit_default_mw": _ask(pynvml, getattr(pynvml, "nvmlDeviceGetPowerManagementDefaultLimit", None), handle),
        # [current, pending], 1 = MIG on; NotSupported on GPUs without MIG. Under MIG the driver enables no NVLink
        # and CUDA has no peer-to-peer (open-gpu-kernel-modules knvlinkStateLoad: "NvLink is not supported with MIG")
        "mig_mode": _ask(pynvml, getattr(pynvml, "nvmlDeviceGetMigMode", None), handle),
        # who may hold a context (NVML_COMPUTEMODE_*: 0 default, 2 prohibited: none, 3 exclusive process: one at a time)
        "compute_mode": _ask(pynvml, getattr(pynvml, "nvmlDeviceGetComputeMode", None), handle),
        # 1 while the driver keeps the GPU initialised with no client (nvidia-persistenced; "Persistence Mode: Enabled")
        "persistence_mode": _ask(pynvml, getattr(pynvml, "nvmlDeviceGetPersistenceMode", None), handle),
        # what the driver asks before the GPU is used again, after an uncorrectable fault (NVML_GPU_RECOVERY_ACTION_*:
        # 0 none, 1 GPU reset, 2 node reboot, 3 drain peer-to-peer, 4 drain and reset ...); `nvidia-smi -q` prints
        # it as "GPU Recovery Action"
        "recovery_action": _field_value(pynvml, handle, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),
        # SRAM error status, retired pages, the InfoROM's validity (src/nodecheck/probes/nvml_memory.py)
        **dump_memory(pynvml, handle, _ask),
        # the processes holding it, and its memory in use (src/nodecheck/probes/nvml_processes.py)
        "processes": dump_processes(pynvml, handle, _ask),
        "memory_used": dump_memory_used(pynvml, handle, _ask, memory),
    }


def _field_value(pynvml, handle, name: str, scope: int | None = None):
    """One NVML field (nvmlDeviceGetFieldValues) as a count, or {"error": ...}; scope: the link a per-link field is
    asked of. NVML answers each field on its own: a driver that does not know the field answers it Not Supported,
    and the call still succeeds."""
    said = ask_counters(pynvml, handle, {"value": name}, lambda code: _error_text(pynvml, code), scope)
    return said.get("value", said)  # the call's own refusal is {"error": ...} alone


def _error_text(pynvml, code: int) -> str:
    """NVML's words for a return code it put in a structure rather than raised."""
    said = _ask(pynvml, getattr(pynvml, "nvmlErrorString", None), code)
    return said if isinstance(said, str) else f"NVML error {code}"


# NVML's answers for a link number the GPU does not have: the enumeration ends there
NO_SUCH_LINK = ("Not Supported", "Invalid Argument", "not in this nvidia-ml-py")


def no_such_link(error: object) -> bool:
    return isinstance(error, str) and any(words.lower() in error.lower() for words in NO_SUCH_LINK)


def _dump_nvlinks(pynvml, handle) -> list[dict]:
    """Each NVLink's state, version, error counters and far end, link 0 up to the first the GPU does not have. A link
    NVML answers with another error (GPU is lost) is recorded so and the next asked: stopping there passed an HGX GPU
    with five readable links of eighteen."""
    links = []
    for link in range(min(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18), MAX_NVLINKS)):
        state = _ask(pynvml, pynvml.nvmlDeviceGetNvLinkState, handle, link)
        if isinstance(state, dict):
            if no_such_link(state.get("error")):
                if link == 0:
                    links.append({"link": 0, "state": state})
                break
            links.append({"link": link, "state": state})
            continue
        version = _ask(pynvml, pynvml.nvmlDeviceGetNvLinkVersion, handle, link)
        errors = [_ask(pynvml, getattr(pynvml, "nvmlDeviceGetNvLinkErrorCounter", None), handle, link, counter)
                  for counter in range(len(NVLINK_ERROR_COUNTERS))]
        entry = {"link": link, "state": state, "version": version, "errors": errors}
        entry |= {"remote": dump_remote(pynvml, handle, link)} if state else {}  # its far end, as NCCL asks for <nvlink target>
        if state == 0:  # NVML's per-link field tells a link asleep in its low-power state from one that is down
            entry["field_state"] = _field_value(pynvml, handle, "NVML_FI_DEV_NVLINK_GET_STATE", scope=link)
        links.append(entry)
    return links


@dataclass
class NvmlGpu:
    index: int
    name: str | None = None
    vbios: str | None = None  # nvmlDeviceGetVbiosVersion: "96.00.DA.00.0C"
    uuid: str | None = None
    pci_bus_id: str | None = None
    architecture: int | None = None  # NVML_DEVICE_ARCH_*: the NVLink rate follows from it
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None  # max for this GPU in this slot
    pcie_gen_gpu_max: int | None = None  # the GPU's own max
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    utilization_gpu: int | None = None
    memory_total_bytes: int | None = None
    numa_node: int | None = None
    ecc_enabled: bool | None = None
    ecc_pending: bool | None = None  # the ECC mode the GPU takes at its next reset
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    cpu_affinity: str = ""
    nvlinks: list[tuple[int, bool | None, int | None]] = field(default_factory=list)  # (link, active, version)
    # active None: NVML failed to say the link's state (errors["nvlink"] has its words)
    nvlink_count: int | None = None  # NVML_FI_DEV_NVLINK_LINK_COUNT: the links the GPU says it has
    nvlink_speed_mbps: int | None = None  # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: its active links' per-link speed
    nvlink_remotes: dict[int, dict] = field(default_factory=dict)  # link -> {bus_id, type} at its far end (nvml_nvlink_remote)
    pcie_replays: int | None = None  # nvmlDeviceGetPcieReplayCounter, since the driver loaded
    clock_event_reasons: int | None = None  # nvmlDeviceGetCurrentClocksEventReasons: a bitmask of nvmlClocksEventReason*
    clock_event_ns: dict[str, int] | None = None  # how long each reason has slowed its clocks (parse_clock_events)
    ecc_uncorrected_volatile: int | None = None  # uncorrectable ECC errors since the last driver load or GPU reset
    # replay, recovery, crc_flit, crc_data summed over the GPU's links; on Blackwell its NVLink 5 counters
    nvlink_errors: dict[str, int] | None = None
    power_limit_mw: int | None = None  # nvmlDeviceGetEnforcedPowerLimit
    power_limit_default_mw: int | None = None  # nvmlDeviceGetPowerManagementDefaultLimit
    persistence_mode: int | None = None  # nvmlDeviceGetPersistenceMode: 1 enabled, 0 disabled
    compute_mode: int | None = None  # nvmlDeviceGetComputeMode: NVML_COMPUTEMODE_* (0 default, 2 prohibited, 3 exclusive process)
    mig_enabled: bool | None = None  # nvmlDeviceGetMigMode's current mode; None: no MIG on this GPU, or not asked
    mig_pending: bool | None = None  # the mode the GPU takes at its next reset
    recovery_action: int | None = None  # NVML_GPU_RECOVERY_ACTION_*: 0 none, else what the driver asks before reuse
    fabric: dict | None = None  # NVLink fabric registration (parse_fabric); None where NVML did not say
    c2c: dict | None = None  # {links, link_mbps}: its active NVLink-C2C links to a Grace CPU (parse_c2c)
    memory: dict = field(default_factory=dict)  # SRAM status, retired pages, InfoROM (parse_memory)
    processes: list[dict] | None = None  # {pid, type, memory_bytes} (parse_processes), + describe_owners; None: unlisted
    memory_used_bytes: int | None = None  # in use, the driver's reservation apart where NVML says it
    errors: dict[str, str] = field(default_factory=dict)  # field -> NVML's reason


@dataclass
class NvmlFacts:
    driver_version: str | None
    cuda_driver_version: int | None
    gpus: list[NvmlGpu]
    unopened: list[dict] = field(default_factory=list)  # {index, error, code}: GPUs NVML counts but cannot open
    nvlink_bw_mode: str | None = None  # NVLINK_BW_MODES; None where NVML does not say (before Hopper, older drivers)
    asked_by_pid: int | None = None  # the process that read NVML: nodecheck's own
    p2p_read: dict[tuple[int, int], str] | None = None  # (a, b) a < b -> NVML's P2P read status ("ok" ...)


def parse_nvml(dump: object) -> NvmlFacts:
    """Validate and convert a dump_nvml() document. Raises ParseError on a malformed one."""
    if not isinstance(dump, dict) or not isinstance(dump.get("gpus"), list):
        raise ParseError("NVML dump: expected an object with a 'gpus' list")
    if len(dump["gpus"]) > MAX_GPUS:
        raise ParseError(f"NVML dump: {len(dump['gpus'])} GPUs is more than a node has (at most {MAX_GPUS} accepted)")
    gpus, unopened = [], []
    for position, raw in enumerate(dump["gpus"]):
        if not isinstance(raw, dict):
            raise ParseError(f"NVML dump: gpus[{position}] is not an object")
        if "handle_error" in raw:
            unopened.append(_parse_unopened(position, raw))
        else:
            gpus.append(_parse_gpu(position, raw))
    driver = dump.get("driver_version")
    cuda = dump.get("cuda_driver_version")
    mode, own = dump.get("nvlink_bw_mode"), dump.get("asked_by_pid")
    return NvmlFacts(driver if isinstance(driver, str) else None, cuda if is_int(cuda) else None, gpus, unopened,
                     NVLINK_BW_MODES[mode] if is_int(mode) and 0 <= mode < len(NVLINK_BW_MODES) else None,
                     own if is_int(own) and 0 < own < 1 << 31 else None, parse_p2p(dump.get("p2p_read")))


def _parse_unopened(position: int, raw: dict) -> dict:
    index, error, code = raw.get("index", position), raw.get("handle_error"), raw.get("handle_error_code")
    if not is_int(index) or not isinstance(error, str) or not (code is None or is_int(code)):
        raise ParseError(f"NVML dump: gpus[{position}] is {raw!r:.120}, expected an index and NVML's reason")
    return {"index": index, "error": error[:200], "code": code}


def _parse_gpu(position: int, raw: dict) -> NvmlGpu:
    gpu = NvmlGpu(index=raw.get("index", position) if is_int(raw.get("index")) else position)
    for name in ("name", "uuid", "pci_bus_id", "vbios"):
        setattr(gpu, name, _field(gpu, raw, name, str))
    for name in ("pcie_gen_current", "pcie_gen_max", "pcie_gen_gpu_max", "pcie_width_current",
                 "pcie_width_max", "utilization_gpu", "memory_total_bytes", "architecture", "pcie_replays",
                 "clock_event_reasons", "ecc_uncorrected_volatile", "power_limit_mw", "power_limit_default_mw", "persistence_mode", "compute_mode",
                 "recovery_action", "nvlink_count", "nvlink_speed_mbps"):
        value = _field(gpu, raw, name, int)
        setattr(gpu, name, value if value is None or value >= 0 else None)
    if gpu.nvlink_speed_mbps is not None and not 0 < gpu.nvlink_speed_mbps <= MAX_NVLINK_MBPS:
        gpu.nvlink_speed_mbps = None  # 0 with no active link; past any NVLink's rate: no speed, not a spec
    numa = _field(gpu, raw, "numa_node", int)
    gpu.numa_node = numa if numa is not None and numa >= 0 else None
    mig = _field(gpu, raw, "mig_mode", list)
    if mig and len(mig) == 2 and all(v in (0, 1) and is_int(v) for v in mig):
        gpu.mig_enabled, gpu.mig_pending = bool(mig[0]), bool(mig[1])
    ecc = _field(gpu, raw, "ecc_mode", list)
    gpu.ecc_enabled = bool(ecc[0]) if ecc and is_int(ecc[0]) else None
    gpu.ecc_pending = bool(ecc[1]) if ecc and len(ecc) > 1 and is_int(ecc[1]) else None
    rows = _field(gpu, raw, "remapped_rows", list)
    if rows and len(rows) >= 4 and all(is_int(v) for v in rows[:4]):
        gpu.remapped_rows_pending, gpu.remapped_rows_failed = bool(rows[2]), bool(rows[3])
    words = _field(gpu, raw, "cpu_affinity_words", list)
    if words and all(is_int(w) and 0 <= w < 1 << 64 for w in words):
        gpu.cpu_affinity = format_cpulist(mask_words_to_cpus(words))
    gpu.nvlinks = _parse_nvlinks(gpu, raw.get("nvlinks"))
    gpu.nvlink_remotes = parse_remotes(raw.get("nvlinks"))
    # Blackwell keeps its NVLink errors in NVLink 5 counters of its own; judged there only, as DCGM does
    fifth = parse_nvlink5(raw.get("nvlink5_errors"), gpu.errors) if (gpu.architecture or 0) >= BLACKWELL else {}
    gpu.nvlink_errors = {**(_nvlink_errors(raw.get("nvlinks")) or {}), **fifth} or None
    gpu.c2c = parse_c2c(raw.get("c2c"), gpu.errors)
    gpu.clock_event_ns = parse_clock_events(raw.get("clock_event_ns"), gpu.errors)
    fabric = _field(gpu, raw, "fabric", dict)  # records NVML's refusal in gpu.errors, read next
    gpu.fabric = parse_fabric(gpu.index, gpu.errors.get("fabric"), fabric)
    if gpu.fabric is not None and (mode := reduced_bw_mode(raw.get("nvlink_bw_mode"))) is not None:
        gpu.fabric["reduced_bw_mode"] = mode
    gpu.memory = parse_memory(raw, gpu.errors)
    gpu.processes = parse_processes(raw.get("processes"), gpu.errors)
    used, reserved = parse_memory_used(raw.get("memory_used"))
    gpu.memory_used_bytes = used if reserved is not None else None  # v1's used counts the reservation in: not judged
    return gpu


def _nvlink_errors(raw) -> dict[str, int] | None:
    """Each NVLink error counter summed over the GPU's links that report it; None when none does (no NVLink,
    or an older dump)."""
    totals: dict[str, int] = {}
    for entry in raw if isinstance(raw, list) else []:
        counts = entry.get("errors") if isinstance(entry, dict) else None
        for name, value in zip(NVLINK_ERROR_COUNTERS, counts if isinstance(counts, list) else [], strict=False):
            if is_int(value) and 0 <= value < 1 << 64:
                totals[name] = totals.get(name, 0) + value
    return totals or None


def _field(gpu: NvmlGpu, raw: dict, name: str, kind: type):
    value = raw.get(name)
    if isinstance(value, dict) and "error" in value:
        gpu.errors[name] = str(value["error"])
        return None
    if value is None:
        return None
    if kind is int and not is_int(value) or kind is not int and not isinstance(value, kind):
        raise ParseError(f"NVML dump: gpu {gpu.index} {name} is {value!r}, expected {kind.__name__}")
    return value


def _parse_nvlinks(gpu: NvmlGpu, raw) -> list[tuple[int, bool | None, int | None]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_NVLINKS:
        raise ParseError(f"NVML dump: gpu {gpu.index} nvlinks is not a list of at most {MAX_NVLINKS} links")
    links = []
    for entry in raw:
        if not isinstance(entry, dict) or not is_int(entry.get("link")):
            raise ParseError(f"NVML dump: gpu {gpu.index} has a malformed nvlink entry {entry!r:.60}")
        state = entry.get("state")
        if isinstance(state, dict):
            gpu.errors["nvlink"] = str(state.get("error"))[:200]
            if not no_such_link(state.get("error")):  # NVML failed to say: the link is there, its state unknown
                links.append((entry["link"], None, None))
            continue
        if not is_int(state):
            raise ParseError(f"NVML dump: gpu {gpu.index} link {entry['link']} state is {state!r}")
        version = entry.get("version")
        # asleep (NVML_NVLINK_STATE_SLEEP): trained, idle in its low-power state, and woken by traffic
        active = state == 1 or entry.get("field_state") == NVLINK_STATE_SLEEP
        links.append((entry["link"], active, version if is_int(version) else None))
    return links
