"""Binding a bench worker to its GPU's CPUs, within what this process may use.

Slurm (ConstrainCores), a Kubernetes pod or `taskset` may confine nodecheck to some CPUs; asking for
CPUs outside that set fails (EINVAL) or is silently narrowed by the kernel. So the worker binds to the
intersection of the GPU's CPUs and its own affinity, runs unbound when they do not meet, and records
the mask it actually used."""

from __future__ import annotations

import os

from nodecheck.units import format_cpulist, parse_cpulist


def bind_to_gpu_cpus(gpu_cpus: str) -> dict:
    """{"cpus": the cpulist in force after binding, "requested": gpu_cpus, "note": why it differs or None}."""
    allowed = os.sched_getaffinity(0)
    if not gpu_cpus:
        return {"cpus": format_cpulist(allowed), "requested": None, "note": "the GPU's CPUs are unknown: not bound"}
    wanted = set(parse_cpulist(gpu_cpus))
    usable = wanted & allowed
    if not usable:
        return {"cpus": format_cpulist(allowed), "requested": gpu_cpus,
                "note": f"none of the GPU's CPUs ({gpu_cpus}) is in this process's allowed set "
                        f"({format_cpulist(allowed)}: a cgroup, cpuset or taskset): ran unbound"}
    os.sched_setaffinity(0, usable)
    note = None if usable == wanted else (f"bound to {format_cpulist(usable)}, the part of the GPU's CPUs ({gpu_cpus}) "
                                          f"this process may use")
    return {"cpus": format_cpulist(os.sched_getaffinity(0)), "requested": gpu_cpus, "note": note}
