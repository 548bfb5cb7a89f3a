"""NCCL's own reading of each GPU's NVLink fabric in a debug log, and whether it ran multi-node NVLink (MNNVL).

From 2.20, NCCL prints at init, for each rank's GPU whose fabric state is not Not Supported, what NVML's
nvmlGpuFabricInfo_v2 told it (src/init.cc): "MNNVL busId 0x801000 fabric UUID a44167d15423d758.7d6b24c07d32e7b3
cliqueId 0x2786 state 3 healthMask 0xaa" (the cluster UUID as two 64-bit words, 0.0 on an NVSwitch node outside a
multi-node NVLink domain), and for each communicator "comm 0x... rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0
MNNVL 1": whether its traffic between nodes goes over NVLink (1) or the network (0).
"""

from __future__ import annotations

import re

from nodecheck.verdicts.nccl_run import MAX_COMM_KINDS, MAX_FABRIC_GPUS

_FABRIC = re.compile(r"^MNNVL busId 0x([0-9a-fA-F]{1,16}) fabric UUID ([0-9a-fA-F]{1,16})\.([0-9a-fA-F]{1,16}) "
                     r"cliqueId 0x([0-9a-fA-F]{1,8}) state (\d{1,3}) healthMask 0x([0-9a-fA-F]{1,8})\b")
_COMM = re.compile(r"\bnRanks \d{1,7} nNodes (\d{1,6}) localRanks \d{1,7} localRank \d{1,7} MNNVL (\d)\b")


def note_mnnvl(run, host: str, body: str, seen: set) -> bool:
    """Whether an INFO line is NCCL's fabric reading of a GPU (kept in run.fabric: one entry per host and bus id, the first
    NCCL printed); a communicator's MNNVL decision is kept too (run.comm_mnnvl: distinct [nNodes, MNNVL]), its line read
    on for its ranks."""
    if fabric := _FABRIC.match(body):
        key = (host, fabric[1].lower().lstrip("0") or "0")
        if key not in seen and len(run.fabric) < MAX_FABRIC_GPUS:
            seen.add(key)
            words = (fabric[2].lower().lstrip("0") or "0", fabric[3].lower().lstrip("0") or "0")
            run.fabric.append({"host": host[:255], "bus_id": key[1],
                               "uuid": None if words == ("0", "0") else ".".join(words),
                               "clique_id": int(fabric[4], 16), "state": int(fabric[5]), "health_mask": int(fabric[6], 16)})
        return True
    if comm := _COMM.search(body):  # its "rank R nRanks N" is read on (the job's ranks): not taken here
        pair = [int(comm[1]), int(comm[2])]
        if pair not in run.comm_mnnvl and len(run.comm_mnnvl) < MAX_COMM_KINDS:
            run.comm_mnnvl.append(pair)
    return False


def ran_mnnvl_across_nodes(run) -> bool:
    """Whether a communicator across nodes ran multi-node NVLink: NCCL printed "nNodes N ... MNNVL 1" with N > 1."""
    return any(nodes > 1 and on == 1 for nodes, on in run.comm_mnnvl)
