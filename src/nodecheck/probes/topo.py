"""`nvidia-smi topo -m`: GPU<->GPU and GPU<->NIC link types, CPU and NUMA affinity, NIC legend.

Real outputs vary (see ../shared/captures): ANSI escapes in the header, tabs or spaces, padding
tabs that look like empty cells, old-style NIC columns named after the device (mlx5_0), no legend,
CRLF line ends. Cells are therefore read as whitespace-separated tokens, never by column position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nodecheck.core.errors import ParseError
from nodecheck.core.limits import MAX_GPUS, MAX_TOPO_DEVICES
from nodecheck.core.link_types import LINK_TYPE
from nodecheck.core.units import is_cpulist, parse_cpulist, to_int
from nodecheck.probes.base import Probe

SOURCE = "nvidia-smi-topo-m.txt"
ARGV = ["nvidia-smi", "topo", "-m"]


def collect(host, timeout: float) -> "GpuTopology":
    return parse_topo_matrix(host.command(SOURCE, ARGV, timeout))


PROBE = Probe("nvidia_smi_topo", collect, 15.0)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_GPU = re.compile(r"^GPU(\d{1,4})$")
_NIC_COLUMN = re.compile(r"^(NIC\d+|[A-Za-z][A-Za-z0-9]*_\d+)$")
_LEGEND_ENTRY = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_KNOWN_COLUMNS = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID")

@dataclass
class TopoGpu:
    index: int
    cpu_affinity: str = ""  # Linux cpulist, "" when not reported
    numa_affinity: list[int] = field(default_factory=list)
    gpu_numa_id: int | None = None


@dataclass
class TopoLink:
    a: int | str  # GPU index or NIC name
    b: int | str
    type: str  # as printed: NV18, PIX, SYS ...


@dataclass
class GpuTopology:
    gpus: list[TopoGpu]
    nics: list[str]  # resolved names (mlx5_0) where a legend or old-style column names them
    links: list[TopoLink]


def parse_topo_matrix(text: str) -> GpuTopology:
    """Parse `nvidia-smi topo -m`. Raises ParseError for anything that is not that table."""
    lines = [_ANSI.sub("", line).rstrip("\r\n ") for line in text.replace("\r", "").split("\n")]
    header_at = _find_header(lines)
    rows = _rows(lines[header_at + 1 :])
    columns, trailing = _columns(lines[header_at], rows)
    legend = _legend(lines)
    gpu_columns = [c for c in columns if _GPU.match(c)]
    if not gpu_columns:
        raise ParseError("nvidia-smi topo -m: the header names no GPU column")
    cells = {label: _link_cells(label, tokens, columns) for label, tokens in rows.items() if label in columns}
    missing = [c for c in gpu_columns if c not in cells]
    if missing:
        raise ParseError(f"nvidia-smi topo -m: no row for {', '.join(missing)} (truncated output?)")

    name = {c: _device_name(c, legend) for c in columns}
    gpus = [_topo_gpu(c, rows[c][len(columns):], trailing) for c in gpu_columns]
    links = []
    for i, a in enumerate(columns):
        for b in columns[i + 1 :]:
            row = a if a in cells else b  # NIC rows may be missing; GPU rows never are here
            other = b if row == a else a
            if not (_GPU.match(a) or _GPU.match(b)):
                continue  # NIC<->NIC pairs are not paths nodecheck checks
            links.append(TopoLink(name[a], name[b], cells[row][columns.index(other)]))
    nics = [name[c] for c in columns if not _GPU.match(c)]
    return GpuTopology(gpus=gpus, nics=nics, links=links)


def _find_header(lines: list[str]) -> int:
    for i, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == "GPU0" and line[:1].isspace():
            return i
    first = next((line.strip() for line in lines if line.strip()), "")
    raise ParseError(f"not `nvidia-smi topo -m` output: no header line starting with GPU0 (first line: {first[:80]!r})")


def _rows(lines: list[str]) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in lines:
        if not line.strip() or line.strip().startswith("Legend"):
            break
        if line[:1].isspace():
            raise ParseError(f"nvidia-smi topo -m: unexpected indented line in the matrix: {line.strip()[:80]!r}")
        tokens = line.split()
        rows[tokens[0]] = tokens[1:]
    if not rows:
        raise ParseError("nvidia-smi topo -m: a header but no matrix rows")
    return rows


def _columns(header: str, rows: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """Device columns (GPU0.., NIC0.. or mlx5_0..) and the trailing columns (CPU Affinity ...)."""
    tokens = header.split()
    devices: list[str] = []
    for token in tokens:
        if _GPU.match(token) or _NIC_COLUMN.match(token) or token in rows:
            devices.append(token)
        else:
            break
    if len(set(devices)) != len(devices):
        raise ParseError("nvidia-smi topo -m: the header names a device twice")
    gpu_count = sum(1 for d in devices if _GPU.match(d))
    if gpu_count > MAX_GPUS or len(devices) > MAX_TOPO_DEVICES:
        raise ParseError(f"nvidia-smi topo -m: {gpu_count} GPUs and {len(devices) - gpu_count} NICs is more than "
                         f"a node has (at most {MAX_GPUS} GPUs, {MAX_TOPO_DEVICES} devices accepted)")
    rest = header.split(devices[-1], 1)[1] if devices else header
    trailing: list[str] = []
    for piece in re.split(r"\t+|\s{2,}", rest.strip()):
        known = _KNOWN_COLUMNS.findall(piece)
        trailing.extend(known if known else [piece] if piece else [])
    return devices, trailing


def _legend(lines: list[str]) -> dict[str, str]:
    legend: dict[str, str] = {}
    in_legend = False
    for line in lines:
        if line.strip().startswith("NIC Legend"):
            in_legend = True
        elif in_legend and (match := _LEGEND_ENTRY.match(line)):
            legend[match[1]] = match[2]
    return legend


def _device_name(column: str, legend: dict[str, str]) -> int | str:
    gpu = _GPU.match(column)
    return int(gpu[1]) if gpu else legend.get(column, column)


def _link_cells(label: str, tokens: list[str], columns: list[str]) -> list[str]:
    cells = tokens[: len(columns)]
    if len(cells) < len(columns):
        raise ParseError(f"nvidia-smi topo -m: row {label} has {len(cells)} link cells for {len(columns)} devices")
    for column, cell in zip(columns, cells, strict=False):
        if not LINK_TYPE.fullmatch(cell):
            raise ParseError(f"nvidia-smi topo -m: row {label}, column {column}: {cell[:20]!r} is not a link type")
        if (cell == "X") != (column == label):
            raise ParseError(f"nvidia-smi topo -m: row {label}, column {column}: 'X' must be on the diagonal only")
    return cells


def _topo_gpu(column: str, values: list[str], trailing: list[str]) -> TopoGpu:
    cells = _assign_trailing(column, values, trailing)
    gpu = TopoGpu(index=int(column[3:]))
    affinity = cells.get("CPU Affinity", "")
    if affinity not in ("", "N/A"):
        try:
            parse_cpulist(affinity)
        except ValueError as error:
            raise ParseError(f"nvidia-smi topo -m: {column} CPU Affinity {affinity[:30]!r}: {error}") from None
        gpu.cpu_affinity = affinity
    numa = cells.get("NUMA Affinity", "")
    if numa not in ("", "N/A"):
        if not is_cpulist(numa):
            raise ParseError(f"nvidia-smi topo -m: {column} NUMA Affinity {numa[:30]!r} is not a node list")
        try:
            gpu.numa_affinity = parse_cpulist(numa)
        except ValueError as error:
            raise ParseError(f"nvidia-smi topo -m: {column} NUMA Affinity: {error}") from None
    numa_id = cells.get("GPU NUMA ID", "")
    if numa_id not in ("", "N/A"):
        gpu.gpu_numa_id = to_int(numa_id)
        if gpu.gpu_numa_id is None or gpu.gpu_numa_id < 0:
            raise ParseError(f"nvidia-smi topo -m: {column} GPU NUMA ID {numa_id[:30]!r} is not a number")
    return gpu


def _assign_trailing(column: str, values: list[str], trailing: list[str]) -> dict[str, str]:
    if len(values) > len(trailing):
        raise ParseError(f"nvidia-smi topo -m: row {column} has {len(values)} values after the links, header has {len(trailing)}")
    if len(values) == len(trailing):
        return dict(zip(trailing, values, strict=False))
    # Fewer values than columns: an empty cell was printed as nothing. An affinity that is absent
    # shifts the rest left; a CPU affinity looks like a cpulist with ',' or '-'.
    out: dict[str, str] = {}
    pending = list(values)
    for position, name in enumerate(trailing):
        columns_left = len(trailing) - position
        if not pending:
            out[name] = ""
        elif name == "CPU Affinity" and len(pending) < columns_left and not re.search(r"[-,]", pending[0]):
            out[name] = ""
        else:
            out[name] = pending.pop(0)
    return out
