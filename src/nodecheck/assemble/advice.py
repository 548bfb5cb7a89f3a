"""Binding advice: for each GPU, the CPUs and NUMA node to bind its process to and the NIC(s)
closest to it, as ready-to-use lines (numactl, NCCL_SOCKET_IFNAME, NCCL_IB_HCA)."""

from __future__ import annotations

from nodecheck.core.units import natural_key
from nodecheck.report.model import Report


def binding_advice(report: Report) -> list[dict]:
    by_name = {}
    for nic in report.nics:
        by_name[nic.name] = nic
        if nic.rdma_device:
            by_name.setdefault(nic.rdma_device, nic)
    advice = []
    refused = {g.index for g in report.gpus_inaccessible}
    for gpu in report.gpus:
        if gpu.index in refused:  # NVML cannot open it (fallen off the bus): no process should be bound to it
            continue
        nics = gpu.nearest_nics or _same_numa_nics(report, gpu.numa_node)
        hcas = sorted({by_name[n].rdma_device for n in nics if n in by_name and by_name[n].rdma_device}
                      | {n for n in nics if n not in by_name and not n.startswith("NIC")}, key=natural_key)
        # an RDMA device without a netdev (named as its device) is no socket interface: NCCL would find none
        netdevs = sorted({by_name[n].name for n in nics if n in by_name and by_name[n].kind != "unknown"
                          and by_name[n].name != by_name[n].rdma_device}, key=natural_key)
        # every VAR=value before the command: pasted as one line, a variable after it would be an argument
        # a GPU in MIG mode is used through its instances, which CUDA_VISIBLE_DEVICES names by UUID (`nvidia-smi -L`)
        lines = [f"CUDA_VISIBLE_DEVICES=<MIG-uuid from `nvidia-smi -L`, gpu{gpu.index}>" if gpu.mig_enabled
                 else f"CUDA_VISIBLE_DEVICES={gpu.index}"]
        if hcas:
            lines.append(f"NCCL_IB_HCA={','.join(hcas)}")
        if netdevs:
            lines.append(f"NCCL_SOCKET_IFNAME={','.join(netdevs)}")
        if gpu.numa_node is not None:
            lines.append(f"numactl --cpunodebind={gpu.numa_node} --membind={gpu.numa_node} <command>")
        elif gpu.cpu_affinity:
            lines.append(f"taskset -c {gpu.cpu_affinity} <command>")
        else:
            lines.append("<command>")
        advice.append({"gpu": gpu.index, "cpus": gpu.cpu_affinity, "numa_node": gpu.numa_node,
                       "nics": nics, "lines": lines})
    return advice


def _same_numa_nics(report: Report, numa_node: int | None) -> list[str]:
    """Without nvidia-smi's NIC columns, fall back to sysfs locality: physical NICs that are up on the GPU's node."""
    if numa_node is None:
        return []
    return [n.name for n in report.nics if n.numa_node == numa_node and not n.virtual and n.state == "up"]
