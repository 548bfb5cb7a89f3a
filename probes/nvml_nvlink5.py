"""A GPU's NVLink 5 error counters (Blackwell: B200, GB200), as NVML's field values report them summed over the
GPU's links (scopeId UINT_MAX, as DCGM asks on Blackwell: dcgmlib DcgmCacheManager, NvmlFieldRequiresNvLinkAggregate).
Blackwell's driver keeps none of the counters nvmlDeviceGetNvLinkErrorCounter reads (CRC flit and data, replay,
recovery: open-gpu-kernel-modules knvlinkGetSupportedCounters_GB100), so without these an HGX B200's NVLinks had
no readable error counter at all. The counters are those DCGM 4.6's NVLink health watch fails on when they rise
(DcgmHealthWatch::MonitorNVLink5Fields), less the two nvml.h marks deprecated (effective errors and BER).

dump_nvlink5(): NVML's answers for one GPU ({"error": ...} per counter it refused, as a GPU before Blackwell
does); parse_nvlink5(): {name: count} of the counters it gave."""

from __future__ import annotations

from nodecheck.units import is_int

# the name nodecheck gives each counter -> its NVML field (nvml.h's words in the comment)
NVLINK5_COUNTERS = {
    "symbol_errors": "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS",  # errors in rx symbols
    "malformed_packets": "NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS",  # packets received malformed
    "buffer_overruns": "NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS",  # packets discarded on rx: buffer overrun
    "rx_errors": "NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS",  # packets received with errors
    "rx_remote_errors": "NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS",  # packets received with a stomp/EBP marker
    "rx_general_errors": "NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS",  # packets received with a header mismatch
    "integrity_errors": "NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS",  # local errors past a threshold
    "recovery_events": "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS",  # a link went from up to recovery
}
ALL_LINKS = 0xFFFFFFFF  # scopeId UINT_MAX: the sum over the GPU's links
# nvmlValueType_t -> the member of nvmlValue_t that holds it
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def dump_nvlink5(pynvml, handle, error_text) -> dict:
    """{name: count or {"error": ...}} in one nvmlDeviceGetFieldValues call; error_text(code): NVML's words."""
    ask = getattr(pynvml, "nvmlDeviceGetFieldValues", None)
    ids = {name: getattr(pynvml, field, None) for name, field in NVLINK5_COUNTERS.items()}
    if ask is None or None in ids.values():
        return {"error": "not in this nvidia-ml-py"}
    try:
        values = ask(handle, [(field_id, ALL_LINKS) for field_id in ids.values()])
    except pynvml.NVMLError as error:
        return {"error": str(error)}
    said: dict = {}
    for name, value in zip(ids, values, strict=False):
        if value.nvmlReturn != 0:
            said[name] = {"error": error_text(value.nvmlReturn)}
        else:
            member = _VALUE_MEMBERS.get(int(value.valueType))
            said[name] = int(getattr(value.value, member)) if member else {"error": f"value type {value.valueType}"}
    return said


def parse_nvlink5(raw, errors: dict[str, str]) -> dict[str, int]:
    """The counters NVML gave as counts (0 <= n < 2^64); its first refusal into `errors` ("nvlink5"). Lenient: a
    malformed answer is no answer."""
    if not isinstance(raw, dict):
        return {}
    refused = raw.get("error") or next((v["error"] for v in raw.values() if isinstance(v, dict) and "error" in v), None)
    if refused is not None:
        errors["nvlink5"] = str(refused)[:200]
    return {name: value for name, value in raw.items()
            if name in NVLINK5_COUNTERS and is_int(value) and 0 <= value < 1 << 64}
