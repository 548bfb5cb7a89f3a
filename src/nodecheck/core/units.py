"""Small pure helpers: Linux cpulists and CPU masks, human rates."""

from __future__ import annotations

import math
import re

_CPULIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
# Linux's NR_CPUS tops out at 8192; a CPU number far past it is a corrupt or hostile input, and
# expanding `0-4294967295` would take gigabytes
MAX_CPU_ID = 65535
MAX_CPULIST_CHARS = 64 * 1024


_INTEGER = re.compile(r"-?[0-9]+")


def natural_key(name: str) -> tuple:
    """Sort key that orders numbers inside names as numbers: mlx5_9 before mlx5_10, GPU2 before GPU10."""
    # isdecimal, not isdigit: '²' is a digit that int() refuses
    return tuple((0, int(part), "") if part.isdecimal() else (1, 0, part) for part in re.split(r"(\d+)", str(name)) if part)


def is_int(value) -> bool:
    """An int as JSON gives one, not a bool (which Python counts as an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def first_of(items, limit: int) -> str:
    """The first `limit` items, comma-separated, and how many more ("3, 4 and 6 more")."""
    items = list(items)
    return ", ".join(map(str, items[:limit])) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def tally(records: list[dict], key: dict, limit: int) -> None:
    """Count one more of the record `key` names in `records` (each `key | {"count": n}`); a new one is kept while fewer
    than `limit` are: a hostile log naming millions stays bounded, and the search stays short."""
    for entry in records:
        if all(entry[k] == v for k, v in key.items()):
            entry["count"] += 1
            return
    if len(records) < limit:
        records.append(key | {"count": 1})


def to_int(text: str | None) -> int | None:
    """'42' -> 42, '-1' -> -1; None for anything else (str.isdigit() accepts '²', which int() refuses)."""
    # 30 characters: more than any count a source reports, and int() of thousands of digits is slow
    return int(text) if text is not None and len(text) <= 30 and _INTEGER.fullmatch(text) else None


def is_cpulist(text: str) -> bool:
    return bool(_CPULIST.match(text))


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8]. Raises ValueError on anything else."""
    text = text.strip()
    if not text:
        return []
    if len(text) > MAX_CPULIST_CHARS or not is_cpulist(text):
        raise ValueError(f"not a cpulist: {text[:80]!r}")
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if max(len(lo), len(hi)) > 6 or int(hi or lo) > MAX_CPU_ID:  # 6 digits: int() stays cheap
            raise ValueError(f"CPU {(hi or lo)[:20]} in cpulist: no machine has more than {MAX_CPU_ID + 1} CPUs")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"descending range in cpulist: {part[:40]!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus: list[int] | set[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8' (the Linux cpulist form)."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    start = prev = None
    for cpu in ordered:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            ranges.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = cpu
    if start is not None:
        ranges.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(ranges)


def mask_words_to_cpus(words: list[int], word_bits: int = 64) -> list[int]:
    """NVML's cpu affinity (a list of unsigned longs, lowest word first) -> CPU numbers."""
    words = words[: (MAX_CPU_ID + 1) // word_bits]
    return [i * word_bits + bit for i, word in enumerate(words) for bit in range(word_bits) if word >> bit & 1]


def hwloc_bitmap_to_set(text: str) -> set[int]:
    """hwloc XML bitmaps: '0x0000ffff', '0x000000ff,0xffffffff' (32-bit words, most significant first)."""
    bits: set[int] = set()
    # hwloc may leave a zero word empty ('0x1,,0x0'); it still takes its 32-bit place.
    words = text.strip().split(",")
    if len(words) > (MAX_CPU_ID + 1) // 32:
        raise ValueError(f"hwloc bitmap of {len(words)} words: more than {MAX_CPU_ID + 1} bits")
    for position, word in enumerate(reversed(words)):
        value = int(word or "0", 16)
        bits.update(position * 32 + bit for bit in range(32) if value >> bit & 1)
    return bits


def format_rate(bytes_per_second: float | None) -> str:
    """63.0e9 -> '63.0 GB/s'; None -> 'unknown'."""
    if bytes_per_second is None:
        return "unknown"
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_second >= scale:
            return f"{bytes_per_second / scale:.1f} {unit}"
    return f"{bytes_per_second:.0f} B/s"




def format_figure(m, spec: bool = False, value: float | None = None) -> str:
    """A measurement's figure (its spec's, or another `value` of its kind) in its unit: TFLOPS for a test of
    compute, else its path's rate."""
    if m.flops_per_second is not None:
        value = value if value is not None else m.spec_flops_per_second if spec else m.flops_per_second
        return "unknown" if value is None else f"{value / 1e12:.0f} TFLOPS"
    return format_path_rate(m.scope, value if value is not None else m.spec_bytes_per_second if spec else m.bytes_per_second)


def format_path_rate(scope: str | None, bytes_per_second: float | None) -> str:
    """A measurement's rate in its path's unit: Gbit/s for a NIC, as networks quote it; GB/s for the rest (h2d/d2h,
    p2p, a collective inside a node or across nodes), as nvbandwidth and nccl-tests write them."""
    return format_bits(bytes_per_second) if scope == "nic" else format_rate(bytes_per_second)


def format_bits(bytes_per_second: float | None) -> str:
    """Network rates in the unit people quote them in: 12.5e9 B/s -> '100 Gbit/s'."""
    if bytes_per_second is None:
        return "unknown"
    bits = bytes_per_second * 8
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits:g} bit/s"


