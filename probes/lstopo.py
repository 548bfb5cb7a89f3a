"""hwloc's `lstopo --of xml`: packages, NUMA nodes, cores, PUs, and every GPU and NIC OS device
with the NUMA node(s) it sits under (the nodeset of its nearest non-I/O ancestor)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from nodecheck.errors import ParseError
from nodecheck.units import format_cpulist, hwloc_bitmap_to_set, to_int

SOURCE = "lstopo.xml"
ARGV = ["lstopo-no-graphics", "--of", "xml"]

_IO_TYPES = {"Bridge", "PCIDev", "OSDev", "Misc"}
# osdev_type: hwloc 1.x/2.x XML write an enum, hwloc 3.x XML ("version 3.0") a bitmask.
_ENUM = {1: "GPU", 2: "Network", 3: "OpenFabrics", 5: "CoProcessor"}
_BITS = ((32, "OpenFabrics"), (16, "Network"), (4, "GPU"), (8, "CoProcessor"))


@dataclass
class LstopoDevice:
    name: str
    kind: str  # GPU, CoProcessor, Network, OpenFabrics
    subtype: str | None
    pci_busid: str | None
    numa_nodes: list[int]
    model: str | None = None


@dataclass
class LstopoGpu:
    pci_busid: str | None
    osdevs: list[str]  # "nvml0 (NVML)", "cuda0 (CUDA)", "card0"
    numa_nodes: list[int]
    model: str | None


@dataclass
class LstopoFacts:
    packages: int
    numa_nodes: int
    cores: int
    pus: int
    numa: dict[int, str] = field(default_factory=dict)  # NUMA os_index -> cpulist
    gpus: list[LstopoGpu] = field(default_factory=list)
    nics: list[LstopoDevice] = field(default_factory=list)
    cpu_model: str | None = None
    dmi_product: str | None = None
    hwloc_version: str | None = None


def parse_lstopo_xml(text: str) -> LstopoFacts:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as error:
        raise ParseError(f"lstopo XML is not well-formed: {error}") from None
    if root.tag != "topology":
        raise ParseError(f"not an hwloc topology: root element is <{root.tag}>")
    bitmask = (to_int(root.get("version", "").split(".")[0]) or 0) >= 3
    machine = root.find("object")
    if machine is None:
        raise ParseError("hwloc topology holds no object")
    counts = {"Package": 0, "NUMANode": 0, "Core": 0, "PU": 0}
    facts = LstopoFacts(0, 0, 0, 0, dmi_product=_info(machine, "DMIProductName"),
                        hwloc_version=_info(machine, "hwlocVersion"))
    devices: list[LstopoDevice] = []
    _walk(machine, [], counts, facts, devices, bitmask)
    facts.packages, facts.numa_nodes, facts.cores, facts.pus = (counts[k] for k in ("Package", "NUMANode", "Core", "PU"))
    if facts.pus == 0:
        raise ParseError("hwloc topology has no PU (processing unit) object")
    facts.nics = [device for device in devices if device.kind in ("Network", "OpenFabrics")]
    facts.gpus = _group_gpus([d for d in devices if d.kind in ("GPU", "CoProcessor")])
    return facts


def _walk(node: ET.Element, ancestors: list[ET.Element], counts: dict, facts: LstopoFacts, devices: list, bitmask: bool) -> None:
    kind = node.get("type", "")
    if kind in counts:
        counts[kind] += 1
    if kind == "NUMANode" and (index := to_int(node.get("os_index"))) is not None:
        facts.numa[index] = _cpulist(node.get("cpuset", ""))
    if kind == "Package" and facts.cpu_model is None:
        facts.cpu_model = _info(node, "CPUModel")
    if kind == "OSDev":
        device_kind = _osdev_kind(node.get("osdev_type", ""), bitmask)
        if device_kind:
            devices.append(_device(node, device_kind, ancestors))
    for child in node.findall("object"):
        _walk(child, ancestors + [node], counts, facts, devices, bitmask)


def _osdev_kind(raw: str, bitmask: bool) -> str | None:
    value = to_int(raw)
    if value is None:
        return None
    if not bitmask:
        return _ENUM.get(value)
    return next((name for bit, name in _BITS if value & bit), None)


def _device(node: ET.Element, kind: str, ancestors: list[ET.Element]) -> LstopoDevice:
    pci = next((a.get("pci_busid") for a in reversed(ancestors) if a.get("type") == "PCIDev"), None)
    cpu_side = next((a for a in reversed(ancestors) if a.get("type") not in _IO_TYPES), None)
    numa = sorted(_bitmap(cpu_side.get("nodeset", ""))) if cpu_side is not None and cpu_side.get("nodeset") else []
    return LstopoDevice(
        name=node.get("name", ""), kind=kind, subtype=node.get("subtype") or _info(node, "Backend"),
        pci_busid=pci, numa_nodes=numa, model=_info(node, "GPUModel"),
    )


def _group_gpus(devices: list[LstopoDevice]) -> list[LstopoGpu]:
    """One GPU per PCI device; its CUDA, OpenCL and NVML OS devices are views of it."""
    by_pci: dict[str | None, LstopoGpu] = {}
    for device in devices:
        label = f"{device.name} ({device.subtype})" if device.subtype else device.name
        key = device.pci_busid if device.pci_busid else f"osdev:{device.name}"
        gpu = by_pci.setdefault(key, LstopoGpu(device.pci_busid, [], device.numa_nodes, None))
        gpu.osdevs.append(label)
        gpu.model = gpu.model or device.model
    return list(by_pci.values())


def _info(node: ET.Element, name: str) -> str | None:
    for info in node.findall("info"):
        if info.get("name") == name:
            return info.get("value")
    return None


def _bitmap(text: str) -> set[int]:
    try:
        return hwloc_bitmap_to_set(text)
    except ValueError:
        raise ParseError(f"hwloc bitmap {text[:40]!r} is not readable") from None


def _cpulist(bitmap: str) -> str:
    return format_cpulist(_bitmap(bitmap))
