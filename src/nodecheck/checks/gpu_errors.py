"""A GPU's own error signals judged (NVML, src/nodecheck/probes/nvml.py): the PCIe replay rate against the limit derived
from its link, NVLink errors, volatile uncorrectable ECC, what slows its clocks, the recovery action the
driver asks for, and its memory and board health (SRAM threshold, retired pages, InfoROM). Pure: reads the
Report and the Config; rates and "sustained" come from the previous sample (src/nodecheck/checks/error_counters.py)."""

from __future__ import annotations

from nodecheck.assemble.counters import change, previous_sample
from nodecheck.assemble.fingerprint import vbios_mismatch
from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.core.pci import normal_pci
from nodecheck.core.specs import pcie_errors_per_minute
from nodecheck.probes.nvml_clock_events import HARDWARE_BRAKES
from nodecheck.probes.nvml_nvlink5 import NVLINK5_COUNTERS
from nodecheck.report.findings import Finding
from nodecheck.report.gpu import HW_REASONS, NOT_A_FAULT, REASON_NAMES, SW_REASONS, TIMED_BITS
from nodecheck.report.model import Report

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


# a GPU's NVML signal -> the finding kind judged from it, and what NVML was asked
GPU_SIGNALS = {"pcie_replays": ("pcie_replays", "its PCIe replay counter"),
               "clock_event_reasons": ("gpu_clock_slowdown", "its clock event reasons"),
               "ecc_uncorrected_volatile": ("ecc_uncorrected", "its uncorrectable ECC count"),
               "recovery_action": ("gpu_recovery_action", "its recovery action (a driver without the field?)"),
               "nvlink_errors": ("nvlink_errors", "the error counters of its active NVLinks"),
               "sram_threshold_exceeded": ("sram_threshold_exceeded", "its SRAM error status (it needs root)"),
               "retired_pages": ("retired_pages_limit", "its retired pages"),
               "retired_pages_pending": ("retired_pages_pending", "whether a page retirement is pending"),
               "inforom_valid": ("inforom_corrupted", "whether its InfoROM is valid")}
AMPERE = 7  # NVML_DEVICE_ARCH_AMPERE: the SRAM error status from here on; page retirement before it (rows remap)


def gpu_signals_unknown(report: Report) -> dict[str, str]:
    """Kind -> why, where NVML did not report a GPU's signal: one GPU's refusal must not read as healthy because the
    other GPUs answered (an HGX node whose 144 active NVLinks have no readable error counter passed the NVLink error
    check). NVLink counters are asked only of a GPU with an active NVLink outside MIG mode."""
    unsaid: dict[str, str] = {}
    for gpu in report.gpus:
        for name, (kind, what) in GPU_SIGNALS.items():
            if name == "nvlink_errors" and (gpu.mig_enabled or not any(link["active"] for link in gpu.nvlinks)):
                continue
            if not _asked_of(name, gpu.architecture):
                continue
            if gpu.signals is None or getattr(gpu.signals, name) is None:
                unsaid.setdefault(kind, f"gpu{gpu.index}: NVML did not report {what}")
    return unsaid


def _asked_of(signal: str, architecture: int | None) -> bool:
    """Whether a GPU of this NVML architecture has the signal: the SRAM status from Ampere on, retired pages before
    it; neither is expected of a GPU whose architecture NVML did not say."""
    if signal == "sram_threshold_exceeded":
        return architecture is not None and architecture >= AMPERE
    if signal.startswith("retired_pages"):
        return architecture is not None and architecture < AMPERE
    return True


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
PCIE_REPLAYS = Kind("pcie_replays", "gpu", "{subject} {measured} > {expected}", signal=True, tempered=True, escalated=True,
    doc=(
        ("error (warning where the GPU's host-link test passed)",
         "since the previous sample, a GPU's PCIe replays (NVML) ran faster than its link's limit, derived as for "
         "`pcie_link_errors` from NVML's generation and width"),
    ))
NVLINK_ERRORS = Kind("nvlink_errors", "gpu", "{subject} {measured}", signal=True, tempered=True,
    doc=(
        ("error (warning where the GPU's p2p or in-node all-reduce passed)",
         "since the previous sample, a GPU's NVLink CRC errors (flit and data, summed over its links) ran above 100/s, or its "
         "replays or recoveries rose by more than 1 (DCGM's NVLink watch; `[errors.limits]`); on Blackwell, any of its NVLink 5"
         " error counters rose (`nvlink5_errors_per_interval`, 0: DCGM 4.6 fails on any rise)"),
    ))
