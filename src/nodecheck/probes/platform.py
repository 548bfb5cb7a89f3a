"""Platform facts GPU traffic depends on: whether GPUDirect RDMA's peer-memory module is loaded
(nvidia_peermem, or the legacy nv_peer_mem), and how the IOMMU treats each device (its group's type:
identity passes DMA through; DMA and DMA-FQ translate every transaction, peer-to-peer and RDMA included),
with the IOMMU parameters of the kernel command line, and the node's /etc/nccl.conf as NCCL reads it. Read
through the host from sysfs, /proc and /etc, so a snapshot records them."""

from __future__ import annotations

import re

from nodecheck.core.errors import NoData
from nodecheck.probes.base import Probe
from nodecheck.report.model import Platform

PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")
TRANSLATED = ("DMA", "DMA-FQ")  # /sys/kernel/iommu_groups/N/type; "identity" is pass-through
_IOMMU_PARAMS = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict")
MAX_GROUPS = 4096
MAX_IOMMU_DEVICES = 16_384  # devices listed in all groups together
NCCL_CONF = "/etc/nccl.conf"  # what every NCCL job on the node reads, unless its environment says otherwise
MAX_NCCL_CONF_LINES = 256
_NCCL_CONF_FIELD = 1023  # NCCL copies a name and a value into 1024-byte buffers


def collect(host, timeout: float) -> Platform:
    modules = set(host.list_dir("/sys/module"))
    cmdline = host.read_text("/proc/cmdline")
    conf = host.read_text(NCCL_CONF)
    if not modules and cmdline is None and conf is None:
        raise NoData("neither /sys/module, /proc/cmdline nor /etc/nccl.conf could be read (a snapshot from before "
                     "nodecheck recorded them)")
    peer_memory = next((m for m in PEER_MEMORY_MODULES if m in modules), None)
    iommu = {}
    for group in host.list_dir("/sys/kernel/iommu_groups")[:MAX_GROUPS]:
        if len(iommu) >= MAX_IOMMU_DEVICES:  # a node's PCI functions: thousands; a hostile tree, groups x names
            break
        kind = (host.read_text(f"/sys/kernel/iommu_groups/{group}/type") or "").strip()
        for device in host.list_dir(f"/sys/kernel/iommu_groups/{group}/devices")[:MAX_IOMMU_DEVICES - len(iommu)]:
            iommu[device] = kind or "unknown"
    driver = host.read_text("/proc/driver/nvidia/version")
    open_modules = None if driver is None else "Open Kernel Module" in driver
    kernel = str(host.identity().get("kernel") or "")[:64] or None
    return Platform(peer_memory, bool(modules), iommu, parse_cmdline(cmdline or ""), open_modules, kernel,
                    dma_buf_capable(open_modules, kernel), nccl_conf=None if conf is None else parse_nccl_conf(conf))


def parse_nccl_conf(text: str) -> dict[str, str]:
    """/etc/nccl.conf as NCCL reads it (src/misc/param.cc, setEnvFile): each line split at its first '=' into a
    name and a value, nothing stripped but the line's end ("\n", then "\r"): `NCCL_IB_HCA = mlx5` sets
    "NCCL_IB_HCA "; lines starting with '#' and lines without '=' skipped; a name set twice keeps its first value
    (NCCL's setenv does not overwrite). Bounded: the first MAX_NCCL_CONF_LINES names, each field cut at 1023."""
    conf: dict[str, str] = {}
    for line in text.split("\n"):
        line = line.split("\x00", 1)[0]  # C strings end there
        line = line[:-1] if line.endswith("\r") else line
        name, equals, value = line.partition("=")
        if line.startswith("#") or not equals or not name:
            continue
        conf.setdefault(name[:_NCCL_CONF_FIELD], value[:_NCCL_CONF_FIELD])
        if len(conf) >= MAX_NCCL_CONF_LINES:
            break
    return conf


def dma_buf_capable(open_modules: bool | None, kernel: str | None) -> bool | None:
    """GPUDirect RDMA through DMA-BUF: open kernel modules on Linux 5.12 or later; None when either is unknown."""
    release = re.match(r"^(\d+)\.(\d+)", kernel or "")
    if open_modules is None or release is None:
        return None
    return open_modules and (int(release[1]), int(release[2])) >= (5, 12)


def parse_cmdline(text: str) -> list[str]:
    """The IOMMU parameters of a kernel command line, as written."""
    return [word for word in text.split() if word.split("=", 1)[0] in _IOMMU_PARAMS][:32]


def fill(report, facts: Platform) -> None:
    report.platform = facts


PROBE = Probe("platform", collect, 5.0, fill)
