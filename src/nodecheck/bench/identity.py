"""Which CUDA device is the GPU nodecheck means. NVML numbers GPUs in PCI order; CUDA numbers them
fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and only those CUDA_VISIBLE_DEVICES (or Slurm's
--gpus-per-task) leaves visible, renumbered from 0. So a worker finds its GPU by UUID, else by PCI
bus id, and only as a last resort by index, saying which it did."""

from __future__ import annotations

from nodecheck.core.pci import normal_pci


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


def visible_devices(environ: dict[str, str]) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list of entries (indexes, GPU-/MIG- UUIDs); None when unset (all visible)."""
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    return None if raw is None else [entry.strip() for entry in raw.split(",") if entry.strip()]


def rank_gpu(gpus: list, environ: dict[str, str], local_rank: int) -> tuple[object | None, int | None, str]:
    """The NVML GPU a launched rank uses, its CUDA ordinal, and how that was decided. A rank's GPU is the
    one it sees: its local rank among the visible devices, or the only one when a task sees one GPU
    (srun --gpus-per-task=1); named by the UUID in CUDA_VISIBLE_DEVICES where it is one, else by index.
    (None, None, why) when it has none of its own; (None, ordinal, why) when the ordinal is known but
    not which NVML GPU it is (a MIG instance, an index NVML does not list)."""
    visible = visible_devices(environ)
    count = len(gpus) if visible is None else len(visible)
    if count == 0:
        return None, None, "no GPU is visible to this rank (CUDA_VISIBLE_DEVICES is empty or the node has none)"
    ordinal = local_rank if 0 <= local_rank < count else 0 if count == 1 else None
    if ordinal is None:
        shown = "unset" if visible is None else ",".join(visible)
        return None, None, (f"local rank {local_rank} has no GPU of its own: it sees {count} (CUDA_VISIBLE_DEVICES={shown}); "
                            f"launch at most {count} rank(s) per node")
    entry = str(ordinal) if visible is None else visible[ordinal]
    if entry.lower().startswith("gpu-"):
        want = normal_uuid(entry)
        found = [g for g in gpus if g.uuid and normal_uuid(g.uuid).startswith(want)]  # CUDA takes a UUID's prefix
        how = f"by UUID {entry} from CUDA_VISIBLE_DEVICES"
    elif entry.isascii() and entry.isdigit() and len(entry) < 6:  # a superscript is a digit to isdigit, not int()
        found = [g for g in gpus if g.index == int(entry)]
        how = f"by index {entry}" + (" from CUDA_VISIBLE_DEVICES" if visible is not None else " (its local rank)")
    else:
        found, how = [], f"CUDA_VISIBLE_DEVICES entry {entry!r} (a MIG instance or a name NVML does not list)"
    return (found[0] if len(found) == 1 else None), ordinal, how
