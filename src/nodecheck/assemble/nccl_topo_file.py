"""An NCCL topology file (NCCL_TOPO_FILE's format) for a VM whose PCI tree is flattened: GPUs and NICs straight
under the root bus, no switches, every device on one NUMA node (or none), NVSwitches invisible. NCCL then sees no
GPU near any NIC, and a 2x8 H200 job in KVM ran at 27.5 GB/s against 475.8 on bare metal (nccl-tests#256). Written
the way providers write theirs (Azure's ndv4/ndv5 files): one <cpu> per NUMA node, one made-up bridge per GPU and
its NIC(s), each device as a bare <pci> of its class with the link figures of the device itself (NVML's maximum
generation and width for a GPU; the NIC's own from sysfs), never an emulated bridge's (a QEMU bridge says 2.5 GT/s
x1).

Which NIC goes with which GPU is never guessed. In this order: the config's [topology] pairs, then the guest's own
NUMA hints where they pair one to one (each NUMA node holds as many GPUs as NICs). Neither: nothing is written, and
the reason is said."""

from __future__ import annotations

from nodecheck.core.errors import NodecheckError
from nodecheck.core.pci import normal_pci
from nodecheck.core.units import parse_cpulist
from nodecheck.report.model import Report

GPU_CLASS, NIC_CLASSES = "0x030200", {"infiniband": "0x020700"}  # other NICs: Ethernet's 0x020000
GTS = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0", 6: "64.0", 7: "128.0"}  # PCIe generation -> GT/s as sysfs writes it
BRIDGE = "ffff:ff:{:02x}.0"  # made-up bridges, as Azure numbers them: no real device has domain ffff


def flattened(report: Report) -> tuple[bool, str]:
    """(whether the node's PCI tree is flattened, what was seen): no bridge between any GPU and the root bus. A node
    whose PCI paths were not read cannot say: not flattened, and why."""
    gpus = [normal_pci(g.pci_bus_id) for g in report.gpus if g.pci_bus_id]
    if not gpus:
        return False, "no GPU"
    if not report.pcie_paths:
        return False, "the GPUs' PCI paths were not read (sysfs)"
    paths = report.hops()
    behind = [a for a in gpus if len(paths.get(a, [])) > 1]
    if behind:
        return False, f"{len(behind)} of {len(gpus)} GPU(s) behind PCIe bridges: NCCL reads that tree itself"
    numa = sorted({g.numa_node for g in report.gpus if g.numa_node is not None and g.numa_node >= 0})
    return True, (f"{len(gpus)} GPU(s) straight under the root bus, "
                  + (f"NUMA node(s) {', '.join(map(str, numa))}" if numa else "no NUMA node"))


def pairing(report: Report, pairs: list[tuple[str, str]]) -> tuple[dict[int, list], str]:
    """{GPU index: [its NICs]} and where the pairing came from; NodecheckError saying why there is none."""
    nics = {key: nic for nic in report.nics if not nic.virtual and nic.pci_address
            for key in (nic.name, nic.rdma_device) if key}
    gpus = {f"gpu{g.index}": g for g in report.gpus}
    if pairs:
        out: dict[int, list] = {}
        for gpu_name, nic_name in pairs:
            if gpu_name not in gpus:
                raise NodecheckError(f"[topology] pairs names {gpu_name!r}: no such GPU here ({', '.join(gpus) or 'none'})")
            if nic_name not in nics:
                raise NodecheckError(f"[topology] pairs names {nic_name!r}: no physical NIC of that name with a PCI address here")
            out.setdefault(gpus[gpu_name].index, []).append(nics[nic_name])
        return out, "the config's [topology] pairs"
    rails = [n for n in report.nics if not n.virtual and n.pci_address and n.kind == "infiniband"] or \
            [n for n in report.nics if not n.virtual and n.pci_address and n.rdma_device]
    by_numa_gpus, by_numa_nics = {}, {}
    for gpu in report.gpus:
        by_numa_gpus.setdefault(gpu.numa_node, []).append(gpu)
    for nic in rails:
        by_numa_nics.setdefault(nic.numa_node, []).append(nic)
    usable = all(node is not None and node >= 0 for node in by_numa_gpus) and len(by_numa_gpus) > 1 and \
        set(by_numa_gpus) == set(by_numa_nics) and all(len(by_numa_gpus[n]) == len(by_numa_nics[n]) for n in by_numa_gpus)
    if not usable:
        raise NodecheckError("no pairing of GPUs and NICs to write: the guest's NUMA nodes do not pair them one to one "
                             "(all on one node, or none); name them in the config: [topology] pairs = [[\"gpu0\", \"mlx5_0\"], ...]")
    out = {}
    for node in sorted(by_numa_gpus):
        for gpu, nic in zip(sorted(by_numa_gpus[node], key=lambda g: g.index), sorted(by_numa_nics[node], key=lambda n: n.pci_address),
                            strict=True):
            out[gpu.index] = [nic]
    return out, "the guest's NUMA nodes (as many GPUs as RDMA NICs on each, paired in PCI order)"


