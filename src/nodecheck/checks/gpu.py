"""One GPU's own facts (NVML), GPU by GPU: its PCIe link, NVLinks, NVLink-C2C, memory (ECC, row remapping),
power limit and MIG mode. Pure.

PCIe downtraining is decided on the link WIDTH. An idle GPU drops its PCIe generation to save
power (an H100 idles at gen 1 on a gen 5 link), so a low current generation is only reported when
the GPU is busy (utilization >= BUSY_UTILIZATION); otherwise the bandwidth test confirms it.
"""

from __future__ import annotations

from functools import partial

from nodecheck.assemble.nvlinks import usual_nvlinks, wired_nvlinks
from nodecheck.checks.base import Check, Kind
from nodecheck.checks.nvlink import NVLINK_COUNT_LOW, NVLINK_INACTIVE, nvlink_findings
from nodecheck.config import Config
from nodecheck.core.specs import BUSY_UTILIZATION
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def each_gpu(report: Report, config: Config) -> list[Finding]:
    """The checks of one GPU's own facts (NVML), GPU by GPU."""
    modes = [g.mig_enabled for g in report.gpus]
    mig = partial(_mig, most_whole=modes.count(False) > modes.count(True))
    nvlinks = partial(nvlink_findings, usual=usual_nvlinks(report), wired=wired_nvlinks(report, config))
    return [f for gpu in report.gpus for check in (_pcie, mig, nvlinks, _c2c, _memory, _power_limit) for f in check(gpu, config)]


def _pcie(gpu, config: Config) -> list[Finding]:
    pcie = gpu.pcie or {}
    subject, findings = f"gpu{gpu.index}", []
    width, width_max = pcie.get("width_current"), pcie.get("width_max")
    expected_width = config.pcie_width or width_max
    if width and expected_width and width < expected_width:
        findings.append(Finding("pcie_downtrained", "error", subject, f"x{width}", f"x{expected_width}",
                                f"{subject} PCIe x{width} < x{expected_width}: reseat the GPU or its riser, check the slot"))
    gen, gen_max = pcie.get("gen_current"), pcie.get("gen_max")
    if config.pcie_gen and gen_max and gen_max < config.pcie_gen:
        findings.append(Finding("pcie_downtrained", "error", subject, f"gen{gen_max}", f"gen{config.pcie_gen}",
                                f"{subject} PCIe link can reach gen {gen_max} only, gen {config.pcie_gen} expected: "
                                "check BIOS PCIe speed settings and the riser"))
    busy = (gpu.utilization_percent or 0) >= BUSY_UTILIZATION
    if busy and gen and gen_max and gen < gen_max and not gpu.c2c:  # over NVLink-C2C the PCIe link carries no host copy
        findings.append(Finding("pcie_downtrained", "warning", subject, f"gen{gen}", f"gen{gen_max}",
                                f"{subject} PCIe gen {gen} < gen {gen_max} while {gpu.utilization_percent}% busy: "
                                "confirm with `nodecheck bench --tests h2d`"))
    return findings


def _memory(gpu, config: Config) -> list[Finding]:
    """ECC off, and row remapping (NVIDIA's A100/H100 memory error handling): pending means the GPU must be
    reset for a remapping to take effect; failed means NVIDIA's guidance is to replace the GPU."""
    subject, findings = f"gpu{gpu.index}", []
    if gpu.ecc_enabled is False and config.ecc is not False:
        set_on = "ECC is set to on and waits for the GPU's reset" if gpu.ecc_pending else f"`nvidia-smi -i {gpu.index} -e 1`"
        findings.append(Finding("ecc_disabled", "error" if config.ecc else "warning", subject, "off", "on",
                                f"{subject} ECC is off: memory errors go undetected; {set_on}, "
                                "then reset the GPU (or set [gpus] ecc = false if that is intended)"))
    elif gpu.ecc_enabled and gpu.ecc_pending is False and config.ecc is not False:  # `nvidia-smi -e 0` awaiting a reset
        findings.append(Finding("ecc_disabled", "warning", subject, "off at the next reset", "on",
                                f"{subject} ECC is on now and set to off at the GPU's next reset or reboot, after which "
                                f"memory errors go undetected: `nvidia-smi -i {gpu.index} -e 1` keeps it on"))
    if gpu.remapped_rows_failed:
        findings.append(Finding("row_remap_failed", "error", subject, "failed", "none",
                                f"{subject} row remapping failed: NVIDIA's guidance is to replace the GPU"))
    if gpu.remapped_rows_pending:
        findings.append(Finding("row_remap_pending", "warning", subject, "pending", "none",
                                f"{subject} has a row remapping pending: reset the GPU when idle (`nvidia-smi -r -i {gpu.index}`)"))
    return findings


