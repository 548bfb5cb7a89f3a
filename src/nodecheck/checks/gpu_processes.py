"""A GPU in use before a job starts: the prolog's judgment of the processes holding the node's GPUs. Pure.

The prolog runs before the job's first task, so a process on a GPU then is left over from an earlier job (one that
escaped its cgroup, or hangs in the driver and cannot be killed) or was started outside Slurm: the job gets less
memory than it asked for and shares the GPU's time, and its bandwidth tests measure the contention, not the links.

- gpu_in_use (error): a compute process outside every Slurm job (no job_N in its cgroup), not nodecheck's own, not
  named in [prolog] gpu_process_allow. A process of another job is not judged: on a node shared by several jobs
  (one GPU each, MPS, shards) it is that job's. A display server's graphics context is not judged either.
- gpu_process_gone (warning): NVML lists a pid that /proc does not have: it ended just now, or its context outlived
  it, which a reset of the GPU clears.
- gpu_memory_held (warning): memory in use with no process listed (the driver's reservation apart), as a context
  that outlived its process leaves it; not judged under MIG, whose instances' processes the GPU's list may not show,
  nor where NVML refused the list.

The health check judges them only on a node Slurm says runs no job (so it neither resumes a node the prolog
drained for one nor waits for the next job to find it); the exporter and `inspect` publish them and judge none:
under a running job they may be the job's."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

# in use with no process: an idle H100 said 0 MiB (../shared/captures/h100-pcie-vm), and 0 to 3.3 MiB from one read
# to the next (tests/fixtures/h100-vm-signals)
MEMORY_HELD_BYTES = 1 << 30
GIB = 1 << 30


def before_job(report: Report, job: int | None, allowed: list[str]) -> list[Finding]:
    """The findings of the node's GPUs holding processes before job `job` (SLURM_JOB_ID, named in the message)
    starts; `allowed`: process names that may hold a GPU outside any job (an MPS server run as a service)."""
    findings = []
    names = {name[:15] for name in allowed}  # /proc/PID/comm keeps 15 characters of a name
    for gpu in report.gpus:
        subject = f"gpu{gpu.index}"
        foreign = [p for p in gpu.processes or [] if not p.ours and p.job is None and p.type != "graphics"]
        stray = [p for p in foreign if not p.gone and p.name not in names]
        gone = [p for p in foreign if p.gone]
        if stray:
            first = stray[0]
            held = sum(p.memory_bytes or 0 for p in stray)
            findings.append(Finding(
                "gpu_in_use", "error", subject, _describe(first) + (f" (+{len(stray) - 1} more)" if len(stray) > 1 else ""),
                "no process before the job",
                f"{subject} is held by {len(stray)} process(es) outside any Slurm job "
                f"{f'before job {job} starts' if job else 'while no job runs here'} "
                f"({', '.join(_describe(p) for p in stray[:4])}; {held / GIB:.1f} GiB): kill {'them' if len(stray) > 1 else 'it'}"
                + ("; one stuck in the driver (state D) will not die: reset the GPU or reboot the node"
                   if any(p.state == "D" for p in stray) else "")
                + (" (in exclusive_process compute mode the job cannot even open the GPU)" if gpu.compute_mode == "exclusive_process" else "")
                + " (a service that holds the GPU on purpose goes in [prolog] gpu_process_allow)"))
        if gone:
            findings.append(Finding(
                "gpu_process_gone", "warning", subject, f"pid {gone[0].pid}", "a live process",
                f"{subject}: NVML lists pid(s) {', '.join(str(p.pid) for p in gone[:4])} that /proc does not have: "
                "ended just now, or a context that outlived its process; if it stays, reset the GPU "
                f"(`nvidia-smi -r -i {gpu.index}`)"))
        held = gpu.memory_used_bytes
        if gpu.processes == [] and not gpu.mig_enabled and held is not None and held >= MEMORY_HELD_BYTES:
            findings.append(Finding(
                "gpu_memory_held", "warning", subject, f"{held / GIB:.1f} GiB", "none with no process",
                f"{subject} has {held / GIB:.1f} GiB in use and no process listed: a context that outlived its "
                f"process holds it; the job gets that much less; reset the GPU (`nvidia-smi -r -i {gpu.index}`)"))
    return findings


def _describe(process) -> str:
    memory = f", {process.memory_bytes / GIB:.1f} GiB" if process.memory_bytes is not None else ""
    state = f", state {process.state}" if process.state and process.state not in "RS" else ""
    return f"pid {process.pid} {process.name or '?'}{state}{memory}"


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
GPU_IN_USE = Kind("gpu_in_use", "gpu", "{subject} held outside any job: {measured}",
    doc=(
        ("error",
         "prolog (before the job starts) and health check (on a node Slurm says runs no job, so that it neither resumes a node "
         "the prolog drained for this nor waits for a job to find it): a compute process outside every Slurm job (no `job_N` in"
         " its cgroup), not nodecheck's own and not named in `[prolog] gpu_process_allow` (default `nvidia-cuda-mps-server`), "
         "holds the GPU: left over from an earlier job or started outside Slurm; `measured` names the first (`pid 4242 python3,"
         " state D, 30.0 GiB`), the message says to kill it, or to reset the GPU where it is stuck in the driver (state D). A "
         "process of another job is never judged (a shared node, MPS, shards), nor a graphics-only one"),
    ))
GPU_PROCESS_GONE = Kind("gpu_process_gone", "gpu", "{subject} lists {measured}, not in /proc",
    doc=(
        ("warning",
         "as `gpu_in_use`: NVML lists a pid `/proc` does not have: it ended just now, or its context outlived it (a reset of "
         "the GPU clears it)"),
    ))
GPU_MEMORY_HELD = Kind("gpu_memory_held", "gpu", "{subject} {measured} held with no process",
    doc=(
        ("warning",
         "as `gpu_in_use`: 1 GiB or more of the GPU's memory in use (the driver's reservation apart) with no process listed, "
         "not in MIG mode: a context that outlived its process holds it"),
    ))

CHECK = Check((GPU_IN_USE, GPU_PROCESS_GONE, GPU_MEMORY_HELD), made_by="`nodecheck prolog`/`healthcheck`")
