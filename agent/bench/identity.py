"""Which CUDA device is the GPU nodecheck means. NVML numbers GPUs in PCI order; CUDA numbers them
fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and only those CUDA_VISIBLE_DEVICES (or Slurm's
--gpus-per-task) leaves visible, renumbered from 0. So a worker finds its GPU by UUID, else by PCI
bus id, and only as a last resort by index, saying which it did."""

from __future__ import annotations


def normal_pci(bus_id: str | None) -> str | None:
    """'00000000:1B:00.0' (NVML) and '0000:1b:00.0' (sysfs) -> '0000:1b:00.0'."""
    if not bus_id or ":" not in bus_id:
        return None
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if all(c in "0123456789abcdef" for c in domain) and domain else None


def normal_uuid(uuid: str | None) -> str | None:
    """'GPU-c1752cd3-...' (NVML) and 'c1752cd3-...' (torch) -> 'c1752cd3-...'."""
    return uuid.strip().lower().removeprefix("gpu-") if uuid else None


def pick_cuda_device(devices: list[dict], uuid: str | None, pci_bus_id: str | None, index: int) -> tuple[int, str]:
    """devices: [{"ordinal", "uuid", "pci"}] as CUDA sees them. (ordinal, how it was matched); raises
    LookupError when the GPU is not among them (hidden by CUDA_VISIBLE_DEVICES)."""
    want_uuid, want_pci = normal_uuid(uuid), normal_pci(pci_bus_id)
    for want, how in ((want_uuid, "by UUID"), (want_pci, "by PCI bus id")):
        if want:
            found = [d["ordinal"] for d in devices if normal_uuid(d.get("uuid")) == want or normal_pci(d.get("pci")) == want]
            if found:
                return found[0], how
    if want_uuid or want_pci:
        if any(d.get("uuid") or d.get("pci") for d in devices):
            raise LookupError(f"GPU {uuid or pci_bus_id} is not among the CUDA devices this process sees "
                              "(CUDA_VISIBLE_DEVICES or the job's GPU binding hides it)")
    if not 0 <= index < len(devices):
        raise LookupError(f"GPU index {index} is past the {len(devices)} CUDA device(s) this process sees")
    return index, "by index (torch reports no UUID or PCI bus id to match)"
