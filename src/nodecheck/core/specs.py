"""Theoretical unidirectional rates of each kind of path, derived from detected hardware.

The figures live in data/specs.toml with their sources; this module only does the arithmetic.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from nodecheck.core.limits import MAX_LINK_MBPS
from nodecheck.core.shipped import shipped_table

BUSY_UTILIZATION = 10  # % GPU utilization above which a low PCIe generation is not power saving


@dataclass(frozen=True)
class Spec:
    """The theoretical rate of one direction of one path, and how it was derived."""

    bytes_per_second: float
    basis: str
    source: str


def table() -> dict:
    return shipped_table("specs.toml")


def pcie(gen: int, width: int) -> Spec | None:
    row = table()["pcie"].get(str(gen))
    if row is None or width <= 0:
        return None
    rate = row["gt_per_s"] * 1e9 * row["efficiency"] / 8 * width
    return Spec(rate, f"PCIe {gen}.0 x{width} ({row['gt_per_s']:g} GT/s, {row['encoding']})", row["source"])


def pcie_generation(speed: str | None) -> int | None:
    """The generation of a link speed as sysfs writes it ("32.0 GT/s PCIe" -> 5); None when unknown."""
    match = re.match(r"^\s*([0-9]{1,3}(?:\.[0-9]{1,3})?)\s*GT/s", speed or "")  # "1.2.3 GT/s" is garbage, not a crash
    if not match:
        return None
    rate = float(match[1])
    return next((int(gen) for gen, row in table()["pcie"].items() if row["gt_per_s"] == rate), None)


def nvlink(generation: int, links: int) -> Spec | None:
    """`links` NVLinks of one GENERATION (1 Pascal ... 5 Blackwell), one direction."""
    row = table()["nvlink"].get(str(generation))
    if row is None or links <= 0:
        return None
    per_link = row["gbytes_per_s_per_link"]
    return Spec(per_link * 1e9 * links, f"NVLink {generation} x{links} links ({per_link:g} GB/s per link)", row["source"])


def architecture(number: int | None, gpu_name: str | None) -> tuple[int | None, str]:
    """The GPU's NVML architecture number and how it was known: NVML's own number, else the GPU's name
    (snapshots from before nodecheck recorded it); (None, why) when neither says."""
    rows = table()["nvml_architecture"]
    if number is not None and str(number) in rows:
        return number, f"NVML architecture {number} = {rows[str(number)]['name']}"
    for pattern, arch in table()["gpu_name_architecture"]["patterns"]:
        if gpu_name and re.search(pattern, gpu_name[:200]):
            return arch, f"{rows[str(arch)]['name']} from the GPU name {gpu_name[:80]!r}"
    said = f"NVML architecture {number} is not one nodecheck knows" if number is not None else "architecture not reported"
    return None, f"{said}, GPU name {gpu_name[:80]!r} not recognised" if gpu_name else said


def architecture_row(number: int | None, gpu_name: str | None) -> dict:
    """The specs.toml [nvml_architecture] row of this GPU (by NVML's number, else its name); {} where unknown."""
    arch, _ = architecture(number, gpu_name)
    return table()["nvml_architecture"].get(str(arch), {}) if arch is not None else {}


def nvlink_version_enum(value: int | None) -> tuple[str, int | None]:
    """What nvmlDeviceGetNvLinkVersion's enum names: ("enum 5 = NVLink 3.1", 3); the generation is None
    when the value is not one NVML defines."""
    row = table()["nvml_nvlink_version"].get(str(value)) if value is not None else None
    if row is None:
        return ("link version not reported" if value is None else f"link version enum {value} (not one NVML defines)"), None
    return f"link version enum {value} = NVLink {row[0]}", row[1]


def nvlink_board(gpu_name: str | None) -> dict | None:
    """The specs.toml [[nvlink_boards]] row of this GPU's board (bridged PCIe cards, GA102), or None."""
    for row in table().get("nvlink_boards", []):
        if gpu_name and re.search(row["pattern"], gpu_name[:200]):
            return row
    return None


def no_gpudirect_rdma(gpu_names: list[str | None]) -> str | None:
    """Why a node's GPUs, every one of them, give NICs no GPUDirect RDMA by design (specs.toml [[no_gpudirect_rdma]]:
    DGX Spark's GB10), or None: no GPU, or one that can."""
    sources = [next((row["source"] for row in table().get("no_gpudirect_rdma", [])
                     if name and re.search(row["pattern"], name[:200])), None) for name in gpu_names]
    return sources[0] if sources and all(sources) else None


def gpu_model(gpu_name: str | None, memory_bytes: int | None = None) -> dict | None:
    """The specs.toml [[gpu_models]] row of a GPU by its NVML name (and its memory, where one name covers two
    sizes), or None for a model the table does not know."""
    if not gpu_name:
        return None
    gib = memory_bytes / (1 << 30) if memory_bytes else None
    for row in table().get("gpu_models", []):
        bounds = row.get("memory_gib", {})
        if bounds and (gib is None or not bounds.get("min", 0) <= gib < bounds.get("max", math.inf)):
            continue  # a row for one memory size: a GPU of unknown memory is not guessed into it
        if re.search(row["pattern"], gpu_name[:200]):
            return row
    return None


def nvlink_speed(mbps: int | None) -> tuple[float, str] | None:
    """(GB/s of data one way, source) for NVML's per-link NVLink speed reading (MB/s, the figure `nvidia-smi nvlink -s`
    prints), or None when the reading is none the table knows."""
    if mbps is None:
        return None
    for raw, (gbytes, source) in table().get("nvlink_speeds", {}).items():
        if abs(int(raw) - mbps) <= 2:
            return gbytes, source
    return None


def nvlink_signalling_mbps(arch_number: int | None, gpu_name: str | None) -> int | None:
    """What NVML's speed field and `nvidia-smi nvlink -s` say per link, MB/s, for this GPU (specs.toml [nvlink_speeds]:
    the row of its board, else of its architecture): the figure to compare theirs with, like with like."""
    board = nvlink_board(gpu_name)
    wanted = (board or {}).get("signalling_mbps")
    if wanted:
        return int(wanted)
    said = architecture_row(arch_number, gpu_name).get("nvlink_signalling_mbps")
    return int(said) if said else None


def nvlink_for_gpu(arch_number: int | None, gpu_name: str | None, version_enum: int | None, links: int,
                   speed_mbps: int | None = None) -> tuple[Spec | None, str]:
    """The one-way rate of `links` NVLinks of this GPU: NVML's own per-link speed where the driver gives it and the
    table knows the reading, else its board's rate (GA102 boards run 14.0625 GB/s, not Ampere's 25), else its
    architecture's NVLink generation; NVML's link version enum only cross-checks the architecture (A100s report
    5 = "3.1", Hopper parts 6 = "4.0" and, in the field, 7 = "5.0"). (Spec, "") or (None, why). The basis names
    what decided."""
    if links <= 0:
        return None, "no NVLink"
    said = nvlink_speed(speed_mbps)
    if said is not None:
        gbytes, source = said
        return Spec(gbytes * 1e9 * links, f"NVLink x{links} links ({gbytes:g} GB/s per link; NVML's link speed "
                                          f"{speed_mbps} MB/s)", source), ""
    board = nvlink_board(gpu_name)
    if board is not None and board.get("gbytes_per_s_per_link"):
        gbytes = board["gbytes_per_s_per_link"]
        unread = "" if speed_mbps is None else f"; NVML's link speed {speed_mbps} MB/s is none the table knows"
        return Spec(gbytes * 1e9 * links, f"NVLink x{links} links ({gbytes:g} GB/s per link; the board "
                                          f"{gpu_name[:80]!r}{unread})", board["source"]), ""
    arch, how = architecture(arch_number, gpu_name)
    enum_text, enum_generation = nvlink_version_enum(version_enum)
    if arch is not None:
        row = table()["nvml_architecture"][str(arch)]
        generation = row.get("nvlink_generation")
        if generation is None:
            return None, f"{how} has no NVLink generation in the spec table ({enum_text})"
        if enum_generation is not None and enum_generation != generation:
            enum_text += f", which is not {row['name']}'s NVLink {generation}: the architecture decides"
    elif arch_number is not None:  # a newer architecture than the table: its rate is not the enum's to guess
        return None, f"NVLink rate unknown: {how} ({enum_text}); add it to specs.toml [nvml_architecture]"
    elif enum_generation in (1, 2, 3, 4):  # 20 or 25 GB/s per link whichever part reported it
        generation, how = enum_generation, f"{how}; generation from NVML's link version"
    elif enum_generation is None:
        said = "no active link reports its version" if version_enum is None else f"NVML's {enum_text}"
        return None, f"NVLink rate unknown: {how}, and {said}"
    else:  # 7 (5.0, 50 GB/s) is reported by Hopper parts too: a guess could judge them against twice their rate
        return None, f"NVLink rate unknown: {how}, and NVML's {enum_text} does not settle it (Hopper parts report it too)"
    spec = nvlink(generation, links)
    if spec is None:
        return None, f"no spec for NVLink generation {generation} ({how}; {enum_text})"
    return Spec(spec.bytes_per_second, f"{spec.basis[:-1]}; {how}; {enum_text})", spec.source), ""


# bounded: a port reports 1X to 12X and at most a few thousand Gb/sec; longer digits are garbage, not a figure
_IB_RATE = re.compile(r"^\s*(?P<gbps>\d{1,5}(?:\.\d{1,3})?)\s*Gb/sec(?:\s*\((?P<lanes>\d{1,2})X\s*(?P<name>[A-Z0-9]{1,8})?\))?")


def infiniband(rate_text: str) -> Spec | None:
    """sysfs /sys/class/infiniband/*/ports/*/rate, e.g. '400 Gb/sec (4X NDR)'."""
    match = _IB_RATE.match(rate_text or "")
    if not match:
        return None
    lanes, name = match["lanes"], match["name"]
    if lanes and not name and float(match["gbps"]) == 2.5 * int(lanes):
        name = "SDR"  # the kernel names every speed but SDR: '10 Gb/sec (4X)' is 4X SDR, 8b/10b like the rest
    row = table()["infiniband"].get(name or "")
    if row is not None and lanes:
        gbits = row["gbits_per_lane"] * int(lanes)
        if gbits * 1000 > MAX_LINK_MBPS:  # "(99X XDR)": no port has that many lanes
            return None
        return Spec(gbits * 1e9 / 8, f"InfiniBand {lanes}X {name} ({gbits:g} Gbit/s data rate)", row["source"])
    gbits = float(match["gbps"])
    if gbits <= 0 or gbits * 1000 > MAX_LINK_MBPS:
        return None
    return Spec(gbits * 1e9 / 8, f"InfiniBand {rate_text.strip()[:40]} (rate as reported)", "sysfs port rate")


def ethernet(speed_mbps: int | None) -> Spec | None:
    if speed_mbps is None or speed_mbps <= 0 or speed_mbps > MAX_LINK_MBPS:
        return None
    row = table()["ethernet"]
    standard = "" if speed_mbps in row["known_mbps"] else ", not a standard speed"
    return Spec(speed_mbps * 1e6 / 8, f"Ethernet {speed_mbps} Mb/s{standard}", row["source"])


def default_ratio(test: str, path_kind: str | None, direction: str | None = None,
                  variant: str | None = None) -> tuple[float, str] | None:
    """The calibrated threshold (ratio of spec) for this test on this kind of path (and direction, where
    both ways at once differ from one way; and variant, where one NVLink generation at one rank count differs:
    "gen5x4", a GB200 tray's four GPUs), with its source; None where no published healthy baseline calibrates it
    and the general bandwidth_ratio applies."""
    rows = table().get("thresholds", {})
    row = ((variant and rows.get(f"{test}.{path_kind}.{variant}")) or rows.get(f"{test}.{path_kind}.{direction}")
           or rows.get(f"{test}.{path_kind}")) if path_kind else None
    return (row["ratio"], row["source"]) if row else None


def error_limit(name: str) -> tuple[float, str]:
    """(the limit, its source) of src/nodecheck/core/data/specs.toml [error_limits.NAME]."""
    row = table()["error_limits"][name]
    return float(row["value"]), row["source"]


def error_limit_names() -> list[str]:
    return sorted(table()["error_limits"])


def pcie_errors_per_minute(gen: int | None, width: int | None) -> tuple[float, str] | None:
    """The replays (or AER correctable errors) per minute a healthy link of this generation and width stays
    under, as DCGM derives it: the bit error rate x the lane rate x 60 s x the width, rounded up; None when the
    link is unknown."""
    if gen is None or str(gen) not in table()["pcie"] or not width:
        return None
    ber, source = error_limit("pcie_bit_error_rate")
    rate = table()["pcie"][str(gen)]["gt_per_s"] * 1e9
    return float(math.ceil(ber * rate * 60 * width)), f"BER {ber:g} x {rate / 1e9:g} GT/s x 60 s x{width} ({source})"

