"""Each GPU's registration with the NVLink fabric judged (NVML's nvmlGpuFabricInfo, src/nodecheck/probes/nvml.py).

On an NVSwitch node (HGX/DGX A100, H100, H200, B200, GB200) Fabric Manager trains the NVSwitch links and
registers every GPU; until a GPU's state is "completed" with status Success, CUDA refuses work on it with error
802 (cudaErrorSystemNotReady, "system not yet initialized"). NVML, nvidia-smi's GPU table and the NVLink
states can all look healthy meanwhile: a node whose Fabric Manager died at boot runs no job. A GPU without the
fabric (PCIe boards, a single GPU) says not_supported and is not judged.

- gpu_fabric_not_ready (error): not started, in progress, or completed with an error status (NVSentinel#883:
  H100 nodes whose GPUs said Success and Unknown Error, undetected; Azure's GB200 nodes: Insufficient Resources).
- gpu_fabric_unhealthy: the health NVML reports on newer drivers: an error for an unhealthy summary, an
  unhealthy route, an incorrect configuration or a lost global fabric manager; a warning for degraded bandwidth,
  limited capacity, a recovery in progress, or a state this nodecheck does not know.
- nvlink_bw_reduced (warning): the node's NVLink bandwidth mode below FULL (Hopper), or a GPU's below its best
  (Blackwell sets it per GPU) (bw_mode_findings).
"""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

NOT_READY = {"not_started": "not started", "in_progress": "in progress"}
GRAVE = ("route unhealthy", "global fabric manager disconnected")  # and any "incorrect configuration: ..."
WHERE_TO_LOOK = ("`systemctl status nvidia-fabricmanager` and /var/log/fabricmanager.log (Fabric Manager's "
                 "version must equal the driver's; NVLink 5 systems also need NVLSM)")


def fabric_findings(report: Report, config: Config) -> list[Finding]:
    return [f for gpu in report.gpus if gpu.fabric is not None for f in _judge(f"gpu{gpu.index}", gpu.fabric)]


# the share of a GPU's NVLinks peer traffic uses in each reduced bandwidth mode (open-gpu-kernel-modules
# knvlinkGetNumLinksToBeReducedPerIoctrl_GH100: MIN leaves one link per IOCTRL, HALF half, 3QUARTER three quarters)
BW_MODE_SHARE = {"OFF": "none of its NVLinks (peer traffic over PCIe)", "MIN": "one NVLink per IOCTRL",
                 "HALF": "half its NVLinks", "3QUARTER": "three quarters of its NVLinks"}


def bw_mode_findings(report: Report, config: Config) -> list[Finding]:
    """nvlink_bw_reduced (warning): the node's NVLink bandwidth mode (NVML, `nvidia-smi nvlink -sBwMode`) below
    FULL on a node with active NVLinks. Every link still reads active and the topology still says NV18, so a slow
    p2p or all-reduce pointed at the links; the mode explains it (src/nodecheck/verdicts/signal_join.py names it in that verdict)."""
    mode = (report.node or {}).get("nvlink_bw_mode")
    mode = mode if isinstance(mode, str) else None  # the node section is free-form: a saved Report's may hold anything
    findings = [Finding("nvlink_bw_reduced", "warning", f"gpu{g.index}", f"mode {g.fabric.reduced_bw_mode}", "best",
                        f"gpu{g.index}'s NVLinks run in a reduced bandwidth mode (NVML's mode {g.fabric.reduced_bw_mode}, not "
                        "its best): its peer-to-peer traffic uses fewer links, and NVLink bandwidth tests with it read low "
                        "while every link is active; NVML's nvmlDeviceSetNvlinkBwMode with bSetBest (the GPU idle) "
                        "restores its best mode if that was not meant")
                for g in report.gpus if g.fabric is not None and g.fabric.reduced_bw_mode is not None
                and any(link.get("active") for link in g.nvlinks)]  # Blackwell: set per GPU
    if mode not in BW_MODE_SHARE or not any(link.get("active") for g in report.gpus for link in g.nvlinks):
        return findings
    return findings + [Finding("nvlink_bw_reduced", "warning", "nvlink", f"mode {mode}", "FULL",
                               f"the node's NVLink bandwidth mode is {mode}: peer-to-peer traffic uses {BW_MODE_SHARE[mode]}, "
                               "and NVLink bandwidth tests read low while every link is active; `nvidia-smi nvlink -sBwMode "
                               "FULL` (with the GPUs idle) if that was not meant")]