def _power_limit(gpu, config: Config) -> list[Finding]:
    """A power limit below the board's default (`nvidia-smi -pl`): said (info), since a busy GPU then runs on its
    power cap and the cap is no finding of its own; on purpose it may be, so it never fails a node."""
    limit, default = gpu.power_limit_w, gpu.power_limit_default_w
    if limit is None or not default or limit >= default:
        return []
    subject = f"gpu{gpu.index}"
    return [Finding("gpu_power_limit_lowered", "info", subject, f"{limit:g} W", f"{default:g} W",
                    f"{subject} power limit {limit:g} W, below its default {default:g} W: busy, it runs on its power cap; "
                    f"`nvidia-smi -i {gpu.index} -pl {default:g}` restores it, if it was not lowered on purpose")]


def _mig(gpu, config: Config, most_whole: bool = False) -> list[Finding]:
    """MIG mode: the driver enables no NVLink under it and CUDA has no peer-to-peer, so the GPU's NVLink checks
    and in-node bandwidth tests are skipped (they would read as a broken fabric). Said as info; a warning where most
    of the node's GPUs are not in MIG mode (`most_whole`: one GPU partitioned by mistake leaves a job of the whole
    node with slices and no NVLink); an error where `[gpus] mig` expects the other mode; a change waiting for the
    GPU's reset is a warning."""
    subject, findings, on = f"gpu{gpu.index}", [], gpu.mig_enabled
    if on is None:
        return []
    mode = "on" if on else "off"
    if config.mig is not None and on != config.mig:
        expected = "on" if config.mig else "off"
        findings.append(Finding("gpu_mig_mode", "error", subject, mode, expected,
                                f"{subject} MIG mode is {mode}, [gpus] mig expects {expected}: "
                                f"`nvidia-smi -i {gpu.index} -mig {int(config.mig)}`, then reset the GPU"))
    elif on and most_whole:
        findings.append(Finding("gpu_mig_mode", "warning", subject, "on", "off, as most of its siblings",
                                f"{subject} is in MIG mode, most of its siblings are not: a job of the whole node "
                                f"gets its slices and no NVLink to it; `nvidia-smi -i {gpu.index} -mig 0` and reset the GPU "
                                "if it was not partitioned on purpose (set [gpus] mig to require a mode)"))
    elif on:
        findings.append(Finding("gpu_mig_mode", "info", subject, "on", "-",
                                f"{subject} is in MIG mode: NVLink and GPU peer-to-peer are off by design, so its NVLink "
                                "checks and in-node bandwidth tests are skipped (set [gpus] mig to require a mode)"))
    if gpu.mig_pending is not None and gpu.mig_pending != on:
        pending = "on" if gpu.mig_pending else "off"
        findings.append(Finding("gpu_mig_mode", "warning", subject, f"{mode}, {pending} pending", pending,
                                f"{subject} MIG mode is {mode} until the GPU is reset, then {pending}: "
                                f"`nvidia-smi -r -i {gpu.index}` when idle"))
    return findings


def _c2c(gpu, config: Config) -> list[Finding]:
    """An NVLink-C2C link NVML says is not active: the GPU reaches its Grace CPU's memory over the others only
    (Azure's GB200 health checks fail a node on it: `nvidia-smi c2c -s` naming a link without its speed)."""
    down = (gpu.c2c or {}).get("inactive") or []
    if not down:
        return []
    subject, active = f"gpu{gpu.index}", gpu.c2c.get("links") or 0
    return [Finding("c2c_link_down", "error", subject, active, active + len(down),
                    f"{subject} NVLink-C2C link(s) {', '.join(map(str, down))} inactive: host copies run over {active} of "
                    f"{active + len(down)} links; check `nvidia-smi c2c -s -i {gpu.index}` and the kernel log for an Xid")]


