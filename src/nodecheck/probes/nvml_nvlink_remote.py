"""What is at the far end of each active NVLink, as NVML says it: the remote device's PCI bus id
(nvmlDeviceGetNvLinkRemotePciInfo_v2) and its kind (nvmlDeviceGetNvLinkRemoteDeviceType: a GPU, an NVSwitch, an
IBM NPU). NCCL asks the same call for every active link and writes its answer, lower-cased, as `<nvlink target>`
in its topology (NVIDIA/nccl src/graph/xml.cc ncclTopoGetXmlFromGpu), so the two can be held side by side: a target
NCCL names that NVML does not is a GPU NCCL routes to over a link that goes elsewhere.

dump_remote(): NVML's answers for one link; parse_remotes(): {link: {"bus_id", "type"}} for the links NVML
answered, read leniently (a malformed answer is no answer). Inside a VM NVML answers the NVSwitches it cannot see
with an all-F bus id ("fffffff:ffff:ff" in NCCL's dumps): kept as NVML wrote it, lower-cased."""

from __future__ import annotations

from nodecheck.core.limits import MAX_NVLINKS
from nodecheck.core.units import is_int
from nodecheck.probes.nvml_calls import as_text

# nvmlIntNvLinkDeviceType_t: NVML_NVLINK_DEVICE_TYPE_GPU 0, _IBMNPU 1, _SWITCH 2, _UNKNOWN 0xFF
REMOTE_TYPES = {0: "gpu", 1: "npu", 2: "switch", 0xFF: "unknown"}
MAX_BUS_ID = 32  # NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE


def dump_remote(pynvml, handle, link: int) -> dict:
    """{"bus_id": "00000000:07:00.0", "type": 0} or {"error": ...}; the kind is asked on its own (older drivers
    answer the bus id and not the kind)."""
    pci_info = getattr(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo", None)
    kind = getattr(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
    if pci_info is None:
        return {"error": "not in this nvidia-ml-py"}
    try:
        bus_id = pci_info(handle, link).busId
    except pynvml.NVMLError as error:
        return {"error": str(error)}
    said = {"bus_id": as_text(bus_id)}
    if kind is not None:
        try:
            said["type"] = int(kind(handle, link))
        except (pynvml.NVMLError, TypeError, ValueError):
            pass
    return said


def parse_remotes(raw_links) -> dict[int, dict]:
    """{link: {"bus_id": lower-cased, "type": "gpu"|"switch"|"npu"|"unknown"|None}} from the dump's nvlinks entries."""
    remotes: dict[int, dict] = {}
    for entry in (raw_links if isinstance(raw_links, list) else [])[:MAX_NVLINKS]:
        said = entry.get("remote") if isinstance(entry, dict) else None
        if not isinstance(said, dict) or not is_int(entry.get("link")) or not isinstance(said.get("bus_id"), str):
            continue
        bus_id = said["bus_id"].strip().lower()
        if not bus_id or len(bus_id) > MAX_BUS_ID or not all(c in "0123456789abcdef:." for c in bus_id):
            continue
        remotes[entry["link"]] = {"bus_id": bus_id, "type": REMOTE_TYPES.get(said.get("type")) if is_int(said.get("type")) else None}
    return remotes