def topology_xml(report: Report, paired: dict[int, list]) -> str:
    """NCCL's XML for the pairing: one <cpu> per NUMA node of the GPUs, one made-up bridge per GPU and its NICs."""
    gpus = {g.index: g for g in report.gpus}
    paths = report.hops()
    numa_cpus = {entry.get("node"): entry.get("cpus", "") for entry in (report.cpu.numa if report.cpu else [])}
    by_node: dict[int, list[int]] = {}
    for index in sorted(paired):
        node = gpus[index].numa_node if gpus[index].numa_node is not None and gpus[index].numa_node >= 0 else 0
        by_node.setdefault(node, []).append(index)
    lines, bridge = ['<system version="1">'], 0
    for node, indices in sorted(by_node.items()):
        affinity = _mask(numa_cpus.get(node, "")) if numa_cpus.get(node) else None
        lines.append(f'  <cpu numaid="{node}"' + (f' affinity="{affinity}"' if affinity else "") + ">")
        for index in indices:
            bridge += 1
            gpu = gpus[index]
            speed, width = _gpu_link(gpu)
            lines.append(f'    <pci busid="{BRIDGE.format(bridge)}" class="0x060400" link_speed="{speed}" link_width="{width}">')
            lines.append(f'      <pci busid="{normal_pci(gpu.pci_bus_id)}" class="{GPU_CLASS}" link_speed="{speed}" link_width="{width}"/>')
            for nic in paired[index]:
                nic_speed, nic_width = _nic_link(nic, paths, speed, width)
                lines.append(f'      <pci busid="{normal_pci(nic.pci_address)}" class="{NIC_CLASSES.get(nic.kind, "0x020000")}" '
                             f'link_speed="{nic_speed}" link_width="{nic_width}"/>')
            lines.append("    </pci>")
        lines.append("  </cpu>")
    lines.append("</system>")
    return "\n".join(lines) + "\n"


def _gpu_link(gpu) -> tuple[str, int]:
    """The GPU's own link as NVML says it (its maximum generation and width), not what a VM's bridge says."""
    pcie = gpu.pcie or {}
    generation = pcie.get("gen_gpu_max") or pcie.get("gen_max") or 4
    return f"{GTS.get(generation, '16.0')} GT/s PCIe", pcie.get("width_max") or 16


def _nic_link(nic, paths: dict, fallback_speed: str, fallback_width: int) -> tuple[str, int]:
    """The NIC's own link (its device's max speed and width in sysfs), else the GPU's it is paired with."""
    hops = paths.get(normal_pci(nic.pci_address) or "", [])
    own = hops[0] if hops else None
    speed = own.speed_max if own is not None and own.speed_max and not own.speed_max.startswith("2.5") else fallback_speed
    width = own.width_max if own is not None and own.width_max and own.width_max > 1 else fallback_width
    return speed, width


def _mask(cpulist: str) -> str | None:
    """A Linux cpulist ("0-47,96-143") as NCCL writes affinity: 32-bit hex words, most significant first."""
    try:
        cpus = parse_cpulist(cpulist)
    except ValueError:
        return None
    if not cpus:
        return None
    value = sum(1 << c for c in set(cpus))
    words = [(value >> (32 * i)) & 0xFFFFFFFF for i in range((max(cpus) // 32) + 1)]
    return ",".join(f"{w:08x}" for w in reversed(words))
