"""`nodecheck nccl-topo` at a terminal: NCCL's picture of the node in a few lines, then what disagrees."""

from __future__ import annotations

from nodecheck.core.units import first_of
from nodecheck.probes.nccl_topo import NcclTopo
from nodecheck.render.table import clean


def nccl_topo_lines(topo: NcclTopo, form: str, findings: list, where: str, apart: str | None = None) -> list[str]:
    what = "topology log (NCCL_DEBUG_SUBSYS=GRAPH)" if form == "log" else f"topology XML (version {topo.version})"
    lines = [f"NCCL's {what}: {len(topo.cpus)} CPU(s), {len(topo.gpus)} GPU(s), {len(topo.nics)} NIC(s)"]
    if topo.ends_early:
        lines.append(f"  {topo.ends_early}")
    for gpu in topo.gpus:
        cpu = topo.cpus[gpu.cpu].numaid if 0 <= gpu.cpu < len(topo.cpus) else None
        own = gpu.chain[-1] if gpu.chain else None
        link = (f", {own.link_gts:g} GT/s" if own and own.link_gts else "") + (f" x{own.link_width}" if own and own.link_width else "")
        nvlinks = sum(n["count"] for n in gpu.nvlinks if isinstance(n.get("count"), int)) or len(gpu.nvlinks)
        lines.append(clean(f"  GPU {gpu.busid}" + (f" rank {gpu.rank}" if gpu.rank is not None else "")
                           + f": NUMA {cpu if cpu is not None else '?'}, {max(0, len(gpu.chain) - 1)} PCI level(s) above{link}"
                           + (f", {nvlinks} NVLink(s)" if gpu.nvlinks else "") + (f", C2C x{gpu.c2c.get('count')}" if gpu.c2c else "")
                           + (" (the paste ends inside it: what follows is unknown)" if gpu.cut else "")))
    for nic in topo.nics:
        names = ", ".join(f"{n.get('name')} {n.get('speed')} Mb/s" for n in nic.nets) or "no <net> (a topology file's bare device)"
        lines.append(clean(f"  NIC {nic.busid}: {names}"))
    if topo.unclassed:
        shown = first_of((b.busid for b in topo.unclassed), 8)
        lines.append(clean(f"  {len(topo.unclassed)} device(s) without a class, none of them a GPU or NIC of {where} "
                           f"(NCCL reads the class from the node it runs on): {shown}"))
    lines.append(f"Against {where}: " + ("not compared: no device in common" if apart else "agrees" if not findings
                                         else f"{len(findings)} finding(s)"))
    lines += [clean(f"  {f.severity}: {f.message}") for f in findings]
    return lines
