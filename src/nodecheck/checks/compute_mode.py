"""A GPU's compute mode (NVML's nvmlDeviceGetComputeMode, `nvidia-smi -c`): who may hold a context on it. Pure.

- prohibited: no process may: every job given the GPU fails at its first CUDA call ("all CUDA-capable devices
  are busy or unavailable") while every link and bandwidth figure nodecheck reads passes: an error, unless
  `[gpus] compute_mode` expects it;
- exclusive_process: one process at a time (what MPS asks for); a job of several processes per GPU, or one that
  finds a leftover process there, fails the same way. A site sets it on purpose on every GPU; set on some GPUs of
  a node and not the others, it is the odd ones that are wrong: a warning naming them;
- `[gpus] compute_mode` (default, exclusive_process, prohibited): a GPU in another mode is an error.
A mode NVML does not say leaves the check unknown for that GPU."""

from __future__ import annotations

from collections import Counter

from nodecheck.checks.base import Check, Kind
from nodecheck.checks.gpu_presence import unsaid
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def compute_mode_findings(report: Report, config) -> list[Finding]:
    modes = {g.index: g.compute_mode for g in report.gpus if g.compute_mode is not None}
    expected = config.compute_mode
    usual, count = Counter(modes.values()).most_common(1)[0] if modes else (None, 0)
    most = count * 2 > len(modes)  # the usual mode is most GPUs': an odd one out is the wrong one
    findings = []
    for index, mode in modes.items():
        subject = f"gpu{index}"
        fix = f"`nvidia-smi -i {index} -c {(expected or 'default').upper()}`"
        if expected is not None and mode != expected:
            findings.append(Finding("gpu_compute_mode", "error", subject, mode, expected,
                                    f"{subject} compute mode {mode}, [gpus] compute_mode expects {expected}: {fix}"))
        elif expected is None and mode == "prohibited":
            findings.append(Finding("gpu_compute_mode", "error", subject, mode, "default",
                                    f"{subject} compute mode prohibited: no process may use it, so every job given it "
                                    f"fails (\"all CUDA-capable devices are busy or unavailable\"): {fix}"))
        elif expected is None and mode != usual and most:
            findings.append(Finding("gpu_compute_mode", "warning", subject, mode, usual,
                                    f"{subject} compute mode {mode} where the node's other GPUs are {usual}: "
                                    f"`nvidia-smi -i {index} -c {usual.upper()}`, or set [gpus] compute_mode"))
    return findings


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
GPU_COMPUTE_MODE = Kind("gpu_compute_mode", "gpu", "{subject} compute mode {measured}, {expected} expected",
    doc=(
        ("error, warning",
         "the GPU's compute mode (NVML `nvmlDeviceGetComputeMode`, `nvidia-smi -q`'s \"Compute Mode\"): `prohibited` is an "
         "error (no process may hold a context: every job given the GPU fails with \"all CUDA-capable devices are busy or "
         "unavailable\" while its links pass); a GPU in another mode than most of the node's GPUs (one left in "
         "`exclusive_process`) a warning; with `[gpus] compute_mode` set, any other mode an error. Unknown (never healthy) "
         "where NVML does not say for a GPU"),
    ))

CHECK = Check((GPU_COMPUTE_MODE,), compute_mode_findings, needs="nvml",
              unknown=lambda report: unsaid(report, GPU_COMPUTE_MODE, "compute_mode", "compute mode"))
