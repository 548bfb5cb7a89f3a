"""Which DRA device is which GPU: the node's ResourceSlices (resource.k8s.io v1, v1beta2 and v1beta1's `basic`
wrapper), as the API server lists them (`GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=N`),
read as untrusted input, and each of nodecheck's GPUs matched to its device by UUID, else by PCI address, never by
index: the NVIDIA DRA driver names a GPU `gpu-<minor>` (the /dev/nvidia<minor> number,
cmd/gpu-kubelet-plugin/deviceinfo.go CanonicalName), which is not NVML's index.

Attributes, as the NVIDIA driver publishes them (deviceinfo.go Attributes): `uuid`, `productName`, the standard
`resource.kubernetes.io/pciBusID` (older releases: `pcieBusID`), and for a MIG device its own `uuid` and its GPU's
`parentUUID`: a GPU's fault covers its MIG devices too. A name may carry the driver's domain
(`gpu.nvidia.com/uuid`), as CEL reads it. Only a pool's newest generation counts (ResourceSlice API: "a consumer
must only use ResourceSlices with the highest generation number")."""

from __future__ import annotations

from dataclasses import dataclass, field

from nodecheck.core.pci import normal_pci
from nodecheck.core.typed_json import member

MAX_SLICES = 256  # a node's pools: a slice holds at most 128 devices
MAX_DEVICES = 4096
MAX_NAME = 253
PCI_ATTRIBUTES = ("resource.kubernetes.io/pciBusID", "pciBusID", "pcieBusID")


@dataclass(frozen=True)
class SliceDevice:
    driver: str
    pool: str
    name: str  # spec.devices[].name: what a DeviceTaintRule's selector names
    uuid: str | None = None
    parent_uuid: str | None = None  # a MIG device's GPU
    pci: str | None = None
    product: str | None = None


@dataclass
class DeviceMap:
    devices: dict = field(default_factory=dict)  # the caller's GPU key (NVML index, "gpu3") -> its devices, MIG ones too
    unmatched: list = field(default_factory=list)  # GPUs no slice lists
    notes: list[str] = field(default_factory=list)


def _text(value) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_NAME else None


def _attribute(attributes: dict, driver: str, name: str) -> str | None:
    """A string attribute by its bare or driver-qualified name ({"string": "..."} in the API)."""
    for key in (name, f"{driver}/{name}"):
        if (value := _text(member(member(attributes, key, dict), "string", str))) is not None:
            return value
    return None


def slice_devices(answer: dict, node: str) -> tuple[list[SliceDevice], list[str]]:
    """The devices of this node's slices in a ResourceSliceList (or a kubectl List), newest pool generation
    only, with what was left out and why."""
    items = member(answer, "items", list) or []
    notes: list[str] = []
    if len(items) > MAX_SLICES:
        notes.append(f"{len(items)} ResourceSlices listed: the first {MAX_SLICES} read")
    newest: dict[tuple[str, str], int] = {}
    kept: list[tuple[tuple[str, str], int, dict, str]] = []
    for item in items[:MAX_SLICES]:
        spec = member(item, "spec", dict)
        driver, pool = _text(member(spec, "driver", str)), member(spec, "pool", dict)
        pool_name, generation = _text(member(pool, "name", str)), member(pool, "generation", int)
        if spec is None or driver is None or pool_name is None or member(spec, "nodeName", str) != node:
            continue  # another node's, a network-attached pool, or not a slice
        key = (driver, pool_name)
        generation = generation if generation is not None and not isinstance(generation, bool) else 0
        newest[key] = max(newest.get(key, generation), generation)
        kept.append((key, generation, spec, driver))
    devices: list[SliceDevice] = []
    for key, generation, spec, driver in kept:
        if generation != newest[key]:
            continue
        for device in (member(spec, "devices", list) or []):
            if len(devices) >= MAX_DEVICES:
                notes.append(f"more than {MAX_DEVICES} devices listed: the rest not read")
                return devices, notes
            name = _text(member(device, "name", str))
            attributes = member(device, "attributes", dict) or member(member(device, "basic", dict), "attributes", dict) or {}
            if name is None:
                continue
            pci = next((normal_pci(p) for a in PCI_ATTRIBUTES if (p := _attribute(attributes, driver, a))), None)
            devices.append(SliceDevice(driver, key[1], name, _attribute(attributes, driver, "uuid"),
                                       _attribute(attributes, driver, "parentUUID"), pci,
                                       _attribute(attributes, driver, "productName")))
    return devices, notes


def map_gpus(devices: list[SliceDevice], gpus: list[tuple[int | str, str | None, str | None]]) -> DeviceMap:
    """gpus: (key: NVML's index, or a name such as "gpu3" or "pci:0000:53:00.0"; UUID; PCI bus id). A GPU matches the
    device with its UUID, else (no UUID in the slice) the one at its PCI address; MIG devices follow their GPU. A
    UUID two devices claim as their own is not used."""
    result = DeviceMap()
    by_uuid: dict[str, list[SliceDevice]] = {}
    for device in devices:
        if device.uuid:
            by_uuid.setdefault(device.uuid.lower(), []).append(device)
    for index, uuid, pci in gpus:
        own = by_uuid.get(uuid.lower(), []) if uuid else []
        if len(own) > 1:
            label = f"gpu{index}" if isinstance(index, int) else index
            result.notes.append(f"{label}: UUID {uuid} is listed by {len(own)} devices: not tainted by device")
            result.unmatched.append(index)
            continue
        if not own and normal_pci(pci):
            own = [d for d in devices if d.pci == normal_pci(pci) and d.parent_uuid is None][:1]
        if not own:
            result.unmatched.append(index)
            continue
        gpu_uuid = (own[0].uuid or uuid or "").lower()
        children = [d for d in devices if gpu_uuid and (d.parent_uuid or "").lower() == gpu_uuid]
        result.devices[index] = own + children
    return result
