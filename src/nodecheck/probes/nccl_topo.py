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
under one <pci>; a provider's topology file whose GPUs and NICs are bare <pci> of their class (Azure's), and a paste
cut mid-tree: read what is there and say where it ends. Bounded: MAX_TOPO_BYTES of text, MAX_ELEMENTS, MAX_DEPTH; no
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

    busid: str
    pci_class: str | None
    link_gts: float | None  # None: unknown ("", "0", a figure NCCL did not write)
    link_width: int | None


@dataclass
class NcclTopoCpu:
    numaid: int | None  # None: not written (a GB10's dump) or not a number
    affinity: str | None
    host_hash: str | None  # several in one dump: a multi-node NVLink domain fused into one "node"
    arch: str | None
    vendor: str | None


@dataclass
class NcclTopoGpu:
    busid: str | None  # its own <pci>'s
    cpu: int  # position in NcclTopo.cpus
    chain: list[PciHop]  # the <pci> levels from its CPU down to it, its own last
    dev: int | None = None  # None: a topology file's bare <pci> of a GPU's class
    rank: int | None = None
    sm: int | None = None
    gdr: bool | None = None
    nvlinks: list[dict] = field(default_factory=list)  # {target (busid), count, tclass}
    c2c: dict | None = None  # {bw (MB/s per link), count}


@dataclass
class NcclTopoNic:
    busid: str | None
    cpu: int
    chain: list[PciHop]
    nets: list[dict] = field(default_factory=list)  # {name, dev, speed (Mb/s), port, guid, gdr}; none: a bare <pci>


@dataclass
class NcclTopo:
    version: int | None
    cpus: list[NcclTopoCpu] = field(default_factory=list)
    gpus: list[NcclTopoGpu] = field(default_factory=list)
    nics: list[NcclTopoNic] = field(default_factory=list)
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
                                              _int(attrs.get("sm")), _flag(attrs.get("gdr"))))
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
        if tag == "pci" and self.pcis:
            closing = self.pcis[-1]
            hop = closing["hop"]
            if not closing["children"] and hop.pci_class:  # a topology file's bare device: its class says what it is
                if hop.pci_class.startswith(GPU_CLASSES):
                    self.topo.gpus.append(NcclTopoGpu(hop.busid, self._cpu(), self._chain()))
                elif hop.pci_class.startswith(NIC_CLASSES):
                    self.topo.nics.append(NcclTopoNic(hop.busid, self._cpu(), self._chain()))
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
