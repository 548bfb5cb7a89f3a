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
