"""Whether the node's GPUs are all there: fewer visible than `[gpus] count`, or than the NVIDIA kernel driver
manages; a GPU NVML counts but cannot open; GPUs the driver does not keep initialised between jobs. Pure: reads the
Report and the Config."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.core.pci import normal_pci
from nodecheck.core.units import first_of
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def gpu_count(report: Report, config: Config) -> list[Finding]:
    """Fewer GPUs visible than `[gpus] count`; else, without that config, fewer than the NVIDIA kernel driver
    manages (/proc/driver/nvidia/gpus) that NVML neither lists nor counts (_driver_gpus_unseen)."""
    if config.gpu_count is None or len(report.gpus) >= config.gpu_count:
        return _driver_gpus_unseen(report)
    why = f" ({report.gpus_absent_reason})" if report.gpus_absent_reason else ""
    return [Finding("gpu_count_low", "error", "node", len(report.gpus), config.gpu_count,
                    f"{len(report.gpus)} GPUs visible, {config.gpu_count} expected{why}: {_missing_gpu_advice(report)}")]


def _driver_gpus_unseen(report: Report) -> list[Finding]:
    """The driver manages GPUs that NVML neither lists nor counts. NVML failing to start beside them (a driver upgraded
    without a reboot: "version mismatch") is an error. NVML started but listing fewer is a warning: a job's device
    cgroup (Slurm's ConstrainDevices) hides GPUs from NVML while /proc still lists them all, and a GPU that failed to
    come up is counted and refused (gpu_inaccessible). NVML out of this process's reach (no /dev/nvidiactl or
    library: a container without the NVIDIA runtime) is a warning too: the GPUs are unknown from here, not broken."""
    managed = report.driver_gpus or []
    seen = {normal_pci(g.pci_bus_id) for g in report.gpus}
    unseen = [bdf for bdf in managed if normal_pci(bdf) not in seen]
    if len(managed) <= len(report.gpus) + len(report.gpus_inaccessible) or not unseen:
        return []
    nvml = _nvml_outcome(report)
    reason = f" ({nvml.error})" if nvml and nvml.error else ""
    head = f"{len(report.gpus)} GPUs visible, the NVIDIA driver manages {len(managed)} ({first_of(unseen, 8)} unseen){reason}"
    if nvml is not None and nvml.ok:
        return [Finding("gpu_count_low", "warning", "node", len(report.gpus), len(managed),
                        f"{head}: inside a job or container that hides GPUs from NVML this is expected; elsewhere a GPU "
                        "did not come up: `nvidia-smi -L`, dmesg")]
    if nvml is not None and nvml.no_data:
        return [Finding("gpu_count_low", "warning", "node", len(report.gpus), len(managed),
                        f"{head}: NVML is out of this process's reach, so these GPUs are unchecked; in a container, the "
                        "NVIDIA runtime must pass the GPUs (NVIDIA_VISIBLE_DEVICES) and the driver's library")]
    return [Finding("gpu_count_low", "error", "node", len(report.gpus), len(managed), f"{head}: {_missing_gpu_advice(report)}")]


def _nvml_outcome(report: Report):
    return next((probe for probe in report.probes if probe.name == "nvml"), None)


NVML_NO_PERMISSION = 4  # nvmlReturn_t: this user may not open the GPU, which says nothing against it


def inaccessible_gpus(report: Report, config: Config) -> list[Finding]:
    """A GPU NVML counts but cannot open: fallen off the bus (GPU is lost), or failed to initialise (Unknown Error;
    the kernel log's RmInitAdapter line says why): an error, whatever else answered. Refused for permission: a
    warning, as the checks of that GPU are unknown, not failed."""
    findings = []
    for gpu in report.gpus_inaccessible:
        subject = f"gpu{gpu.index}"
        if gpu.code == NVML_NO_PERMISSION:
            findings.append(Finding("gpu_inaccessible", "warning", subject, gpu.error, "opened",
                                    f"NVML counts {subject} but may not open it ({gpu.error}): its checks are unknown; run "
                                    "as a user that can read its /dev/nvidia* device"))
        else:
            findings.append(Finding("gpu_inaccessible", "error", subject, gpu.error, "opened",
                                    f"NVML counts {subject} but cannot open it ({gpu.error}): the GPU fell off the bus or "
                                    "failed to initialise; dmesg names it (Xid 79, RmInitAdapter failed): reboot the node, "
                                    "and reseat or replace the GPU if it recurs"))
    return findings


def _missing_gpu_advice(report: Report) -> str:
    """No GPU at all because NVML found no driver is a software fault: reseating a GPU would not help."""
    from nodecheck.core.errors import NO_DRIVER

    nvml = _nvml_outcome(report)
    stack_absent = not report.gpus and nvml is not None and nvml.no_data and (nvml.error or "").startswith(NO_DRIVER)
    if stack_absent and "Permission" in nvml.error:
        return "NVML may not open the GPUs: run as a user that can read /dev/nvidia* (the driver's device permissions)"
    if stack_absent and not report.node.get("driver_version"):
        return ("the NVIDIA driver is not loaded (no kernel module, or no NVML library): `lsmod | grep nvidia`, "
                "`modprobe nvidia` and dmesg for why it did not load (often a new kernel without the module rebuilt: "
                "`dkms status`), or install the driver")
    if stack_absent:
        return (f"the NVIDIA kernel module {report.node['driver_version']} is loaded but NVML's library is missing: "
                "install the driver's user-space part of the same version (libnvidia-ml)")
    if nvml is not None and "mismatch" in (nvml.error or "").lower():
        return ("NVML's library and the loaded kernel module are of different versions (the driver was upgraded "
                "without a reboot): reboot the node, or unload and reload the nvidia modules")
    return "check `nvidia-smi -L`, dmesg for Xid/fallen-off-the-bus errors, and reseat or replace the missing GPU"


def persistence_off(report: Report, config: Config) -> list[Finding]:
    """GPUs with persistence mode off (nvidia-persistenced not running): the driver tears each down when its last
    client exits, so every job's start initialises them again (seconds per GPU, and longer on NVSwitch systems), and
    the counts NVML keeps since the GPU was initialised (volatile ECC, PCIe replays, clock event time) may start over
    between two samples, which leaves their rates unknown. One warning naming them; nothing where NVML does not say."""
    off = [g for g in report.gpus if g.persistent is False]
    if not off:
        return []
    names = ", ".join(f"gpu{g.index}" for g in off)
    return [Finding("gpu_persistence_off", "warning", "node", f"off on {names}", "on",
                    f"persistence mode is off on {names} ({len(off)} of {len(report.gpus)} GPUs): the driver initialises "
                    "them again at every job's start and the counters it keeps start over; run nvidia-persistenced "
                    "(`systemctl enable --now nvidia-persistenced`), as NVIDIA's driver persistence guide asks of "
                    "compute nodes")]


def unsaid(report: Report, kind, attribute: str, what: str) -> dict[str, str]:
    """The check unknown where NVML did not report one GPU's `attribute`: one refusal must not read as healthy."""
    gpu = next((g for g in report.gpus if getattr(g, attribute) is None), None)
    return {kind.name: f"gpu{gpu.index}: NVML did not report its {what}"} if gpu is not None else {}


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
GPU_COUNT_LOW = Kind("gpu_count_low", "gpu", "GPUs {measured} < {expected}",
    doc=(
        ("error (warning where NVML lists fewer than the driver, or is out of this process's reach)",
         "fewer GPUs than `gpus.count`; without it, fewer than the NVIDIA kernel driver manages (`driver_gpus`) that NVML "
         "neither lists nor counts: NVML failing to start beside them (a driver upgraded without a reboot: \"version "
         "mismatch\") is an error; NVML listing fewer (a job's device cgroup hides GPUs from NVML, not from /proc) or out of "
         "reach (no `/dev/nvidiactl` or library: a container without the NVIDIA runtime) a warning"),
    ))
GPU_INACCESSIBLE = Kind("gpu_inaccessible", "gpu", "{subject} {measured}",
    doc=(
        ("error (warning for No Permission)",
         "NVML counts a GPU it cannot open: it fell off the bus (\"GPU is lost\") or failed to initialise (\"Unknown Error\"; "
         "the kernel log's `RmInitAdapter failed`); the other GPUs are still read and judged. No Permission says its checks are"
         " unknown"),
    ))
GPU_PERSISTENCE_OFF = Kind("gpu_persistence_off", "gpu", "GPU persistence mode {measured}",
    doc=(
        ("warning",
         "GPUs whose persistence mode is off (NVML `nvmlDeviceGetPersistenceMode`, \"Persistence Mode: Disabled\": "
         "nvidia-persistenced not running): the driver tears each down when its last client exits, so every job's start "
         "initialises them again and the counts NVML keeps since then (volatile ECC, PCIe replays, clock event time) may start "
         "over between two samples. Subject `node`, `measured` \"off on gpu2, gpu5\"; unknown (never healthy) where NVML does "
         "not say for a GPU"),
    ))

COUNT = Check((GPU_COUNT_LOW,), gpu_count)
INACCESSIBLE = Check((GPU_INACCESSIBLE,), inaccessible_gpus, needs="nvml")
PERSISTENCE = Check((GPU_PERSISTENCE_OFF,), persistence_off, needs="nvml",
                    unknown=lambda report: unsaid(report, GPU_PERSISTENCE_OFF, "persistent", "persistence mode"))
