"""Small pure helpers: Linux cpulists and CPU masks, human rates."""

from __future__ import annotations

import re

_CPULIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


_INTEGER = re.compile(r"-?[0-9]+")


def to_int(text: str | None) -> int | None:
    """'42' -> 42, '-1' -> -1; None for anything else (str.isdigit() accepts '²', which int() refuses)."""
    return int(text) if text is not None and _INTEGER.fullmatch(text) else None


def is_cpulist(text: str) -> bool:
    return bool(_CPULIST.match(text))


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8]. Raises ValueError on anything else."""
    text = text.strip()
    if not text:
        return []
    if not is_cpulist(text):
        raise ValueError(f"not a cpulist: {text!r}")
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"descending range in cpulist: {part!r}")
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
    return [i * word_bits + bit for i, word in enumerate(words) for bit in range(word_bits) if word >> bit & 1]


def hwloc_bitmap_to_set(text: str) -> set[int]:
    """hwloc XML bitmaps: '0x0000ffff', '0x000000ff,0xffffffff' (32-bit words, most significant first)."""
    bits: set[int] = set()
    # hwloc may leave a zero word empty ('0x1,,0x0'); it still takes its 32-bit place.
    words = text.strip().split(",")
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


def format_bits(bytes_per_second: float | None) -> str:
    """Network rates in the unit people quote them in: 12.5e9 B/s -> '100 Gbit/s'."""
    if bytes_per_second is None:
        return "unknown"
    bits = bytes_per_second * 8
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits:g} bit/s"
