"""Theoretical unidirectional rates of each kind of path, derived from detected hardware.

The figures live in data/specs.toml with their sources; this module only does the arithmetic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

BUSY_UTILIZATION = 10  # % GPU utilization above which a low PCIe generation is not power saving


try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class Spec:
    """The theoretical rate of one direction of one path, and how it was derived."""

    bytes_per_second: float
    basis: str
    source: str


@lru_cache(maxsize=1)
def table() -> dict:
    return tomllib.loads(resources.files("nodecheck").joinpath("data/specs.toml").read_text())


def pcie(gen: int, width: int) -> Spec | None:
    row = table()["pcie"].get(str(gen))
    if row is None or width <= 0:
        return None
    rate = row["gt_per_s"] * 1e9 * row["efficiency"] / 8 * width
    return Spec(rate, f"PCIe {gen}.0 x{width} ({row['gt_per_s']:g} GT/s, {row['encoding']})", row["source"])


def pcie_generation(speed: str | None) -> int | None:
    """The generation of a link speed as sysfs writes it ("32.0 GT/s PCIe" -> 5); None when unknown."""
    match = re.match(r"^\s*([0-9.]+)\s*GT/s", speed or "")
    if not match:
        return None
    rate = float(match[1])
    return next((int(gen) for gen, row in table()["pcie"].items() if row["gt_per_s"] == rate), None)


def nvlink(version: int, links: int) -> Spec | None:
    row = table()["nvlink"].get(str(version))
    if row is None or links <= 0:
        return None
    per_link = row["gbytes_per_s_per_link"]
    return Spec(per_link * 1e9 * links, f"NVLink {version} x{links} links ({per_link:g} GB/s per link)", row["source"])


_IB_RATE = re.compile(r"^\s*(?P<gbps>\d+(?:\.\d+)?)\s*Gb/sec(?:\s*\((?P<lanes>\d+)X\s*(?P<name>[A-Z0-9]+)?\))?")


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
        return Spec(gbits * 1e9 / 8, f"InfiniBand {lanes}X {name} ({gbits:g} Gbit/s data rate)", row["source"])
    gbits = float(match["gbps"])
    if gbits <= 0:
        return None
    return Spec(gbits * 1e9 / 8, f"InfiniBand {rate_text.strip()} (rate as reported)", "sysfs port rate")


def ethernet(speed_mbps: int | None) -> Spec | None:
    if speed_mbps is None or speed_mbps <= 0:
        return None
    row = table()["ethernet"]
    standard = "" if speed_mbps in row["known_mbps"] else ", not a standard speed"
    return Spec(speed_mbps * 1e6 / 8, f"Ethernet {speed_mbps} Mb/s{standard}", row["source"])


def default_ratio(test: str, path_kind: str | None) -> tuple[float, str] | None:
    """The calibrated threshold (ratio of spec) for this test on this kind of path, with its source;
    None where healthy hardware reaches 0.8 of spec and the general bandwidth_ratio applies."""
    row = table().get("thresholds", {}).get(f"{test}.{path_kind}") if path_kind else None
    return (row["ratio"], row["source"]) if row else None
