"""What the bench's runners share: the notes a result carries and how a collective's path kind is read.
Imports nothing of the bench's own, so every runner may import it."""

from __future__ import annotations

from nodecheck.core.units import to_int
from nodecheck.report.model import Measurement

NVLS_NOTE = ("NCCL's NVLS/SHARP algorithms reduce inside the switch, so busbw can exceed the link rate "
             "(nccl-tests issues #153, #312): above spec is not a fault")
ABOVE_RING_BOUND = ("above the ring bound: NCCL's tree, SHARP (in-network reduction) or NVLS algorithms move less data "
                    "between nodes than a ring, so busbw can exceed the rails' sum, up to 2(n-1)/n times it; not a fault")


def staged_if_shm(measurement: Measurement) -> Measurement:
    """An NCCL collective over PCIe whose ranks talked through host memory (SHM: no peer access, as on GeForce cards;
    or past PXB, where NCCL takes SHM by default, between the switch or NVLink-bridge pairs of a PCIe node) is judged
    as a staged path, like a p2p copy without peer access: a ring is as fast as its slowest hop, and one SHM hop
    stages it."""
    transports = ((measurement.details.get("nccl") or {}).get("intra_node_transports")) or []
    if measurement.details.get("path_kind") == "pcie" and any(t.startswith("SHM") for t in transports):
        measurement.details["path_kind"] = "pcie-staged"
    return measurement


def local_rank(environ: dict[str, str]) -> int:
    """This process's rank on its node (torchrun's LOCAL_RANK, srun's SLURM_LOCALID); 0 when unknown."""
    return to_int(environ.get("LOCAL_RANK", environ.get("SLURM_LOCALID", "0"))) or 0
