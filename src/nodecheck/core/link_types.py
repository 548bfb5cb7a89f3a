"""The link types of `nvidia-smi topo -m` (its legend): what each crosses, how near it is, and how many NVLinks
an NV# names. One spelling for the topology parser, the config, the model and the rules."""

from __future__ import annotations

import re

# What each link type crosses, nearest first (the nvidia-smi legend). SOC is the pre-2017 name of SYS.
LINK_CLASS = {
    "X": "self",
    "NV": "nvlink",
    "PIX": "pcie-single-bridge",
    "PXB": "pcie-multiple-bridges",
    "PHB": "pcie-host-bridge",
    "NODE": "numa-node-interconnect",
    "SYS": "socket-interconnect",
    "SOC": "socket-interconnect",
}
LINK_DISTANCE = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6, "SOC": 6}
LINK_TYPE = re.compile(r"X|PIX|PXB|PHB|NODE|SYS|SOC|NV[0-9]{1,3}")


def link_family(link_type: str) -> str:
    return "NV" if link_type.startswith("NV") else link_type


def link_class(link_type: str) -> str:
    return LINK_CLASS[link_family(link_type)]


def link_distance(link_type: str) -> int:
    """Smaller is closer: NV# < PIX < PXB < PHB < NODE < SYS."""
    return LINK_DISTANCE[link_family(link_type)]


def nvlink_count(link_type: str) -> int | None:
    return int(link_type[2:]) if link_type.startswith("NV") else None


# How far each of NCCL's path levels reaches, in topo -m's families (its NODE is NCCL's PHB: through the CPU), as
# NCCL_P2P_LEVEL and NCCL_NET_GDR_LEVEL name them ("NCCL_P2P_LEVEL set by environment to PIX"). PXB is NCCL's default
# for both (src/graph/paths.cc: p2pLevel and netGdrLevel PATH_PXB): P2P and GPUDirect RDMA up to a PCIe switch, SHM
# and staging through the CPU past it (PHB, NODE, SYS).
NCCL_DEFAULT_REACH = ("NV", "PIX", "PXB")
NCCL_LEVEL_REACH = {
    "LOC": (), "NVL": ("NV",), "NVB": ("NV",), "C2C": ("NV",), "PIX": ("NV", "PIX"), "PXB": NCCL_DEFAULT_REACH,
    "PXN": NCCL_DEFAULT_REACH, "P2C": NCCL_DEFAULT_REACH, "PHB": (*NCCL_DEFAULT_REACH, "PHB", "NODE"),
    "SYS": (*NCCL_DEFAULT_REACH, "PHB", "NODE", "SYS"),
}


def nccl_reach(level: str) -> tuple:
    """The topo -m link families an NCCL path level reaches; NCCL's default (PXB) for one it does not name."""
    return NCCL_LEVEL_REACH.get(level.strip().upper(), NCCL_DEFAULT_REACH)