# one way to match each number (no nested optional digit runs): linear time on any input
_QUANTITY = re.compile(r"\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]*)\s*")
MAX_QUANTITY_CHARS = 64
_RATE_UNITS = {  # bytes per second per unit; bit rates are decimal, as networks quote them
    "B/s": 1, "b/s": 1 / 8, "kB/s": 1e3, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
    "KiB/s": 2**10, "MiB/s": 2**20, "GiB/s": 2**30, "TiB/s": 2**40,
    "bit/s": 1 / 8, "kbit/s": 1e3 / 8, "Mbit/s": 1e6 / 8, "Gbit/s": 1e9 / 8, "Tbit/s": 1e12 / 8,
    "Kb/s": 1e3 / 8, "Mb/s": 1e6 / 8, "Gb/s": 1e9 / 8, "Tb/s": 1e12 / 8, "Gbps": 1e9 / 8, "Mbps": 1e6 / 8,
}
_COUNT_SUFFIXES = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "m": 1e6, "B": 1e9, "b": 1e9, "G": 1e9, "T": 1e12, "t": 1e12}


def parse_rate(text: str) -> float:
    """'1.25GB/s', '100Gbit/s', '400 Gb/s', '12 GiB/s' -> bytes per second (> 0); 'b' is a bit, 'B' a
    byte. ValueError says what is accepted."""
    return _quantity(text, _RATE_UNITS, "a rate with its unit, e.g. 1.25GB/s, 100Gbit/s, 400Gb/s, 12GiB/s")


def parse_count(text: str) -> float:
    """'25M', '10B', '1.3e9', '175b' -> a count (> 0). ValueError otherwise."""
    return _quantity(text, _COUNT_SUFFIXES, "a count like 25M, 7B, 1.3e9 (suffixes k, M, B/G, T)")


def _quantity(text: str, units: dict[str, float], expected: str) -> float:
    match = _QUANTITY.fullmatch(text) if len(text) <= MAX_QUANTITY_CHARS else None
    if not match or match[2] not in units:
        raise ValueError(f"{text[:MAX_QUANTITY_CHARS]!r}: expected {expected}")
    value = float(match[1]) * units[match[2]]
    if not 0 < value < math.inf:
        raise ValueError(f"{text!r}: must be above zero (and finite)")
    return value


def format_bytes(count: float | None) -> str:
    """Sizes in decimal units, as rates are: 100e6 -> '100 MB', 134217728 -> '134 MB'."""
    return "unknown" if count is None else format_count(count, "B")


def format_size(count: int) -> str:
    """A message or buffer size in binary units, as nccl-tests' -b/-e take them: 16777216 -> '16 MiB', 1536 -> '1.5 KiB'."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if count >= 1 << shift:
            return f"{count / (1 << shift):g} {unit}"
    return f"{count} B"


def format_params(count: float) -> str:
    """A parameter count as models are named: 25e6 -> '25M', 7e9 -> '7B', 1.3e12 -> '1.3T'."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{suffix}"
    return f"{count:.3g}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def format_count(count: float, unit: str = "") -> str:
    """25e6 -> '25M', 1.3e9 -> '1.3G' (with unit 'B': '25 MB')."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {prefix}{unit}" if unit else f"{count / scale:.3g}{prefix}"
    return f"{count:.3g} {unit}".strip()
