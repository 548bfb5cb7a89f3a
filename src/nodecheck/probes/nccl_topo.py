"""NCCL's own picture of a node: the topology XML it writes with NCCL_TOPO_DUMP_FILE and reads with NCCL_TOPO_FILE
(NVIDIA/nccl src/graph/xml.cc, topo.cc). NCCL routes every job by it; when it is wrong (an NVLink lost, a switch
that reverses which NIC is near which GPU, a VM's flattened PCI tree) the job is slow and nothing says why.

    <system version>                          1 (NCCL), 2 (RCCL)
      <cpu numaid affinity host_hash arch vendor familyid modelid>     one per NUMA node; several host_hash in a
                                                                       multi-node NVLink dump
        <pci busid class link_speed link_width vendor device ...>     nested: NCCL collapses each switch's port pair
                                                                       into one level
          <gpu dev sm rank gdr>  <nvlink target count tclass/>  <c2c bw count/>
          <nic>  <net name dev speed port guid gdr .../>

What real files hold, each read: RCCL's version 2; link_width "0" or "" (unknown, never a downtrained link); speeds
written "32.0 GT/s PCIe", "16 GT/s", "2.5 GT/s PCIe"; the fffffff:ff:ff.0 NVSwitch NCCL cannot see; several <gpu>
under one <pci>; a provider's topology file whose GPUs and NICs are bare <pci> of their class (Azure's) or of none
(AWS's g5: NCCL reads the class from sysfs; kept as unclassed), and a paste cut mid-tree: read what is there and say
where it ends. Bounded: MAX_TOPO_BYTES of text, MAX_ELEMENTS, MAX_DEPTH; no
DTD or entity (a dump has none). Raises only ParseError."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from nodecheck.core.errors import ParseError
from nodecheck.core.pci import normal_pci

MAX_TOPO_BYTES = 4 << 20  # an NVL72 rack's dump is some hundred KB
MAX_ELEMENTS = 50_000
MAX_DEPTH = 32  # NCCL's own nesting is under ten deep
GPU_CLASSES = ("0x0302", "0x0300", "0x0380")  # 3D controller (NVIDIA), VGA, display (AMD's MI series: 0x038000)
NIC_CLASSES = ("0x0200", "0x0207")  # Ethernet, InfiniBand
_GTS = re.compile(r"\s*(\d{1,3}(?:\.\d{1,3})?)\s*GT/s")
_DECLARATIONS = re.compile(r"<!(?:DOCTYPE|ENTITY)", re.IGNORECASE)


@dataclass
class PciHop:
    """One <pci> level above a device (or its own): NCCL's figures for its link."""

    busid: str | None = None
    pci_class: str | None = None
    link_gts: float | None = None  # None: unknown ("", "0", a figure NCCL did not write)
    link_width: int | None = None
    nccl_gbps: float | None = None  # the link's bandwidth as NCCL rates it (GB/s), where its log says so


@dataclass
class NcclTopoCpu:
    numaid: int | None = None  # None: not written (a GB10's dump) or not a number
    affinity: str | None = None
    host_hash: str | None = None  # several in one dump: a multi-node NVLink domain fused into one "node"
    arch: str | None = None
    vendor: str | None = None


@dataclass
class NcclTopoGpu:
    busid: str | None = None  # its own <pci>'s
    cpu: int = 0  # position in NcclTopo.cpus
    chain: list[PciHop] = field(default_factory=list)  # the <pci> levels from its CPU down to it, its own last
    dev: int | None = None  # None: a topology file's bare <pci> of a GPU's class
    rank: int | None = None
    sm: int | None = None
    gdr: bool | None = None
    nvlinks: list[dict] = field(default_factory=list)  # {target (busid), count, tclass}
    c2c: dict | None = None  # {bw (MB/s per link), count}
    cut: bool = False  # a paste that ends inside this <gpu>: what it held past the cut (NVLinks, C2C) is unknown


@dataclass
class NcclTopoNic:
    busid: str | None = None
    cpu: int = 0
    chain: list[PciHop] = field(default_factory=list)
    nets: list[dict] = field(default_factory=list)  # {name, dev, speed (Mb/s), port, guid, gdr}; none: a bare <pci>


