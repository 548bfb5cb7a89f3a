"""How long a GPU's clocks have been slowed, per reason: NVML's clock event counters (field values, nanoseconds since
the driver loaded; `nvidia-smi -q` prints them as "Clocks Event Reasons Counters" in microseconds, DCGM reads them as
its *_SLOWDOWN_NS fields). The reasons bitmask (nvmlDeviceGetCurrentClocksEventReasons) says only what slows the
clocks at the instant it is read: a GPU that brakes for ten seconds of every minute is seen, or not, by chance; the
counters keep every nanosecond of it. Drivers before these fields answer Not Supported: the bitmask is judged alone.

dump_clock_events(): NVML's answers for one GPU; parse_clock_events(): {reason: ns} of the counters it gave."""

from __future__ import annotations

from nodecheck.probes.nvml_calls import ask_counters, counters_of

# the reason's metric label (as nodecheck_gpu_clock_event_active names it) -> its NVML field
CLOCK_EVENT_COUNTERS = {
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",  # the GPU or its memory too hot
    "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",  # external power brake
    "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",  # the driver keeps it under its limit
}
HARDWARE_BRAKES = ("hw_thermal_slowdown", "hw_power_brake_slowdown")  # each cuts the clocks by half or more (nvml.h)


def dump_clock_events(pynvml, handle, error_text) -> dict:
    """{reason: ns or {"error": ...}} in one nvmlDeviceGetFieldValues call; error_text(code): NVML's words."""
    return ask_counters(pynvml, handle, CLOCK_EVENT_COUNTERS, error_text)


def parse_clock_events(raw, errors: dict[str, str]) -> dict[str, int] | None:
    """The counters NVML gave, in ns; None where it gave none (its refusal into `errors`, "clock_events")."""
    return counters_of(raw, CLOCK_EVENT_COUNTERS, errors, "clock_events") or None
