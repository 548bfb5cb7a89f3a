"""NCCL's picture of the node against the node's own: its topology dump, a topology file or its GRAPH log, read
by `nodecheck nccl-topo` (verdicts/nccl_topo.py), declared here with the other checks."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind

NCCL_TOPO_NVLINK_MISSING = Kind("nccl_topo_nvlink_missing", "fabric", "{subject} NCCL sees {measured}, {expected}",
    doc=(
        ("error",
         "NCCL's topology (its dump, `NCCL_TOPO_DUMP_FILE`, or its GRAPH log) holds no NVLink, or fewer than NVML counts "
         "active, on a GPU it holds: NCCL routes that GPU's traffic over PCIe (a GB300 tray whose dump had lost one GPU's 18 "
         "NVLinks ran all-reduce at 51.6 GB/s instead of 507)"),
    ))
NCCL_TOPO_MISMATCH = Kind("nccl_topo_mismatch", "fabric", "{subject} NCCL: {measured}, node: {expected}",
    doc=(
        ("warning",
         "NCCL's topology disagrees with the node's: a GPU's PCIe width or speed (before 2.30.7 NCCL reads the lower of "
         "the GPU's and its port's maxima from sysfs; a VM's emulated bridge says 2.5 GT/s), its NUMA node, a Grace GPU's C2C link count against NVML's, a NIC's speed, its "
         "GPUDirect RDMA flag (gdr=0) where the node gives GPUDirect RDMA, or whether a NIC sits under the same PCIe switch as a "
         "GPU against `nvidia-smi topo -m` (virtual bridges reverse it: NVIDIA/nccl#820), the peer GPUs a GPU's NVLinks "
         "reach against NVML's far end of each active link, and the PCI levels above a GPU or NIC against its sysfs path "
         "taken as NCCL collapses it (each switch's two ports one level, no root port); a value NCCL did not write "
         "(width 0) is unknown, a GPU the dump does not hold is no finding, and a flattened VM under a topology file's "
         "made-up bridges is as meant"),
        ("info",
         "a GPU's PCIe speed or width NCCL wrote below NVML's maximum where the node's sysfs hops give the GPU and its "
         "port more: NCCL 2.30.7 on writes NVML's current generation and width at its init (src/graph/xml.cc), the "
         "link's state then (a GPU still at its idle link speed, or a link trained down: the node's PCIe checks judge it)"),
    ))

CHECK = Check((NCCL_TOPO_NVLINK_MISSING, NCCL_TOPO_MISMATCH), made_by="nodecheck nccl-topo")
