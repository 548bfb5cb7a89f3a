"""hwloc's `lstopo --of xml`: packages, NUMA nodes, cores, PUs, and every GPU and NIC OS device
with the NUMA node(s) it sits under (the nodeset of its nearest non-I/O ancestor)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from nodecheck.core.errors import ParseError
from nodecheck.core.units import format_cpulist, hwloc_bitmap_to_set, to_int
from nodecheck.probes.base import Probe

SOURCE = "lstopo.xml"
ARGV = ["lstopo-no-graphics", "--of", "xml"]


def collect(host, timeout: float) -> "LstopoFacts":
    return parse_lstopo_xml(host.command(SOURCE, ARGV, timeout))


PROBE = Probe("lstopo", collect, 15.0)

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


@dataclass
class _Walk:
    """What the walk needs besides the tree: the XML's format, the allowed sets, and what it found."""
    bitmask: bool  # hwloc 3.x osdev types
    allowed_cpus: set[int] | None  # None: every CPU is allowed
    allowed_nodes: set[int] | None
    counts: dict = field(default_factory=lambda: {"Package": 0, "NUMANode": 0, "Core": 0, "PU": 0})
    numa_cpus: dict[int, set[int]] = field(default_factory=dict)
    devices: list = field(default_factory=list)  # (LstopoDevice, its CPU-side ancestor's cpuset or None)


# hwloc 1.x called a package a Socket
_COUNTED = {"Package": "Package", "Socket": "Package", "NUMANode": "NUMANode", "Core": "Core", "PU": "PU"}


def parse_lstopo_xml(text: str) -> LstopoFacts:
    """Counts and localities as hwloc's own tools report them: objects outside the topology's allowed
    CPUs and NUMA nodes (a cgroup, `--disallowed` exports) are left out, a topology without NUMANode
    objects has one NUMA node (0), and a device without a nodeset gets its NUMA nodes from its cpuset."""
    try:
        root = ET.fromstring(text)  # noqa: S314 bounded input; expat resolves no external entity and caps expansion
    except ET.ParseError as error:
        raise ParseError(f"lstopo XML is not well-formed: {error}") from None
    if root.tag != "topology":
        raise ParseError(f"not an hwloc topology: root element is <{root.tag}>")
    machine = root.find("object")
    if machine is None:
        raise ParseError("hwloc topology holds no object")
    walk = _Walk((to_int(root.get("version", "").split(".")[0]) or 0) >= 3,
                 _optional_bitmap(machine.get("allowed_cpuset")), _optional_bitmap(machine.get("allowed_nodeset")))
    facts = LstopoFacts(0, 0, 0, 0, dmi_product=_info(machine, "DMIProductName"),
                        hwloc_version=_info(machine, "hwlocVersion"))
    _walk(machine, [], walk, facts)
    facts.packages, facts.numa_nodes, facts.cores, facts.pus = (walk.counts[k] for k in ("Package", "NUMANode", "Core", "PU"))
    if facts.pus == 0:
        raise ParseError("hwloc topology has no PU (processing unit) object")
    if facts.numa_nodes == 0:  # hwloc always has one: the whole machine's memory
        facts.numa_nodes = 1
        walk.numa_cpus = {0: _allowed(_bitmap(machine.get("cpuset", "")), walk.allowed_cpus)}
    facts.numa = {index: format_cpulist(cpus) for index, cpus in sorted(walk.numa_cpus.items())}
    devices = []
    for device, cpuset in walk.devices:
        if not device.numa_nodes and cpuset:
            device.numa_nodes = sorted(i for i, cpus in walk.numa_cpus.items() if cpus & cpuset)
        devices.append(device)
    facts.nics = [device for device in devices if device.kind in ("Network", "OpenFabrics")]
    facts.gpus = _group_gpus([d for d in devices if d.kind in ("GPU", "CoProcessor")])
    return facts


def _walk(node: ET.Element, ancestors: list[ET.Element], walk: _Walk, facts: LstopoFacts) -> None:
    kind = _COUNTED.get(node.get("type", ""))
    if kind and _is_allowed(node, kind, walk):
        walk.counts[kind] += 1
        if kind == "NUMANode" and (index := to_int(node.get("os_index"))) is not None:
            walk.numa_cpus[index] = _allowed(_bitmap(node.get("cpuset", "")), walk.allowed_cpus)
        if kind == "Package" and facts.cpu_model is None:
            facts.cpu_model = _info(node, "CPUModel")
    if node.get("type") == "OSDev":
        device_kind = _osdev_kind(node.get("osdev_type", ""), walk.bitmask)
        if device_kind:
            walk.devices.append(_device(node, device_kind, ancestors, walk))
    for child in node.findall("object"):
        _walk(child, ancestors + [node], walk, facts)


def _is_allowed(node: ET.Element, kind: str, walk: _Walk) -> bool:
    """hwloc drops what lies wholly outside the allowed sets: a PU not allowed, a NUMA node not allowed,
    any other object none of whose CPUs is allowed."""
    if kind == "NUMANode":
        index = to_int(node.get("os_index"))
        return walk.allowed_nodes is None or index is None or index in walk.allowed_nodes
    if walk.allowed_cpus is None or not node.get("cpuset"):
        return True
    return bool(_bitmap(node.get("cpuset", "")) & walk.allowed_cpus)


def _allowed(cpus: set[int], allowed: set[int] | None) -> set[int]:
    return cpus if allowed is None else cpus & allowed


def _optional_bitmap(text: str | None) -> set[int] | None:
    return None if not text else _bitmap(text)


def _osdev_kind(raw: str, bitmask: bool) -> str | None:
    value = to_int(raw)
    if value is None:
        return None
    if not bitmask:
        return _ENUM.get(value)
    return next((name for bit, name in _BITS if value & bit), None)


def _device(node: ET.Element, kind: str, ancestors: list[ET.Element], walk: _Walk) -> tuple[LstopoDevice, set[int] | None]:
    """The device, with the NUMA nodes of its nearest CPU-side ancestor (its nodeset; without one, the
    walk's end resolves them from that ancestor's cpuset) and that cpuset."""
    pci = next((a.get("pci_busid") for a in reversed(ancestors) if a.get("type") == "PCIDev"), None)
    cpu_side = next((a for a in reversed(ancestors) if a.get("type") not in _IO_TYPES), None)
    numa: list[int] = []
    cpuset = None
    if cpu_side is not None:
        if cpu_side.get("nodeset"):
            numa = sorted(_allowed(_bitmap(cpu_side.get("nodeset", "")), walk.allowed_nodes))
        if cpu_side.get("cpuset"):
            cpuset = _allowed(_bitmap(cpu_side.get("cpuset", "")), walk.allowed_cpus)
    device = LstopoDevice(name=node.get("name", ""), kind=kind, subtype=node.get("subtype") or _info(node, "Backend"),
                          pci_busid=pci, numa_nodes=numa, model=_info(node, "GPUModel"))
    return device, cpuset


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