@dataclass
class NcclTopoBare:
    """A topology file's bare <pci> without a class (AWS's file for g5.12xlarge lists its four GPUs so): NCCL reads
    the class from sysfs on the node it runs on, so what it is depends on that node (verdicts/nccl_topo.py names it)."""
    busid: str | None = None
    cpu: int = 0
    chain: list[PciHop] = field(default_factory=list)


@dataclass
class NcclTopo:
    version: int | None = None
    cpus: list[NcclTopoCpu] = field(default_factory=list)
    gpus: list[NcclTopoGpu] = field(default_factory=list)
    nics: list[NcclTopoNic] = field(default_factory=list)
    unclassed: list[NcclTopoBare] = field(default_factory=list)  # bare devices the file gives no class
    ends_early: str | None = None  # where a cut or broken paste stopped being read; None: read to </system>


def parse_nccl_topo_xml(text: str) -> NcclTopo:
    """The topology NCCL dumped (or a topology file), as far as it is well-formed: ParseError when it is not NCCL's
    XML at all, past its bounds, or holds a DTD or an entity."""
    if len(text) > MAX_TOPO_BYTES:
        raise ParseError(f"NCCL topology of {len(text)} bytes: more than {MAX_TOPO_BYTES >> 20} MiB, not read")
    if _DECLARATIONS.search(text):
        raise ParseError("NCCL topology with a DTD or an entity declaration: NCCL writes none, not read")
    parser = ET.XMLPullParser(events=("start", "end"))
    reader = _Reader()
    error = None
    try:
        parser.feed(text)
        reader.take(parser.read_events())
        parser.close()
    except ET.ParseError as broken:
        error = broken
    reader.take(parser.read_events())  # what came before the break
    if reader.topo is None:
        raise ParseError("not NCCL's topology XML: no <system> element" + (f" ({error})" if error else ""))
    if error is not None:
        line, column = getattr(error, "position", (0, 0))
        reader.topo.ends_early = f"the XML ends or breaks at line {line}, column {column} ({str(error).split(':')[0]}): read up to there"
    return reader.topo


class _Reader:
    """Builds the NcclTopo from the parser's events, counting elements and depth as it goes."""

    def __init__(self):
        self.topo: NcclTopo | None = None
        self.stack: list[tuple[str, dict]] = []  # (tag, attributes) of the open elements
        self.elements = 0
        self.pcis: list[dict] = []  # open <pci>: {"hop": PciHop, "children": how many <pci>, <gpu>, <nic> in it}
        self.gpus_open: list[int] = []  # positions in topo.gpus of the <gpu> elements not yet closed

    def take(self, events) -> None:
        for event, element in events:
            if event == "start":
                self._start(element.tag, dict(element.attrib))
            else:
                self._end(element.tag)
                element.clear()  # a dump of many elements is read in one pass, none kept

    def _start(self, tag: str, attrs: dict) -> None:
        self.elements += 1
        if self.elements > MAX_ELEMENTS or len(self.stack) >= MAX_DEPTH:
            raise ParseError(f"NCCL topology past {MAX_ELEMENTS} elements or {MAX_DEPTH} levels deep: not read")
        if not self.stack:
            if tag != "system":
                raise ParseError(f"not NCCL's topology XML: root element is <{str(tag)[:40]}>")
            self.topo = NcclTopo(_int(attrs.get("version")))
        elif tag == "cpu":
            self.topo.cpus.append(NcclTopoCpu(_int(attrs.get("numaid")), _text(attrs.get("affinity")), _text(attrs.get("host_hash")),
                                              _text(attrs.get("arch")), _text(attrs.get("vendor"))))
        elif tag == "pci":
            self._child()
            self.pcis.append({"hop": PciHop(_busid(attrs.get("busid")), _text(attrs.get("class")), _gts(attrs.get("link_speed")),
                                            _width(attrs.get("link_width"))), "children": 0})
        elif tag == "gpu":
            self._child()
            self.topo.gpus.append(NcclTopoGpu(self._busid(), self._cpu(), self._chain(), _int(attrs.get("dev")), _int(attrs.get("rank")),
                                              _int(attrs.get("sm")), _flag(attrs.get("gdr")), cut=True))  # until its end tag
            self.gpus_open.append(len(self.topo.gpus) - 1)
        elif tag == "nic":
            self._child()
            self.topo.nics.append(NcclTopoNic(self._busid(), self._cpu(), self._chain()))
        elif tag == "nvlink" and self._inside("gpu") and self.topo.gpus:
            self.topo.gpus[-1].nvlinks.append({"target": _busid(attrs.get("target")), "count": _int(attrs.get("count")),
                                               "tclass": _text(attrs.get("tclass"))})
        elif tag == "c2c" and self._inside("gpu") and self.topo.gpus:
            self.topo.gpus[-1].c2c = {"bw": _int(attrs.get("bw")), "count": _int(attrs.get("count"))}
        elif tag == "net" and self._inside("nic") and self.topo.nics:
            self.topo.nics[-1].nets.append({"name": _text(attrs.get("name")), "dev": _int(attrs.get("dev")),
                                            "speed": _int(attrs.get("speed")), "port": _int(attrs.get("port")),
                                            "guid": _text(attrs.get("guid")), "gdr": _flag(attrs.get("gdr"))})
        self.stack.append((tag, attrs))

    def _end(self, tag: str) -> None:
        if tag == "gpu" and self.gpus_open:
            self.topo.gpus[self.gpus_open.pop()].cut = False
        if tag == "pci" and self.pcis:
            closing = self.pcis[-1]
            hop = closing["hop"]
            if not closing["children"] and hop.pci_class:  # a topology file's bare device: its class says what it is
                if hop.pci_class.startswith(GPU_CLASSES):
                    self.topo.gpus.append(NcclTopoGpu(hop.busid, self._cpu(), self._chain()))
                elif hop.pci_class.startswith(NIC_CLASSES):
                    self.topo.nics.append(NcclTopoNic(hop.busid, self._cpu(), self._chain()))
            elif not closing["children"] and hop.busid:  # no class: NCCL reads it from the node's sysfs
                self.topo.unclassed.append(NcclTopoBare(hop.busid, self._cpu(), self._chain()))
            self.pcis.pop()
        if self.stack:
            self.stack.pop()

    def _child(self) -> None:
        if self.pcis:
            self.pcis[-1]["children"] += 1

    def _inside(self, tag: str) -> bool:
        return bool(self.stack) and self.stack[-1][0] == tag

    def _busid(self) -> str | None:
        return self.pcis[-1]["hop"].busid if self.pcis else None

    def _cpu(self) -> int:
        return max(0, len(self.topo.cpus) - 1)

    def _chain(self) -> list[PciHop]:
        return [open_pci["hop"] for open_pci in self.pcis]


