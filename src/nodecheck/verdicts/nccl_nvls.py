"""NCCL failing to set up NVLink SHARP (NVLS) on a node (bench.nccl_nvls): the communicator's init failed with
ncclUnhandledCudaError, so every job that NCCL gives NVLS (its default on an NVSwitch board of Hopper or later) fails
there. NCCL's own words for it (src/transport/nvls.cc): "This is usually caused by a system or configuration error in
the Fabric Manager or NVSwitches"; NVIDIA's answer on H800 (NVIDIA/nccl#1338): "typically ... caused by the fabric
manager not being restarted correctly", and on H100 (#1488): after Fabric Manager is stopped and started again the GPUs
must be reset. Pure: no I/O."""

from __future__ import annotations

from nodecheck.core.units import first_of
from nodecheck.report.findings import Finding

# what the CUDA driver API's codes NCCL prints mean (cuda.h's CUresult): the failures published NVLS logs hold
CUDA_ERRORS = {1: "CUDA_ERROR_INVALID_VALUE", 401: "CUDA_ERROR_ILLEGAL_STATE", 802: "CUDA_ERROR_SYSTEM_NOT_READY"}
RECOVERY = ("`systemctl status nvidia-fabricmanager` and `journalctl -u nvidia-fabricmanager` (was it stopped, killed "
            "or restarted?), the Fabric section of `nvidia-smi -q`; then stop every GPU client (jobs, DCGM, the device "
            "plugin) and Fabric Manager, reset the GPUs and NVSwitches (`nvidia-smi -r`) and start Fabric Manager again "
            "(the Fabric Manager user guide's order; a restart without the reset does not recover), or reboot. "
            "NCCL_NVLS_ENABLE=0 lets jobs run meanwhile, without the switches' in-network reduction")


def nvls_findings(run) -> list[Finding]:
    """One error naming the hosts whose NCCL could not set up NVLS and the commonest CUDA error, or nothing."""
    errors = run.nvls_errors
    if not errors:
        return []
    hosts = list(dict.fromkeys(e["host"][:60] or "a host the log does not name" for e in errors))
    top = max(errors, key=lambda e: e["count"])
    said = f"CUDA error{'' if top['code'] is None else ' ' + str(top['code'])} '{top['error']}'"
    name = f" ({CUDA_ERRORS[top['code']]})" if top["code"] in CUDA_ERRORS else ""
    lines = sum(e["count"] for e in errors)
    return [Finding("nccl_nvls_failed", "error", first_of(hosts, 3), f"{said} x{top['count']}", "NVLS set up",
                    f"NCCL could not set up NVLink SHARP (NVLS) multicast on {first_of(hosts, 3)} ({said}{name}, {lines} "
                    "WARN line(s) of its NVLS transport): the communicator failed to initialise, and so does every job "
                    "given NVLS there. NCCL, of a multicast bind that fails: \"usually caused by a system or configuration "
                    f"error in the Fabric Manager or NVSwitches\". On that node: {RECOVERY}")]
