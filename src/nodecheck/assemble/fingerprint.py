"""A node's fingerprint: what every node of one type should share, so a fleet can find the one that differs
(issue 24). Pure: reads the Report.

- sku: the node type, its GPU model and count ("8x NVIDIA H100 80GB HBM3"; "no GPU"); GPUs in MIG mode count apart
  ("8x NVIDIA H100 80GB HBM3 (MIG)"): without NVLink, such a node is no peer of the others.
- driver, cuda: the NVIDIA driver version, and the CUDA version that driver supports (NVML).
- vbios: the GPUs' VBIOS versions (NVML), each once, sorted, comma-separated.
- nic_firmware: the RDMA NICs' firmware versions (sysfs fw_ver), each once, sorted, comma-separated.
- kernel: the running kernel's release.
- topology: 12 hex digits of a SHA-256 over what must be identical across a type (topology_facts): two nodes of
  one type with different hashes differ in something `nodecheck inspect` shows.
- nccl_conf: 12 hex digits of a SHA-256 over /etc/nccl.conf as NCCL reads it (src/nodecheck/probes/platform.py); empty when the
  node has none. One node apart from its type runs every job with other NCCL settings (another NCCL_IB_GID_INDEX
  on RoCE, and its connections to the others fail).
- roce_gid: the GID index NCCL takes by itself on each active RoCE rail (src/nodecheck/checks/roce.py), each once, sorted,
  comma-separated; empty without RoCE. Jobs that pin NCCL_IB_GID_INDEX (as RoCE guides say to) use the same index
  on every node: one whose routable GID sits at another (an extra address on the rail) fails their connections.

Labels stay bounded: versions and a hash, never an address or a per-run value.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass

from nodecheck.assemble.roce_gid import nccl_roce_ports
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

MIG = " (MIG)"  # after a GPU's name in the sku, for a GPU in MIG mode
FIELDS = ("sku", "driver", "cuda", "vbios", "nic_firmware", "kernel", "topology", "nccl_conf", "roce_gid")


@dataclass(frozen=True)
class Fingerprint:
    sku: str
    driver: str
    cuda: str
    vbios: str
    nic_firmware: str
    kernel: str
    topology: str
    nccl_conf: str = ""
    roce_gid: str = ""

    def labels(self) -> dict[str, str]:
        return asdict(self)


def sku(report: Report) -> str:
    # a GPU in MIG mode is another type of node: no NVLink, its bandwidth in slices
    names = Counter((g.name or "unknown GPU") + (MIG if g.mig_enabled else "") for g in report.gpus)
    if not names:
        return "no GPU"
    return " + ".join(f"{count}x {name}" for name, count in names.most_common())


def topology_facts(report: Report) -> dict:
    """What the topology hash covers, field by field (docs/metrics.md):
    gpu_links     each GPU pair's link type from `nvidia-smi topo -m` (NV18, PXB, SYS ...), by GPU index
    gpu_nic_links each GPU's link types to the NICs, sorted (NIC names may differ between nodes of one type)
    gpu_numa      each GPU's NUMA node
    cpu           CPU packages, NUMA nodes and logical CPUs (hwloc)
    nics          each physical NIC's kind and speed in Mb/s, sorted
    pcie          each GPU's PCIe max generation and max width (NVML)
    nvlinks       each GPU's NVLink count and how many are active (NVML)
    compute_mode  each GPU's compute mode (NVML), only where one is not default: a node left in exclusive_process
                  among default peers fails jobs of several processes per GPU, though alike within itself; the
                  default leaves the hash as nodecheck versions before this one computed it (no drift in a rollout)"""
    gpus = sorted(report.gpus, key=lambda g: g.index)
    gpu_indices = {g.index for g in gpus}
    modes = [g.compute_mode for g in gpus]
    gpu_links, nic_links = [], {}  # one pass over the links (a fleet views thousands of Reports)
    for link in report.links:
        if isinstance(link.b, str):
            nic_links.setdefault(link.a, []).append(link.type)
        elif isinstance(link.a, int) and link.a in gpu_indices and link.b in gpu_indices:
            gpu_links.append([min(link.a, link.b), max(link.a, link.b), link.type])
    return ({"compute_mode": modes} if any(m not in (None, "default") for m in modes) else {}) | {
        "gpu_links": sorted(gpu_links),
        "gpu_nic_links": [sorted(nic_links.get(g.index, ())) for g in gpus],
        "gpu_numa": [g.numa_node for g in gpus],
        "cpu": [report.cpu.packages, report.cpu.numa_nodes, report.cpu.pus] if report.cpu else None,
        "nics": sorted([n.kind, n.speed_mbps or 0] for n in report.nics if not n.virtual),
        "pcie": [[(g.pcie or {}).get("gen_max"), (g.pcie or {}).get("width_max")] for g in gpus],
        "nvlinks": [[len(g.nvlinks), sum(1 for l in g.nvlinks if l.get("active"))] for g in gpus],
    }


def topology_hash(report: Report, facts: dict | None = None) -> str:
    return _digest(topology_facts(report) if facts is None else facts)


def nccl_conf_hash(report: Report) -> str:
    conf = report.nccl_conf()
    return _digest(sorted(conf.items())) if conf else ""


def _digest(facts) -> str:
    canonical = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def fingerprint(report: Report, topology: dict | None = None) -> Fingerprint:
    """The node's fingerprint; `topology`: its topology_facts where the caller has them already."""
    node = report.node or {}
    cuda = node.get("cuda_driver_version")
    return Fingerprint(
        sku=sku(report),
        driver=str(node.get("driver_version") or ""),
        cuda=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) and cuda > 0 else "",
        vbios=",".join(sorted({g.vbios for g in report.gpus if g.vbios})),
        nic_firmware=",".join(sorted({n.firmware for n in report.nics if n.firmware})),
        kernel=str(node.get("kernel") or ""),
        topology=topology_hash(report, topology),
        nccl_conf=nccl_conf_hash(report),
        roce_gid=",".join(str(i) for i in sorted({index for _, index, _ in nccl_roce_ports(report)})),
    )


def vbios_mismatch(report: Report, config) -> list[Finding]:
    """GPUs of one node on different VBIOS versions: a partial firmware update (Azure's NHC checks the same)."""
    versions = Counter(g.vbios for g in report.gpus if g.vbios)
    if len(versions) < 2:
        return []
    usual = versions.most_common(1)[0][0]
    odd = sorted((g for g in report.gpus if g.vbios and g.vbios != usual), key=lambda g: g.index)
    return [Finding("gpu_vbios_mismatch", "warning", f"gpu{g.index}", g.vbios, usual,
                    f"gpu{g.index} runs VBIOS {g.vbios}, its {versions[usual]} sibling(s) {usual}: a partial firmware "
                    "update; flash every GPU of the node to one version") for g in odd]