def _text(value) -> str | None:
    return str(value)[:200] if value not in (None, "") else None


def _int(value) -> int | None:
    text = str(value).strip() if value is not None else ""
    if not text or len(text) > 20:
        return None
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def _flag(value) -> bool | None:
    number = _int(value)
    return None if number is None else number != 0


def _gts(value) -> float | None:
    found = _GTS.match(str(value)[:40]) if value else None
    return float(found[1]) if found and float(found[1]) > 0 else None


def _width(value) -> int | None:
    number = _int(value)
    return number if number is not None and 0 < number <= 32 else None


def _busid(value) -> str | None:
    """A busid as nodecheck spells PCI addresses where it is one; NCCL's own forms (fffffff:ff:ff.0, an NVSwitch it
    cannot see) as written."""
    if not value:
        return None
    text = str(value)[:40].strip().lower()
    return normal_pci(text) or text


# The topology as NCCL's log prints it (NCCL_DEBUG_SUBSYS=GRAPH or INIT), one "=== System" block per rank:
#   === System : maxBw 24.0 totalBw 240.0 ===      (maxWidth ... before NCCL 2.12)
#   CPU/0-0 (1/1/2)                                  a top-level node; ids "0", "0-0", "FFFFFFFFFFFFFFFF"
#     + PCI[24.0] - PCI/0-4b000                      a link to a child, its depth given by where "+" stands
#                   + PCI[24.0] - GPU/0-4e000 (0)    a GPU and its rank
#   + NVL[240.0] - NVS/0,  + NET[25.0] - NET/0, + SYS[5000.0] - CPU/1
_SYSTEM = re.compile(r"=== System : (?:maxBw|maxWidth) ")
_CLOSING = re.compile(r"^={20,}$")  # the block's last line (src/graph/topo.cc ncclTopoPrint): every node printed
_INFO = re.compile(r"NCCL INFO ?(.*)$")
_NODE = re.compile(r"^(?P<type>CPU|GPU|NIC|NET|NVS|PCI)/(?:(?P<system>\d{1,4})-)?(?P<id>[0-9A-Fa-f]{1,16})\b(?:\s*\((?P<rank>\d{1,7})\))?")
_LINK = re.compile(r"^(?P<indent>\s*)\+ (?P<link>[A-Z0-9]{2,4})\[(?P<bw>\d{1,6}(?:\.\d{1,3})?)\] - (?P<node>.+)$")
MAX_LOG_LINES = 200_000


