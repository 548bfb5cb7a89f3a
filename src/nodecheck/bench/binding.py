"""Binding a bench worker to its GPU's CPUs, within what this process may use.

Slurm (ConstrainCores), a Kubernetes pod or `taskset` may confine nodecheck to some CPUs; asking for
CPUs outside that set fails (EINVAL) or is silently narrowed by the kernel. So the worker binds to the
intersection of the GPU's CPUs and its own affinity, runs unbound when they do not meet, and records
the mask it actually used."""

from __future__ import annotations

import os
import re

from nodecheck.core.units import format_cpulist, parse_cpulist


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


_NODE_PAGES = re.compile(r"(?<!\S)N(\d+)=(\d+)(?!\S)")  # numa_maps: pages of this mapping on node N
MAX_PROC_MAPS = 16 << 20  # /proc/self/maps and numa_maps of a worker: a few hundred KiB; a bound all the same


def buffer_numa_node(address: int, maps: str = "/proc/self/maps", numa_maps: str = "/proc/self/numa_maps") -> int | None:
    """The NUMA node holding most of the pages of the mapping that contains `address` (a host buffer's
    data pointer), from the kernel's own accounting (numa_maps' N<node>=<pages>); None when the kernel
    does not say (no NUMA support, pages not touched yet, a mapping it does not list)."""
    try:
        with open(maps) as file:
            ranges = file.read(MAX_PROC_MAPS).splitlines()
        with open(numa_maps) as file:
            placements = file.read(MAX_PROC_MAPS).splitlines()
    except OSError:
        return None
    start = None
    for line in ranges:
        low, _, high = line.partition(" ")[0].partition("-")
        try:
            if int(low, 16) <= address < int(high, 16):
                start = int(low, 16)
                break
        except ValueError:
            continue
    for line in placements if start is not None else []:
        head, _, rest = line.partition(" ")
        try:
            if int(head, 16) != start:
                continue
        except ValueError:
            continue
        pages = _NODE_PAGES.findall(rest)
        return max((int(count), int(node)) for node, count in pages)[1] if pages else None
    return None