def all_in_mig(report: Report) -> dict[str, str]:
    """Every GPU in MIG mode: the NVLink checks cannot look (the driver enables no NVLink under MIG)."""
    if report.gpus and all(g.mig_enabled for g in report.gpus):
        why = "every GPU is in MIG mode: the driver enables no NVLink under MIG"
        return {NVLINK_INACTIVE.name: why, NVLINK_COUNT_LOW.name: why}
    return {}


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
PCIE_DOWNTRAINED = Kind("pcie_downtrained", "gpu", "{subject} PCIe {measured} < {expected}",
    doc=(
        ("error",
         "width below max (or `gpus.pcie_width`); max generation below `gpus.pcie_gen`"),
        ("warning",
         "current generation below max while the GPU is busy"),
    ))
C2C_LINK_DOWN = Kind("c2c_link_down", "gpu", "{subject} C2C links {measured} < {expected}",
    doc=(
        ("error",
         "an NVLink-C2C link between the GPU and its Grace CPU (GH200, GB200, GB300) that NVML says is not active "
         "(`NVML_FI_DEV_C2C_LINK_GET_STATUS` 0) and not idling in low power (`NVML_FI_DEV_C2C_LINK_POWER_STATE`): host copies "
         "run over the others only"),
    ))
ECC_DISABLED = Kind("ecc_disabled", "gpu", "{subject} ECC off",
    doc=(
        ("warning; error with `[gpus] ecc = true`",
         "NVML says the GPU supports ECC and it is off (`[gpus] ecc = false` silences it; the message says where it is already "
         "set back to on and waits for a reset); also a warning while ECC is on but set to off at the GPU's next reset (NVML's "
         "pending mode, `nvidia-smi -e 0` awaiting a reboot: `measured` \"off at the next reset\")"),
    ))
ROW_REMAP_FAILED = Kind("row_remap_failed", "gpu", "{subject} row remapping failed",
    doc=(
        ("error",
         "a row remapping failed: NVIDIA's guidance is to replace the GPU"),
    ))
ROW_REMAP_PENDING = Kind("row_remap_pending", "gpu", "{subject} row remapping pending",
    doc=(
        ("warning",
         "a row remapping waits for a GPU reset"),
    ))
GPU_POWER_LIMIT_LOWERED = Kind("gpu_power_limit_lowered", "gpu", "{subject} power limit {measured} < {expected}",
    doc=(
        ("info",
         "the GPU's power limit in force is below the board's default (`nvidia-smi -pl`): busy, it runs on its power cap; never"
         " fails a node (it may be on purpose); `nodecheck fleet` and `NodecheckPowerLimitBelowPeers` compare it with the "
         "node's peers"),
    ))
GPU_MIG_MODE = Kind("gpu_mig_mode", "gpu", "{subject} MIG {measured}",
    doc=(
        ("info; warning where most of the node's GPUs are whole; error against `[gpus] mig`; warning when pending",
         "the GPU is in MIG mode (NVML `nvmlDeviceGetMigMode`): the driver enables no NVLink under MIG and CUDA has no "
         "peer-to-peer, so the GPU's NVLink checks (`nvlink_inactive`, `nvlink_count_low`, an NVLink pair of `[links]`) and its"
         " in-node bandwidth tests are skipped, and said. Where most of its siblings are not in MIG mode (one of eight), it was"
         " likely partitioned by mistake: a warning. An error where `[gpus] mig` expects the other mode; a warning while a mode"
         " change waits for the GPU's reset"),
    ))

CHECK = Check((PCIE_DOWNTRAINED, NVLINK_INACTIVE, NVLINK_COUNT_LOW, C2C_LINK_DOWN, ECC_DISABLED, ROW_REMAP_FAILED,
               ROW_REMAP_PENDING, GPU_POWER_LIMIT_LOWERED, GPU_MIG_MODE), each_gpu, needs="nvml", unknown=all_in_mig)
