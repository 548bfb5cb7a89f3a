"""NVLink slots against what should be up. Pure: no I/O.

NVML lists every NVLink slot of the chip and answers NVML_FEATURE_DISABLED for a slot no bridge is wired to as for a
link that went down, so a down slot is a fault only where something says that link should be up (wired_nvlinks)."""

from __future__ import annotations

from nodecheck.checks.base import Kind
from nodecheck.config import Config
from nodecheck.report.findings import Finding


def nvlink_findings(gpu, config: Config, usual: dict[str, int] | None = None,
             wired: dict[int, tuple[int, str]] | None = None) -> list[Finding]:
    """Links down against what should be up (wired_nvlinks): the slots past that are not wired."""
    subject = f"gpu{gpu.index}"
    if gpu.mig_enabled:
        return []  # no NVLink under MIG (_mig says so)
    inactive = [l["link"] for l in gpu.nvlinks if l["active"] is False]
    unread = [l for l in gpu.nvlinks if l["active"] is None]
    active = len(gpu.nvlinks) - len(inactive) - len(unread)
    expected, why = (wired or {}).get(gpu.index, (None, ""))
    findings = []
    if expected is not None and inactive and active + len(unread) < expected:
        findings.append(Finding("nvlink_inactive", "error", subject, active, expected,
                                f"{subject} {active} of {expected} NVLinks active ({why}); slot(s) "
                                f"{', '.join(map(str, inactive))} inactive: check `nvidia-smi nvlink -s`, the NVLink "
                                "bridges, fabric manager, and the NVSwitch tray"))
    elif unread and (expected is None or active < expected):  # NVML failed to say (Unknown Error): never counted up
        findings.append(Finding("nvlink_inactive", "warning", subject, active, expected or len(gpu.nvlinks),
                                f"{subject} NVLink link(s) {', '.join(str(l['link']) for l in unread)}: NVML could "
                                f"not read their state ({unread[0].get('error', 'state unknown')}); check "
                                "`nvidia-smi nvlink -s` and the kernel log for an Xid"))
    siblings = (usual or {}).get(gpu.name or "", 0)
    if config.nvlinks_per_gpu and gpu.pcie is not None and active < config.nvlinks_per_gpu:
        findings.append(Finding("nvlink_count_low", "error", subject, active, config.nvlinks_per_gpu,
                                f"{subject} has {active} active NVLinks, {config.nvlinks_per_gpu} expected"))
    elif not config.nvlinks_per_gpu and len(gpu.nvlinks) < siblings:  # a link NVML no longer lists is not "inactive"
        findings.append(Finding("nvlink_count_low", "warning", subject, len(gpu.nvlinks), siblings,
                                f"{subject} lists {len(gpu.nvlinks)} NVLinks, most of its siblings ({gpu.name}) {siblings}: "
                                f"NVML no longer reports {siblings - len(gpu.nvlinks)} of its links, and its NVLink traffic "
                                "runs on the rest; check `nvidia-smi nvlink -s` and the kernel log for an Xid, and set [gpus] "
                                "nvlinks_per_gpu to make this an error"))
    return findings


# the finding kinds nvlink_findings raises (the gpu family's check, checks/gpu.py, runs it)
NVLINK_INACTIVE = Kind("nvlink_inactive", "gpu", "{subject} NVLinks active {measured} < {expected}",
    doc=(
        ("error; warning where NVML only failed to say",
         "fewer of the GPU's NVLinks are active (`nvmlDeviceGetNvLinkState`) than should be (`nvlinks_wired`): NVML lists every"
         " slot of the chip and answers disabled for a slot no bridge reaches (an H100 NVL or H100 PCIe with its three bridges "
         "uses 12 of 18, links 4, 5, 10, 11, 16, 17 inactive by design; an A100 PCIe without a bridge lists 12, all inactive), "
         "so an inactive slot is a fault only against what should be up: `[gpus] nvlinks_per_gpu`, the NV# pairs of the "
         "config's `[links]` or of `nvidia-smi topo -m` (summed over a mesh's pairs; on an NVSwitch board, where each pair "
         "reads all of the GPU's links, one pair's: NV8 on H800 and A800 boards), the board's bridges once one of its links is up "
         "(`src/nodecheck/core/data/specs.toml` `[[nvlink_boards]]`), or the most a sibling of the same model has up (not for a"
         " bridged card with none up: no bridge). A GPU nothing links by NVLink, and a one-GPU VM whose NVLink peers are "
         "outside it, get none. A link whose per-link field state (`NVML_FI_DEV_NVLINK_GET_STATE`) is "
         "`NVML_NVLINK_STATE_SLEEP`, trained and idle at low power, counts as active. A link NVML answers with another error "
         "than Not Supported or Invalid Argument (Unknown Error, GPU is lost) is listed with `active: null` and NVML's words: a"
         " warning, and never counted active (against `nvlinks_per_gpu` it is missing)"),
    ))
NVLINK_COUNT_LOW = Kind("nvlink_count_low", "gpu", "{subject} NVLinks {measured} < {expected}",
    doc=(
        ("error; warning without `[gpus] nvlinks_per_gpu`",
         "fewer active links than `gpus.nvlinks_per_gpu`; without it, a GPU for which NVML lists fewer NVLinks than most of the"
         " node's GPUs of its model (more than half of them; MIG aside): a link NVML no longer reports is not \"inactive\", and"
         " its traffic runs on the rest (`measured` the links listed, `expected` the siblings')"),
    ))
