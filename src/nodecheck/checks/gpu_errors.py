"""A GPU's own error signals judged (NVML, src/nodecheck/probes/nvml.py): the PCIe replay rate against the limit derived
from its link, NVLink errors, volatile uncorrectable ECC, what slows its clocks, the recovery action the
driver asks for, and its memory and board health (SRAM threshold, retired pages, InfoROM). Pure: reads the
Report and the Config; rates and "sustained" come from the previous sample (src/nodecheck/checks/error_counters.py)."""

from __future__ import annotations

from nodecheck.checks.error_counters import change, previous_sample
from nodecheck.config import Config
from nodecheck.core.pci import normal_pci
from nodecheck.core.specs import pcie_errors_per_minute
from nodecheck.probes.nvml_clock_events import HARDWARE_BRAKES
from nodecheck.probes.nvml_nvlink5 import NVLINK5_COUNTERS
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

# nvmlClocksEventReason* bits (nvml.h): the hardware's own brakes, and the driver's
HW_REASONS = {0x8: "HW slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake slowdown"}
SW_REASONS = {0x4: "SW power cap", 0x20: "SW thermal slowdown"}
# published (nodecheck_gpu_clock_event_active), never a finding: a busy GPU at its power limit runs so; the throttle
# checks of Azure's HPC images and Nebius's NPD pass it too
NOT_A_FAULT = 0x4
# NVML's clock event counters (src/nodecheck/probes/nvml_clock_events.py) and the bit each times
TIMED_BITS = {"hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80, "sw_thermal_slowdown": 0x20}
REASON_NAMES = {label: {**HW_REASONS, **SW_REASONS}[bit] for label, bit in TIMED_BITS.items()}
# NVML_GPU_RECOVERY_ACTION_* (nvml.h) -> (what the driver asks, what the operator does), as NVIDIA's "Error Recovery
# and Response Flags" says them; 0 is none. The driver sets one after an uncorrectable fault: until it is done the
# GPU is not to be used, so each is an error (drain now) whatever the bandwidth tests measured
RECOVERY_ACTIONS = {
    1: ("GPU reset", "end its processes and reset it (`nvidia-smi -r -i {index}`)"),
    2: ("node reboot", "the fault may have left the OS inconsistent: reboot the node"),
    3: ("peer-to-peer drain", "end the processes doing peer-to-peer traffic and disable UVM persistence mode; "
                              "NVML then names the next action"),
    4: ("peer-to-peer drain and GPU reset", "end the processes doing peer-to-peer traffic, then reset the GPU "
                                            "(`nvidia-smi -r -i {index}`)"),
    5: ("IMEX domain recovery", "recover the IMEX domain this node's NVLink domain belongs to (nvidia-imex)"),
    6: ("PCIe bus reset", "reset the GPU's PCIe bus"),
    7: ("system reboot", "reboot the system"),
}


def reason_label(name: str) -> str:
    """A reason as a metric label: "HW power brake slowdown" -> hw_power_brake_slowdown."""
    return name.lower().replace(" ", "_")


def gpu_findings(report: Report, config: Config) -> list[Finding]:
    findings = []
    for gpu in report.gpus:
        if gpu.signals is not None:
            key = f"gpu/{normal_pci(gpu.pci_bus_id)}"
            for check in (_replays, _nvlink, _ecc, _clocks, _recovery, _memory_health):
                findings += check(report, config, gpu, f"gpu{gpu.index}", key)
    return findings


def _replays(report: Report, config: Config, gpu, subject: str, key: str) -> list[Finding]:
    pcie, replays = gpu.pcie or {}, gpu.signals.pcie_replays
    limit = pcie_errors_per_minute(pcie.get("gen_max"), pcie.get("width_current"))
    rise = change(report, config, f"{key}/pcie_replays", replays) if replays is not None else None
    if not limit or rise is None or rise.delta is None or rise.per(60) <= limit[0]:
        return []
    link = f"gen{pcie.get('gen_max')} x{pcie.get('width_current')}"
    # a warning, as DCGM's PCIe health watch says it (DCGM_HEALTH_RESULT_WARN past the derived limit); an error where a
    # bandwidth test over the same link failed too (signal_join.joined)
    return [Finding("pcie_replays", "warning", subject, f"PCIe replays {rise.per(60):.0f}/min", f"<= {limit[0]:g}/min",
                    f"{subject} PCIe replays +{rise.delta} in {rise.seconds:.0f} s ({rise.per(60):.0f}/min, limit {limit[0]:g}/min "
                    f"for {link}: {limit[1]}): its link retries packets; reseat the GPU or its riser, check the slot")]


def _nvlink(report: Report, config: Config, gpu, subject: str, key: str) -> list[Finding]:
    errors = gpu.signals.nvlink_errors or {}
    rises = {name: change(report, config, f"{key}/nvlink_{name}", value) for name, value in errors.items()}
    known = {name: rise for name, rise in rises.items() if rise.delta is not None}
    found = []
    crc = [rise for name, rise in known.items() if name.startswith("crc_")]
    crc_limit, crc_source = config.errors.limit("nvlink_crc_per_s")
    if crc and sum(r.delta for r in crc) / crc[0].seconds > crc_limit:
        found.append((f"NVLink CRC {sum(r.delta for r in crc) / crc[0].seconds:.0f}/s", f"<= {crc_limit:g}/s", crc_source))
    for name in ("replay", "recovery"):  # DCGM fails its NVLink watch when one rises by DCGM_LIMIT_MAX_NVLINK_ERROR (1)
        limit, source = config.errors.limit(f"nvlink_{name}_per_interval")
        if name in known and known[name].delta >= limit:
            found.append((f"NVLink {name} +{known[name].delta}", f"< {limit:g} per sample", source))
    limit, source = config.errors.limit("nvlink5_errors_per_interval")
    rising = [f"{name.replace('_', ' ')} +{rise.delta}" for name, rise in known.items()
              if name in NVLINK5_COUNTERS and rise.delta > limit]
    if rising:
        found.append((f"NVLink {', '.join(rising)}", f"<= {limit:g} per sample", source))
    return [Finding("nvlink_errors", "error", subject, measured, expected,
                    f"{subject} {measured} in {next(iter(known.values())).seconds:.0f} s (limit {expected}: {source}): check "
                    "`nvidia-smi nvlink -e`, the fabric manager and the NVSwitch tray") for measured, expected, source in found]


def _ecc(report: Report, config: Config, gpu, subject: str, key: str) -> list[Finding]:
    count = gpu.signals.ecc_uncorrected_volatile
    if not count:
        return []
    return [Finding("ecc_uncorrected", "error", subject, f"{count} uncorrectable", "0",
                    f"{subject} counted {count} uncorrectable ECC error(s) since the driver loaded: its memory returned "
                    f"data it could not correct; reset the GPU (`nvidia-smi -r -i {gpu.index}`) so pending row remappings "
                    "take effect, and replace it if they fail")]


def _clocks(report: Report, config: Config, gpu, subject: str, key: str) -> list[Finding]:
    """What slowed the GPU's clocks. Where NVML's clock event counters rose since an earlier sample, how long each
    reason held in between: a hardware brake for [errors.limits] clock_hw_brake_fraction of that time or more is an
    error, for less a warning. The reasons bitmask says what slows them now, for the reasons the counters do not time
    (or a driver without them): a hardware brake is an error when it held at the previous sample too (sustained),
    else a warning. The driver's thermal slowdown is a warning; its power cap alone nothing (the GPU is working at
    its power limit)."""
    timed = _time_slowed(report, config, gpu.signals.clock_event_ns or {}, key)
    reasons = gpu.signals.clock_event_reasons or 0
    if timed is not None:  # the counters time these reasons; HW slowdown (0x8) goes with a timed brake
        reasons &= ~(sum(TIMED_BITS.values()) | (0x8 if any(n in HARDWARE_BRAKES for n in timed) else 0))
    previous, _ = previous_sample(report, config, f"{key}/clock_event_reasons") if reasons else (None, None)
    before = previous.counters[f"{key}/clock_event_reasons"] if previous else 0
    hardware = [name for bit, name in HW_REASONS.items() if reasons & bit]
    sustained = [name for bit, name in HW_REASONS.items() if reasons & bit and before & bit]
    software = [name for bit, name in SW_REASONS.items() if reasons & bit and bit != NOT_A_FAULT]
    if not timed and not hardware and not software:
        return []
    limit, _ = config.errors.limit("clock_hw_brake_fraction")
    braked = any(name in HARDWARE_BRAKES and fraction >= limit for name, (_, _, fraction) in (timed or {}).items())
    said = [f"{REASON_NAMES[name]} {held:.1f} s of the last {seconds:.0f} s ({fraction:.0%})"
            for name, (held, seconds, fraction) in (timed or {}).items()]
    if hardware or software:
        said.append(", ".join(hardware + software) + (f" now, held since the previous sample ({', '.join(sustained)})"
                                                        if sustained else " now"))
    on_hardware = hardware or any(name in HARDWARE_BRAKES for name in timed or {})
    return [Finding("gpu_clock_slowdown", "error" if sustained or braked else "warning", subject,
                    ", ".join([REASON_NAMES[n] for n in timed or {}] + hardware + software), "none",
                    f"{subject} clocks slowed by " + "; ".join(said) + ": " + (
                        f"the GPU's hardware brakes (overheating, a power supply or board fault; an error from "
                        f"{limit:.0%} of the time); check cooling, `nvidia-smi -q -d PERFORMANCE` and the BMC's sensors"
                        if on_hardware else
                        "the driver slows the GPU for its temperature; under load this costs speed, check the cooling"))]


def _time_slowed(report: Report, config: Config, counters: dict[str, int], key: str):
    """{reason: (seconds it held, seconds since the previous sample, the fraction)} of the counters that rose; {}
    when none did; None when the counters cannot say (none read, no earlier sample, or a rise longer than the
    interval: a reset or a unit this nodecheck misreads)."""
    rises = {name: change(report, config, f"{key}/clock_{name}_ns", value) for name, value in counters.items()
             if name in TIMED_BITS}  # a Report read from a file may name others
    if not rises or any(rise.delta is None for rise in rises.values()):
        return None
    timed = {name: (rise.delta / 1e9, rise.seconds, rise.delta / 1e9 / rise.seconds)
             for name, rise in rises.items() if rise.delta and rise.seconds}
    return None if any(fraction > 1.05 for _, _, fraction in timed.values()) else timed


def _recovery(report: Report, config: Config, gpu, subject: str, key: str) -> list[Finding]:
    """The recovery action NVML reports: an error naming it; one this nodecheck does not know a warning."""
    action = gpu.signals.recovery_action
    if not action:
        return []
    if action not in RECOVERY_ACTIONS:
        return [Finding("gpu_recovery_action", "warning", subject, f"action {action}", "none",
                        f"{subject}: the driver asks for recovery action {action}, which this nodecheck does not know: "
                        f"`nvidia-smi -q -i {gpu.index}` names it (GPU Recovery Action)")]
    named, todo = RECOVERY_ACTIONS[action]
    return [Finding("gpu_recovery_action", "error", subject, named, "none",
                    f"{subject}: the driver asks for a {named} before the GPU is used again (NVML recovery action "
                    f"{action}, after an uncorrectable fault): {todo.format(index=gpu.index)}; the kernel log's Xid "
                    "names the fault")]


def _memory_health(report: Report, config: Config, gpu, subject: str, key: str) -> list[Finding]:
    """As DCGM's diagnostic judges them: SRAM errors past the field diagnostic's threshold and a corrupted InfoROM are
    warnings (the GPU works; NVIDIA's RMA process decides), a page retirement waiting for a reset a warning (as a
    pending row remapping), retired pages at DCGM's limit an error (replace the GPU, as a failed row remapping)."""
    signals, found = gpu.signals, []
    if signals.sram_threshold_exceeded:
        found.append(Finding("sram_threshold_exceeded", "warning", subject, "exceeded", "not exceeded",
                             f"{subject}'s SRAM uncorrectable errors passed the field diagnostic's threshold, NVIDIA's RMA "
                             "criterion for its L2 and SRAM: run NVIDIA's field diagnostic and open an RMA "
                             f"(`nvidia-smi -q -d ECC -i {gpu.index}`: SRAM Threshold Exceeded)"))
    limit, source = config.errors.limit("retired_pages")
    if signals.retired_pages is not None and signals.retired_pages >= limit:
        found.append(Finding("retired_pages_limit", "error", subject, f"{signals.retired_pages} retired", f"< {limit:g}",
                             f"{subject} retired {signals.retired_pages} memory pages, at or past the limit of {limit:g} "
                             f"({source}): replace the GPU"))
    if signals.retired_pages_pending:
        found.append(Finding("retired_pages_pending", "warning", subject, "pending", "none",
                             f"{subject} has a page retirement pending: reset the GPU when idle (`nvidia-smi -r -i "
                             f"{gpu.index}`) so the bad page is taken out of use"))
    if signals.inforom_valid is False:
        found.append(Finding("inforom_corrupted", "warning", subject, "corrupted", "valid",
                             f"NVML says {subject}'s InfoROM is corrupted: the GPU may not record its ECC errors and "
                             "remappings; reflash it with NVIDIA's tools, or replace the board"))
    return found
