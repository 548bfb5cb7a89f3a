"""Platform facts GPU traffic depends on: whether GPUDirect RDMA's peer-memory module is loaded
(nvidia_peermem, or the legacy nv_peer_mem), and how the IOMMU treats each device (its group's type:
identity passes DMA through; DMA and DMA-FQ translate every transaction, peer-to-peer and RDMA included),
with the IOMMU parameters of the kernel command line. Read through the host from sysfs and /proc, so a
snapshot records them."""

from __future__ import annotations

import re

from nodecheck.errors import NoData
from nodecheck.model import Platform
from nodecheck.probes.base import Probe

PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")
TRANSLATED = ("DMA", "DMA-FQ")  # /sys/kernel/iommu_groups/N/type; "identity" is pass-through
_IOMMU_PARAMS = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict")
MAX_GROUPS = 4096


def collect(host, timeout: float) -> Platform:
    modules = set(host.list_dir("/sys/module"))
    cmdline = host.read_text("/proc/cmdline")
    if not modules and cmdline is None:
        raise NoData("neither /sys/module nor /proc/cmdline could be read (a snapshot from before nodecheck recorded them)")
    peer_memory = next((m for m in PEER_MEMORY_MODULES if m in modules), None)
    iommu = {}
    for group in host.list_dir("/sys/kernel/iommu_groups")[:MAX_GROUPS]:
        kind = (host.read_text(f"/sys/kernel/iommu_groups/{group}/type") or "").strip()
        for device in host.list_dir(f"/sys/kernel/iommu_groups/{group}/devices"):
            iommu[device] = kind or "unknown"
    driver = host.read_text("/proc/driver/nvidia/version")
    open_modules = None if driver is None else "Open Kernel Module" in driver
    kernel = str(host.identity().get("kernel") or "")[:64] or None
    return Platform(peer_memory, bool(modules), iommu, parse_cmdline(cmdline or ""), open_modules, kernel,
                         dma_buf_capable(open_modules, kernel))


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
