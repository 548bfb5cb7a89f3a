"""The platform under GPUDirect: its peer-memory module and IOMMU translation on the GPUs' and RDMA NICs'
groups. Pure."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.core.pci import normal_pci
from nodecheck.core.specs import no_gpudirect_rdma
from nodecheck.probes.platform import TRANSLATED
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def platform_findings(report: Report, config: Config) -> list[Finding]:
    """GPUDirect RDMA without its peer-memory module, and IOMMU translation on a GPU's or an RDMA NIC's
    group (NCCL's troubleshooting guide: both slow or break inter-node and peer-to-peer traffic)."""
    facts = report.platform
    findings = []
    rdma = report.rdma_nics_up()
    designed = no_gpudirect_rdma([g.name for g in report.gpus])  # DGX Spark: nothing to load
    if report.gpus and rdma and facts and facts.modules_known and not facts.peer_memory and facts.dma_buf is not True \
            and not designed:
        why = "and the driver's proprietary kernel modules" if facts.open_kernel_modules is False else \
            f"and kernel {facts.kernel} is older than 5.12" if facts.dma_buf is False else \
            "and DMA-BUF support is unknown"
        findings.append(Finding("gpudirect_rdma_unavailable", "warning", "node", "not loaded", "nvidia_peermem",
                                f"GPUDirect RDMA: neither nvidia_peermem nor nv_peer_mem is loaded, {why} cannot give NICs "
                                "DMA-BUF access to GPU memory: inter-node data bounces through host memory; "
                                "`modprobe nvidia_peermem`, or the open kernel modules on Linux >= 5.12"))
    groups = report.iommu_modes()
    devices = [(f"gpu{g.index}", g.pci_bus_id) for g in report.gpus] + [(n.name, n.pci_address) for n in rdma]
    for subject, pci in devices:
        kind = groups.get(normal_pci(pci))
        if kind in TRANSLATED:
            cmdline = " ".join(facts.iommu_cmdline if facts else []) or "no iommu parameter"
            findings.append(Finding("iommu_translated", "warning", subject, kind, "identity",
                                    f"{subject}'s IOMMU group translates its DMA ({kind}; kernel command line: {cmdline}): "
                                    "peer-to-peer and RDMA traffic pays for it; boot with iommu=pt (or the group in "
                                    "identity mode)"))
    return findings


def platform_unknown(report: Report) -> dict[str, str]:
    platform = report.platform
    if platform is None:
        return {GPUDIRECT_RDMA_UNAVAILABLE.name: "platform probe: no data", IOMMU_TRANSLATED.name: "platform probe: no data"}
    if not platform.modules_known:
        return {GPUDIRECT_RDMA_UNAVAILABLE.name: "kernel modules unknown"}
    return {}


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
GPUDIRECT_RDMA_UNAVAILABLE = Kind("gpudirect_rdma_unavailable", "fabric", "no GPUDirect RDMA peer-memory module",
    doc=(
        ("warning",
         "GPUs and an ACTIVE RDMA NIC, neither `nvidia_peermem` nor `nv_peer_mem` loaded (`/sys/module`), and DMA-BUF not known"
         " to be possible (proprietary kernel modules, Linux older than 5.12, or unknown): inter-node data bounces through host"
         " memory. Not on a node whose GPUs give NICs no GPUDirect RDMA by design (DGX Spark's GB10: specs.toml "
         "`[[no_gpudirect_rdma]]`), where nothing loaded would change it"),
    ))
IOMMU_TRANSLATED = Kind("iommu_translated", "fabric", "{subject} IOMMU {measured}",
    doc=(
        ("warning",
         "a GPU's or an RDMA NIC's IOMMU group is of type `DMA` or `DMA-FQ` (translated), not `identity` (subject: the GPU or "
         "NIC)"),
    ))

CHECK = Check((GPUDIRECT_RDMA_UNAVAILABLE, IOMMU_TRANSLATED), platform_findings, unknown=platform_unknown)