def parse_nccl_topo_log(text: str) -> NcclTopo:
    """The topology of the first "=== System" block of an NCCL debug log: CPUs, each GPU (its rank, the PCI levels
    from its CPU with NCCL's bandwidth for each, its NVLinks' targets and bandwidth) and NIC. ParseError when the log
    holds no such block. A GPU is printed with its NVLinks below it, so one is whole once a line at its own depth or
    above follows, or the block's closing line; one the paste (or another process's line) ends below is `cut`."""
    if len(text) > MAX_TOPO_BYTES:
        raise ParseError(f"NCCL log of {len(text)} bytes: more than {MAX_TOPO_BYTES >> 20} MiB, not read")
    topo, stack, prefix, closed = None, [], "", False  # stack: (column of "+", node kind, the hops down to it, the GPU it is)

    def whole(entries) -> None:
        for entry in entries:
            if entry[3] is not None:
                entry[3].cut = False
    for line in text.splitlines()[:MAX_LOG_LINES]:
        found = _INFO.search(line[:2000])
        body = found[1] if found else line[:2000]
        if topo is None:
            if _SYSTEM.search(body):
                topo, prefix = NcclTopo(None), (line[:found.start()] if found else "")
            continue
        if found is not None and line[:found.start()] != prefix:
            continue  # another process's or thread's line in the middle of this one's block (several ranks log at once)
        if _CLOSING.match(body.strip()):
            closed = True
            break
        link = _LINK.match(body)
        node = _NODE.match(body.strip()) if link is None else None
        if node is not None and not body.startswith(" "):  # a top-level node: a CPU (or, on some, a NIC)
            if node["type"] == "CPU":
                topo.cpus.append(NcclTopoCpu(_hex_or_none(node["id"]), None, None, None, None))
            whole(stack)
            stack = [(-1, node["type"], [], None)]
            continue
        if link is None or not stack:
            break  # the block ends at the first line that is none of its own
        column = len(link["indent"])
        while stack and stack[-1][0] >= column:
            whole([stack.pop()])
        if not stack:
            break
        _, parent, hops, gpu = stack[-1]
        child = _NODE.match(link["node"].strip())
        if child is None:
            continue
        kind, bandwidth = child["type"], float(link["bw"])
        if link["link"] == "NVL" and gpu is not None:  # a GPU's NVLink: to a peer GPU or an NVSwitch
            gpu.nvlinks.append({"target": "nvswitch" if kind == "NVS" else _log_busid(child["id"]), "count": None,
                                "tclass": None, "bw": bandwidth})
            continue
        if link["link"] != "PCI" or parent not in ("CPU", "PCI"):
            continue  # SYS between CPUs, NET below a NIC, links back up
        hop = PciHop(_log_busid(child["id"]), None, None, None, bandwidth)
        cpu = max(0, len(topo.cpus) - 1)
        here = None
        if kind == "GPU":
            here = NcclTopoGpu(hop.busid, cpu, hops + [hop], rank=_int(child["rank"]), cut=True)  # until a line closes it
            topo.gpus.append(here)
        elif kind == "NIC":
            topo.nics.append(NcclTopoNic(hop.busid, cpu, hops + [hop]))
        stack.append((column, kind, hops + [hop], here))
    if topo is None:
        raise ParseError("no \"=== System\" block: NCCL prints its topology with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=GRAPH")
    if closed:
        whole(stack)
    else:
        topo.ends_early = "the block ends before NCCL's closing line of '=': read up to there"
    return topo


def _hex_or_none(value: str) -> int | None:
    number = int(value, 16) if value else None
    return number if number is not None and number < 1 << 16 else None  # FFFFFFFFFFFFFFFF: no NUMA id


def _log_busid(value: str) -> str:
    """NCCL's int64 bus id as it prints it (hex of domain, bus, device, function: E000 = 0000:0e:00.0)."""
    digits = f"{int(value, 16):09x}"[-9:]
    return f"{digits[:4]}:{digits[4:6]}:{digits[6:8]}.{digits[8]}"