ECC_UNCORRECTED = Kind("ecc_uncorrected", "gpu", "{subject} {measured} ECC errors", signal=True,
    doc=(
        ("error",
         "NVML counts uncorrectable ECC errors since the driver loaded or the GPU reset (volatile): drain now; reset the GPU"),
    ))
GPU_CLOCK_SLOWDOWN = Kind("gpu_clock_slowdown", "gpu", "{subject} clocks: {measured}", signal=True,
    doc=(
        ("error, warning",
         "how long each reason slowed the GPU's clocks since the previous sample (NVML's clock event counters): a hardware "
         "brake (HW thermal, HW power brake) for 5% of that time or more is an error (`[errors.limits] "
         "clock_hw_brake_fraction`), for less a warning, the driver's SW thermal slowdown a warning. The reasons NVML says slow"
         " the clocks now, for what the counters do not time (HW slowdown alone; drivers without the counters): a hardware "
         "brake active now and at the previous sample is an error, seen now only a warning; the driver's SW thermal slowdown a "
         "warning; its SW power cap is no finding (a busy GPU at its power limit; published as "
         "`nodecheck_gpu_clock_event_active{reason=\"sw_power_cap\"}`); `nodecheck fleet` and `NodecheckClockBrakesAbovePeers` "
         "compare the share of the time since boot a node's most braked GPU spent on a hardware brake with its peers'"),
    ))
GPU_RECOVERY_ACTION = Kind("gpu_recovery_action", "gpu", "{subject} needs {measured}", signal=True,
    doc=(
        ("error (warning for an action this nodecheck does not know)",
         "NVML's recovery action (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, \"GPU Recovery Action\" in `nvidia-smi -q`) is not "
         "none: after an uncorrectable fault the driver asks for a GPU reset, a reboot, a peer-to-peer drain or an IMEX domain "
         "recovery before the GPU is used again; drain now, whatever the bandwidth tests measured. Unknown "
         "(`nodecheck_check_unknown`) where the driver does not report the field"),
    ))
SRAM_THRESHOLD_EXCEEDED = Kind("sram_threshold_exceeded", "gpu", "{subject} SRAM errors past the RMA threshold",
    doc=(
        ("warning",
         "NVML's SRAM error status (`nvmlDeviceGetSramEccErrorStatus`, Ampere and newer, root only; \"SRAM Threshold Exceeded\""
         " in `nvidia-smi -q -d ECC`) says the SRAM uncorrectable errors passed the field diagnostic's threshold, NVIDIA's RMA "
         "criterion for the GPU's L2 and SRAM; a warning as in DCGM's diagnostic: the GPU works, NVIDIA's field diagnostic and "
         "RMA decide"),
    ))
RETIRED_PAGES_LIMIT = Kind("retired_pages_limit", "gpu", "{subject} {measured} pages, expected {expected}",
    doc=(
        ("error",
         "a GPU before Ampere (V100, T4: page retirement; newer GPUs remap rows) retired as many pages as `[errors.limits] "
         "retired_pages` (63, DCGM's limit) or more, single- and double-bit causes together: replace it"),
    ))
RETIRED_PAGES_PENDING = Kind("retired_pages_pending", "gpu", "{subject} page retirement pending",
    doc=(
        ("warning",
         "a page retirement waits for the GPU's reset (`nvmlDeviceGetRetiredPagesPendingStatus`)"),
    ))
INFOROM_CORRUPTED = Kind("inforom_corrupted", "gpu", "{subject} InfoROM corrupted",
    doc=(
        ("warning",
         "`nvmlDeviceValidateInforom` answers Corrupted InfoROM: the GPU may not record its ECC errors and remappings (DCGM's "
         "health watch warns the same)"),
    ))
GPU_VBIOS_MISMATCH = Kind("gpu_vbios_mismatch", "gpu", "{subject} VBIOS {measured} != {expected}",
    doc=(
        ("warning",
         "the GPUs of one node run different VBIOS versions (NVML): one finding per GPU off the node's most common version"),
    ))

CHECK = Check((PCIE_REPLAYS, NVLINK_ERRORS, ECC_UNCORRECTED, GPU_CLOCK_SLOWDOWN, GPU_RECOVERY_ACTION,
               SRAM_THRESHOLD_EXCEEDED, RETIRED_PAGES_LIMIT, RETIRED_PAGES_PENDING, INFOROM_CORRUPTED), gpu_findings,
              needs="nvml", unknown=gpu_signals_unknown, rates=(("gpu/", (PCIE_REPLAYS, NVLINK_ERRORS)),))
VBIOS = Check((GPU_VBIOS_MISMATCH,), vbios_mismatch, needs="nvml")
