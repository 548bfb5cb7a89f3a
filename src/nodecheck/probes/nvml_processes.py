"""The processes that hold a GPU, as NVML lists them (src/nodecheck/probes/nvml.py asks for each GPU), and who they are, as
/proc says:

- nvmlDeviceGetComputeRunningProcesses and nvmlDeviceGetGraphicsRunningProcesses: each process with a context on
  the GPU, its pid (the host's) and the GPU memory it holds (None where NVML cannot say: under MIG, in a VM);
- nvmlDeviceGetMemoryInfo (v2 where the driver has it): the memory in use, the driver's reservation apart, which
  a GPU keeps after its processes are gone only when a context outlived them;
- /proc/PID/stat and cgroup: its name (comm), state (D: stuck in the driver), parent, and the Slurm job it belongs
  to (Slurm's cgroup plugins put every task under a job_N cgroup: /slurm/uid_U/job_N/... with cgroup v1,
  .../slurmstepd.scope/job_N/... with v2). Its command line and environment are never read: they may hold secrets,
  and a snapshot keeps every file read.

A GPU in use before a job starts is judged in src/nodecheck/checks/gpu_processes.py."""

from __future__ import annotations

import re

from nodecheck.core.units import is_int

MAX_PROCESSES = 256  # per GPU and kind; more is no node's real state
MAX_ANCESTORS = 16  # how far up a process's parents are followed (to nodecheck, or a slurmstepd)
_JOB = re.compile(r"/job_(\d{1,12})(?:/|$)")
_STAT = re.compile(r"\d+ \((.{0,64})\) ([A-Za-z]) (-?\d+) ")  # pid (comm) state ppid: comm may hold spaces and ")"
KINDS = {"compute": "nvmlDeviceGetComputeRunningProcesses", "graphics": "nvmlDeviceGetGraphicsRunningProcesses"}


def dump_processes(pynvml, handle, ask) -> dict:
    """{"compute": [{pid, used_memory}], "graphics": [...]}, each list or {"error": ...}. ask: src/nodecheck/probes/nvml.py's _ask."""
    said = {}
    for kind, function in KINDS.items():
        listed = ask(pynvml, getattr(pynvml, function, None), handle)
        said[kind] = listed if isinstance(listed, dict) else [
            {"pid": getattr(p, "pid", None), "used_memory": getattr(p, "usedGpuMemory", None)} for p in listed[:MAX_PROCESSES]]
    return said


def dump_memory_used(pynvml, handle, ask, v1) -> dict:
    """{"used", "reserved"} in bytes: NVML's v2 memory info keeps the driver's reservation apart (`nvidia-smi -q`'s
    Reserved and Used); where the driver lacks v2, `v1` (the v1 answer the caller already has, or NVML's refusal):
    its used, which counts the reservation in, and reserved None."""
    version = getattr(pynvml, "nvmlMemory_v2", None)
    info = ask(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle, version) if version is not None else {"error": "no v2"}
    if not isinstance(info, dict):
        return {"used": info.used, "reserved": info.reserved}
    return v1 if isinstance(v1, dict) else {"used": v1.used, "reserved": None}


def parse_processes(raw, errors: dict[str, str]) -> list[dict] | None:
    """[{pid, type (compute, graphics, or both), memory_bytes}] of a dump_processes() answer, one per pid; None where
    NVML listed no compute processes (it refused: its reason into `errors`["processes"]; an older dump). Lenient: a
    malformed entry is left out."""
    if not isinstance(raw, dict):
        return None
    by_pid: dict[int, dict] = {}
    for kind in KINDS:
        listed = raw.get(kind)
        if isinstance(listed, dict) and "error" in listed:
            errors.setdefault("processes", str(listed["error"])[:200])
        for entry in listed[:MAX_PROCESSES] if isinstance(listed, list) else []:
            pid = entry.get("pid") if isinstance(entry, dict) else None
            if not is_int(pid) or not 0 < pid < 1 << 31:
                continue
            memory = entry.get("used_memory")
            memory = memory if is_int(memory) and 0 <= memory < 1 << 50 else None  # NVML's "not available" is 2^64-1
            known = by_pid.setdefault(pid, {"pid": pid, "type": kind, "memory_bytes": memory})
            if known["type"] != kind:
                known["type"], known["memory_bytes"] = "both", known["memory_bytes"] or memory
    return list(by_pid.values()) if isinstance(raw.get("compute"), list) else None


def parse_memory_used(raw) -> tuple[int | None, int | None]:
    """(used, reserved) bytes of a dump_memory_used() answer; None where NVML did not say."""
    raw = raw if isinstance(raw, dict) else {}
    used, reserved = raw.get("used"), raw.get("reserved")
    return (used if is_int(used) and 0 <= used < 1 << 50 else None,
            reserved if is_int(reserved) and 0 <= reserved < 1 << 50 else None)


def describe_owners(host, processes: list[dict], own_pid: int | None) -> None:
    """Each process's name, state, Slurm job and whether it is nodecheck's own (its pid or a descendant of
    `own_pid`: a bench's worker; or a process of the Slurm job nodecheck runs in: the job's other ranks), read from
    /proc through `host`; "gone": True where /proc has no such process (it ended since NVML listed it, or its
    context outlived it, or its pid is another namespace's). A process under a slurmstepd is a job's even where no
    cgroup says which (proctrack/linuxproc): job 0."""
    own_job = _job((host.read_text(f"/proc/{own_pid}/cgroup") or "")[:8192]) if own_pid and processes else None
    stats: dict[int, re.Match | None] = {}  # each pid's stat read once: the GPUs' processes share their parents

    def stat_of(pid: int) -> re.Match | None:
        if pid not in stats:
            stats[pid] = _STAT.match(host.read_text(f"/proc/{pid}/stat") or "")
        return stats[pid]

    for process in processes:
        stat = stat_of(process["pid"])
        if stat is None:
            process["gone"] = True
            continue
        process["name"], process["state"] = stat[1], stat[2]
        ancestors = _ancestors(stat_of, int(stat[3]))
        job = _job((host.read_text(f"/proc/{process['pid']}/cgroup") or "")[:8192])
        process["job"] = job if job is not None else (0 if "slurmstepd" in ancestors.values() else None)
        process["ours"] = own_pid is not None and (own_pid == process["pid"] or own_pid in ancestors
                                                   or own_job is not None and job == own_job)


def _job(cgroup: str) -> int | None:
    """The Slurm job of a /proc/PID/cgroup text: the job_N of any of its hierarchies; None outside every job."""
    for line in cgroup.splitlines():
        if found := _JOB.search(line):
            return int(found[1])
    return None


def _ancestors(stat_of, parent: int) -> dict[int, str]:
    """{pid: comm} of a process's parents, nearest first, up to init (MAX_ANCESTORS at most: a loop in a hostile
    snapshot ends there)."""
    found: dict[int, str] = {}
    while parent > 1 and parent not in found and len(found) < MAX_ANCESTORS:
        stat = stat_of(parent)
        if stat is None:
            break
        found[parent], parent = stat[1], int(stat[3])
    return found
