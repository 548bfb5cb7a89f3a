"""A stand-in for pynvml that replays values read through NVML on a real H100 node
(../shared/captures/h100-pcie-vm/nvml.json). Used only where no GPU exists; values that NVML
refused on that node ("ERR ...") are raised as the NVMLError NVML raised."""

from __future__ import annotations

import ctypes
import types


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


def _value(raw):
    if isinstance(raw, str) and raw.startswith("ERR"):
        raise NVMLError_NotSupported("Not Supported")
    return raw


def replaying(captured: list[dict], driver: str = "580.159.04", fail_init: Exception | None = None):
    """A module object with the pynvml functions dump_nvml() calls, answering from `captured`."""
    m = types.SimpleNamespace(NVMLError=NVMLError, NVML_NVLINK_MAX_LINKS=18)
    gpus = {i: g for i, g in enumerate(captured)}

    def init():
        if fail_init:
            raise fail_init

    m.nvmlInit, m.nvmlShutdown = init, lambda: None
    m.nvmlSystemGetDriverVersion = lambda: driver
    m.nvmlSystemGetCudaDriverVersion = lambda: 13000
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
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
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=_value(h.get("memory_total", "ERR")), used=0, free=0)
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
    return m
