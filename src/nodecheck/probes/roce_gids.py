"""A RoCE port's GID table (/sys/class/infiniband/DEV/ports/N/gids/I and gid_attrs/types/I): the addresses NCCL
may put on its RoCE packets, one per IP address of the port's netdev and RoCE version. On InfiniBand the subnet
manager assigns the GID; on RoCE it comes from the netdev's addresses, so a rail whose IPv4 address is missing,
or an NCCL_IB_GID_INDEX that names another entry on this node than on its peers, leaves NCCL on a link-local GID
that does not route: every connection across nodes times out (NVIDIA/nccl#769, #426).

read_gid_table(): the set entries, as sysfs prints them (an unset entry reads as zeros, and its type file refuses to
be read), up to the end of the table or UNSET_RUN unset entries in a row; parse_gid_table(): the GIDs and their RoCE
versions by index."""

from __future__ import annotations

import re

MAX_GIDS = 256  # a port's table (mlx5: 255 entries), as far as NCCL walks it: two per IP address (RoCE v1 and v2)
# the kernel fills the lowest free entry: this many unset in a row end what is set (a node whose pods' macvlans or
# VLANs put 16 IPv6 addresses on the rail has its IPv4 GIDs past index 32, where a fixed 32 stopped reading)
UNSET_RUN = 32
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_GID = re.compile(r"[0-9a-f]{4}(?::[0-9a-f]{4}){7}")
_INDEX = re.compile(r"[0-9]{1,3}")  # ASCII digits: '²' passes str.isdigit and fails int()
ROCE_VERSIONS = {"IB/RoCE v1": 1, "RoCE v2": 2}  # gid_attrs/types, as NCCL's ncclIbRoceGetVersionNum reads them


def read_gid_table(host, port_dir: str) -> tuple[dict[str, str], dict[str, str]] | None:
    """({index: gid}, {index: type}) of the set entries; None where the port has no GID table to read."""
    gids, types, unset = {}, {}, 0
    for index in range(MAX_GIDS):
        gid = host.read_text(f"{port_dir}/gids/{index}")
        if gid is None:
            if index == 0:
                return None
            break
        if gid.strip() == ZERO_GID:
            unset += 1
            if unset == UNSET_RUN:
                break
            continue
        unset = 0
        gids[str(index)] = gid
        kind = host.read_text(f"{port_dir}/gid_attrs/types/{index}")
        if kind is not None:
            types[str(index)] = kind
    return gids, types


def parse_gid_table(gids, types) -> tuple[dict[str, str], dict[str, int]] | None:
    """({index: gid as sysfs writes it}, {index: its RoCE version, 1 or 2, where read}); None when not read.
    Entries that are not a GID are left out (a snapshot is untrusted)."""
    if not isinstance(gids, dict):
        return None
    types = types if isinstance(types, dict) else {}
    table, versions = {}, {}
    for key, text in list(gids.items())[:MAX_GIDS]:
        gid = text.strip().lower() if isinstance(text, str) else ""
        if not (isinstance(key, str) and _INDEX.fullmatch(key) and int(key) < MAX_GIDS and _GID.fullmatch(gid)):
            continue
        table[str(int(key))] = gid
        kind = types.get(key)
        if isinstance(kind, str) and kind.strip() in ROCE_VERSIONS:
            versions[str(int(key))] = ROCE_VERSIONS[kind.strip()]
    return table, versions