def _judge(subject: str, fabric) -> list[Finding]:
    state = fabric.state
    if state in ("not_supported", "unreadable"):  # no fabric; or NVML refused: fabric_unknown says unknown
        return []
    if state in NOT_READY:
        return [Finding("gpu_fabric_not_ready", "error", subject, f"NVLink fabric {NOT_READY[state]}", "completed",
                        f"{subject} NVLink fabric registration {NOT_READY[state]}: CUDA refuses work on it (error 802, "
                        "system not yet initialized) until Fabric Manager registers it. Seconds after Fabric "
                        f"Manager starts this completes; stuck, Fabric Manager is down or failing: {WHERE_TO_LOOK}")]
    if state == "completed" and not fabric.registered:
        return [Finding("gpu_fabric_not_ready", "error", subject, f"NVLink fabric {fabric.status}", "Success",
                        f"{subject} NVLink fabric registration failed ({fabric.status}): CUDA may start, but NVLink "
                        f"peer traffic fails or falls back to PCIe; {WHERE_TO_LOOK}, then reset the GPUs or reboot")]
    if state != "completed":
        return [Finding("gpu_fabric_unhealthy", "warning", subject, f"NVLink fabric {state}", "completed",
                        f"{subject} NVLink fabric state {state}, which this nodecheck does not know: "
                        f"`nvidia-smi -q -i {subject[3:]}` (its Fabric section)")]
    return _health(subject, fabric)


def is_grave(conditions: list[str]) -> bool:
    """Whether fabric health conditions put NVLink traffic at risk (an error), not only its bandwidth (a warning)."""
    return any(c in GRAVE or c.startswith("incorrect configuration") for c in conditions)


def _health(subject: str, fabric) -> list[Finding]:
    conditions = list(fabric.health)
    if fabric.health_summary in ("unhealthy", "limited_capacity"):
        conditions.insert(0, fabric.health_summary.replace("_", " "))
    if not conditions:
        return []
    grave = fabric.health_summary == "unhealthy" or is_grave(conditions)
    advice = (f"NVLink traffic through the fabric is at risk: {WHERE_TO_LOOK}, and `nvidia-smi nvlink -s`" if grave else
              "NVLink bandwidth may be below spec until it recovers: `nvidia-smi nvlink -s`; the bandwidth tests judge it")
    return [Finding("gpu_fabric_unhealthy", "error" if grave else "warning", subject,
                    f"NVLink fabric {', '.join(conditions)}", "healthy",
                    f"{subject} NVLink fabric {', '.join(conditions)}: {advice}")]


def fabric_unknown(report: Report) -> dict[str, str]:
    """A GPU with NVLinks whose fabric state NVML refused, or that this driver cannot be asked for (before
    nvmlDeviceGetGpuFabricInfo): the fabric registration is unknown."""
    for gpu in report.gpus:
        why = (f"gpu{gpu.index}: this driver or nvidia-ml-py has no nvmlDeviceGetGpuFabricInfo" if gpu.nvlinks and gpu.fabric is None
               else f"gpu{gpu.index}: NVML did not say its fabric state ({gpu.fabric.status})"
               if gpu.fabric is not None and gpu.fabric.state == "unreadable" else None)
        if why:
            return {GPU_FABRIC_NOT_READY.name: why, GPU_FABRIC_UNHEALTHY.name: why}
    return {}


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
GPU_FABRIC_NOT_READY = Kind("gpu_fabric_not_ready", "gpu", "{subject} {measured}", signal=True,
    doc=(
        ("error",
         "an NVSwitch node's GPU is not registered with the NVLink fabric (not started, in progress) or its registration failed"
         " (a status other than Success): CUDA refuses work on it with error 802 until Fabric Manager registers it. Unknown, "
         "not healthy, when a GPU with NVLinks cannot say its fabric state"),
    ))
GPU_FABRIC_UNHEALTHY = Kind("gpu_fabric_unhealthy", "gpu", "{subject} {measured}", signal=True,
    doc=(
        ("error, warning",
         "the fabric health NVML reports (newer drivers): an unhealthy summary, an unhealthy route, an incorrect configuration "
         "or a disconnected global fabric manager is an error; degraded bandwidth, limited capacity, a recovery in progress or "
         "a state this nodecheck does not know a warning"),
    ))
NVLINK_BW_REDUCED = Kind("nvlink_bw_reduced", "gpu", "NVLink bandwidth {measured}", signal=True,
    doc=(
        ("warning",
         "the node's NVLink bandwidth mode (NVML `nvmlSystemGetNvlinkBwMode`, `nvidia-smi nvlink -sBwMode`) is OFF, MIN, HALF "
         "or 3QUARTER on a node with active NVLinks (subject `nvlink`), or, on Blackwell, where the mode is set per GPU, a "
         "GPU's (`nvmlDeviceGetNvlinkBwMode`: not its best; subject `gpuN`, `measured` NVML's mode number; its Report "
         "`fabric.reduced_bw_mode`): peer traffic uses fewer links while every link reads active and the topology still says "
         "NV18; named in the verdict of a slow p2p or in-node all-reduce (a GPU's only in its own NVLink paths)"),
    ))

CHECK = Check((GPU_FABRIC_NOT_READY, GPU_FABRIC_UNHEALTHY), fabric_findings, needs="nvml", unknown=fabric_unknown)
BW_MODE = Check((NVLINK_BW_REDUCED,), bw_mode_findings, needs="nvml")
