"""The Report's records of a GPU's own state that NVML reports beside its identity: its error signals, its
registration with the NVLink fabric, the processes holding it (src/nodecheck/report/model.py's Gpu holds them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nodecheck.core.typed_json import ESSENTIAL

# the compute modes `[gpus] compute_mode` accepts (nvidia-smi -c 0, 3, 2); NVML's names are src/nodecheck/probes/nvml.py COMPUTE_MODES
COMPUTE_MODE_SETTINGS = ("default", "exclusive_process", "prohibited")


@dataclass
class GpuSignals:
    """A GPU's error signals as NVML reports them (src/nodecheck/probes/nvml.py); None where NVML did not say."""

    pcie_replays: int | None = None  # PCIe replay counter, since the driver loaded
    clock_event_reasons: int | None = None  # what slows its clocks now: a bitmask of nvmlClocksEventReason*
    ecc_uncorrected_volatile: int | None = None  # uncorrectable ECC errors since the driver loaded or the GPU reset
    nvlink_errors: dict[str, int] | None = None  # replay, recovery, crc_flit, crc_data over its links; Blackwell: NVLink 5 counters
    recovery_action: int | None = None  # what the driver asks before reuse (NVML_GPU_RECOVERY_ACTION_*; 0 none)
    sram_threshold_exceeded: bool | None = None  # SRAM uncorrectable errors past the field diagnostic's RMA threshold
    retired_pages: int | None = None  # pages retired for single- and double-bit errors (GPUs before Ampere)
    retired_pages_pending: bool | None = None  # a retirement waits for the GPU's reset
    inforom_valid: bool | None = None  # False: NVML says the InfoROM is corrupted
    clock_event_ns: dict[str, int] | None = None  # ns each reason has slowed its clocks, since the driver loaded


@dataclass
class GpuModelSpec:
    """What the GPU's model is rated at (its datasheet: src/nodecheck/core/data/specs.toml [[gpu_models]]), the
    figures its own memory and matrix tests are judged against."""

    model: str = field(metadata=ESSENTIAL)  # "H100 SXM", "A100 80GB PCIe" ...
    memory_bytes_per_second: float | None = None  # its memory bandwidth
    dense_tflops: dict[str, float] = field(default_factory=dict)  # precision (bf16, fp16, tf32, fp8) -> dense matrix TFLOPS
    source: str = ""


@dataclass
class GpuFabric:
    """The GPU's registration with the NVLink fabric (NVML's nvmlGpuFabricInfo): on NVSwitch systems Fabric
    Manager registers each GPU, and CUDA refuses work until that completes."""

    state: str  # not_supported, not_started, in_progress, completed, or "unknown (N)"
    status: str | None = None  # once completed: "Success", or NVML's words for what failed ("Insufficient Resources")
    clique_id: int | None = None
    cluster_uuid: str | None = None  # None when all zero: an NVSwitch node outside a multi-node NVLink domain
    health_summary: str | None = None  # healthy, unhealthy, limited_capacity; None where the driver does not say
    health: list[str] = field(default_factory=list)  # the conditions NVML's health mask raises ("route unhealthy")
    reduced_bw_mode: int | None = None  # Blackwell: the NVLink bandwidth mode it runs below its best in (NVML's number)

    @property
    def registered(self) -> bool | None:
        """True once completed with Success; False not started, in progress or failed; None without a fabric, or
        when the state is unreadable or unknown."""
        if self.state not in ("not_started", "in_progress", "completed"):
            return None
        return self.state == "completed" and self.status in (None, "Success")


@dataclass
class GpuProcess:
    """A process with a context on the GPU (NVML's compute and graphics lists), as /proc names it."""

    pid: int = field(metadata=ESSENTIAL)  # the host's pid
    type: str = "compute"  # compute, graphics, or both
    memory_bytes: int | None = None  # the GPU memory it holds; None where NVML cannot say (MIG, some VMs)
    name: str | None = None  # its comm, as /proc/PID/stat says it (15 characters)
    state: str | None = None  # /proc/PID/stat's: R running, S sleeping, D stuck in the driver, Z a zombie
    job: int | None = None  # the Slurm job whose cgroup holds it; None: outside every job
    ours: bool = False  # nodecheck's own (a bench's worker), or of the Slurm job nodecheck runs in
    gone: bool = False  # /proc has no such process: it ended since NVML listed it, or its context outlived it


# nvmlClocksEventReason* bits (nvml.h): the hardware's own brakes, and the driver's
HW_REASONS = {0x8: "HW slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake slowdown"}
SW_REASONS = {0x4: "SW power cap", 0x20: "SW thermal slowdown"}
# published (nodecheck_gpu_clock_event_active), never a finding: a busy GPU at its power limit runs so; the throttle
# checks of Azure's HPC images and Nebius's NPD pass it too
NOT_A_FAULT = 0x4
# NVML's clock event counters (probes/nvml_clock_events.py) and the bit each times
TIMED_BITS = {"hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80, "sw_thermal_slowdown": 0x20}
REASON_NAMES = {label: {**HW_REASONS, **SW_REASONS}[bit] for label, bit in TIMED_BITS.items()}


def reason_label(name: str) -> str:
    """A reason as a metric label: "HW power brake slowdown" -> hw_power_brake_slowdown."""
    return name.lower().replace(" ", "_")
