"""The config's [topology] table: which NIC(s) go with which GPU in the topology file `nccl-topo --write` makes for
a VM whose PCI tree says nothing of it (assemble/nccl_topo_file.py).

    [topology]
    pairs = [["gpu0", "mlx5_0"], ["gpu1", "mlx5_1"]]   # a GPU by index, a NIC by netdev or RDMA device name"""

from __future__ import annotations

import re

from nodecheck.core.errors import ConfigError

_GPU = re.compile(r"gpu[0-9]{1,4}")
_NIC = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MAX_PAIRS = 256


def topology_pairs(table: dict, source: str) -> list[tuple[str, str]]:
    unknown = sorted(set(table) - {"pairs"})
    if unknown:
        raise ConfigError(f"{source}: key 'topology.{str(unknown[0])[:40]}': unknown (expected pairs)")
    pairs = table.get("pairs", [])
    if not isinstance(pairs, list) or len(pairs) > MAX_PAIRS:
        raise ConfigError(f"{source}: key 'topology.pairs': expected a list of at most {MAX_PAIRS} [\"gpuN\", \"NIC\"] pairs")
    out = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
                and _GPU.fullmatch(pair[0]) and _NIC.fullmatch(pair[1])):
            raise ConfigError(f"{source}: key 'topology.pairs': expected [\"gpuN\", \"NIC name\"], got {str(pair)[:60]}")
        out.append((pair[0], pair[1]))
    return out
