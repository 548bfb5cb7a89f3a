"""A GPU's NVLink 5 error counters (Blackwell: B200, GB200), as NVML's field values report them summed over the
GPU's links (scopeId UINT_MAX, as DCGM asks on Blackwell: dcgmlib DcgmCacheManager, NvmlFieldRequiresNvLinkAggregate).
Blackwell's driver keeps none of the counters nvmlDeviceGetNvLinkErrorCounter reads (CRC flit and data, replay,
recovery: open-gpu-kernel-modules knvlinkGetSupportedCounters_GB100), so without these an HGX B200's NVLinks had
no readable error counter at all. The counters are those DCGM 4.6's NVLink health watch fails on when they rise
(DcgmHealthWatch::MonitorNVLink5Fields), less the two nvml.h marks deprecated (effective errors and BER).

dump_nvlink5(): NVML's answers for one GPU ({"error": ...} per counter it refused, as a GPU before Blackwell
does); parse_nvlink5(): {name: count} of the counters it gave."""

from __future__ import annotations

from nodecheck.probes.nvml_calls import ask_counters, counters_of

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


def dump_nvlink5(pynvml, handle, error_text) -> dict:
    """{name: count or {"error": ...}} in one nvmlDeviceGetFieldValues call; error_text(code): NVML's words."""
    return ask_counters(pynvml, handle, NVLINK5_COUNTERS, error_text, ALL_LINKS)


def parse_nvlink5(raw, errors: dict[str, str]) -> dict[str, int]:
    """The counters NVML gave as counts (0 <= n < 2^64); its first refusal into `errors` ("nvlink5"). Lenient: a
    malformed answer is no answer."""
    return counters_of(raw, NVLINK5_COUNTERS, errors, "nvlink5")
