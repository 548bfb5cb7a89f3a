"""ACS (Access Control Services) of the PCIe bridges, from `lspci -D -vvv`. A switch port with P2P
Request Redirect or Completion Redirect enabled sends the peer traffic of the devices below it up to
the root complex instead of across the switch: GPU-to-GPU copies and GPUDirect RDMA through a switch lose
most of their bandwidth. ACS lives in the extended config space, which only root can read: lspci then
prints `Capabilities: <access denied>`, and ACS is "unknown (needs root)", never guessed.

The parser also reads each device's LnkCap/LnkSta (speed, width) and takes what people paste: grep
excerpts without device lines, quoted-printable mail (`=3D`, soft breaks), markdown indents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodecheck.core.errors import NoData, NotRecorded, ParseError, ProbeFailed, TimedOut
from nodecheck.core.limits import MAX_COMMAND_OUTPUT
from nodecheck.probes.base import Probe
from nodecheck.report.model import PcieAcs

ARGV = ["lspci", "-D", "-vvv"]
SOURCE = "lspci-vvv.txt"
MAX_DEVICES = 4096
NEEDS_ROOT = "unknown (needs root): lspci could not read the extended config space"

_DEVICE = re.compile(r"^(?P<bdf>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+\S")
_ACS_CTL = re.compile(r"\bACSCtl:\s*(?P<flags>.*)$")
_FLAG = re.compile(r"([A-Za-z0-9]{1,40})([+-])")  # per whitespace-separated token: findall over a run was quadratic
# LnkCap/LnkSta: found by linear searches, never one pattern with lazy and greedy runs over the line (a long line
# made that quadratic: 210 KB froze the prolog for 49 s, the interpreter lock held throughout)
_LINK_FIELD = re.compile(r"\b(LnkCap|LnkSta):")
_SPEED = re.compile(r"Speed (?:([0-9]{1,3}(?:\.[0-9]{1,3})?)GT/s|unknown)\b")
_WIDTH = re.compile(r"\s*Width x([0-9]{1,3})\b")
REDIRECT_FLAGS = ("ReqRedir", "CmpltRedir")


@dataclass
class PciDevice:
    bdf: str | None  # None in a grep excerpt without device lines
    acs_ctl: dict[str, bool] | None = None  # ACSCtl flags (SrcValid, ReqRedir, CmpltRedir, ...)
    link_speed_gts: float | None = None  # LnkSta
    link_speed_max_gts: float | None = None  # LnkCap
    link_width: int | None = None
    link_width_max: int | None = None
    access_denied: bool = False  # `Capabilities: <access denied>`: not root

    @property
    def acs_redirect(self) -> bool | None:
        """P2P request or completion redirect enabled; None without an ACSCtl line."""
        return None if self.acs_ctl is None else any(self.acs_ctl.get(f, False) for f in REDIRECT_FLAGS)

    @property
    def downgraded(self) -> bool | None:
        known = None not in (self.link_speed_gts, self.link_speed_max_gts, self.link_width, self.link_width_max)
        if not known or self.link_width == 0:
            return None
        return self.link_speed_gts < self.link_speed_max_gts or self.link_width < self.link_width_max


def unwrap_quoted_printable(text: str) -> str:
    """A mail's quoted-printable body back to text: soft line breaks (`=` at the end) joined, `=3D` as `=`."""
    if "=3D" not in text:
        return text
    return re.sub(r"=\r?\n", "", text).replace("=3D", "=")


def parse_lspci(text: str) -> list[PciDevice]:
    """Every device of `lspci -vvv` text (or an excerpt of one), in order of appearance."""
    if len(text) > MAX_COMMAND_OUTPUT:
        raise ParseError(f"lspci output: more than {MAX_COMMAND_OUTPUT >> 20} MiB: not read")
    devices: list[PciDevice] = []
    current: PciDevice | None = None

    def device_for(field: str) -> PciDevice:
        """The device a field line belongs to; a field seen twice without a device line between starts a
        new one (`lspci -vvv | grep ACSCtl` gives one line per bridge)."""
        nonlocal current
        if current is None or (current.bdf is None and _has(current, field)):
            current = PciDevice(None)
            devices.append(current)
        return current

    for raw in unwrap_quoted_printable(text).splitlines():
        line = raw.rstrip()
        if not raw[:1].isspace() and (device := _DEVICE.match(line)):  # device lines start at column 0
            if len(devices) >= MAX_DEVICES:
                break
            current = PciDevice(device["bdf"].lower())
            devices.append(current)
        elif acs := _ACS_CTL.search(line):
            flags = (_FLAG.fullmatch(token.rstrip(",")) for token in acs["flags"].split())
            device_for("acs").acs_ctl = {flag[1]: flag[2] == "+" for flag in flags if flag}
        elif link := link_fields(line):
            field, speed, width = link
            target = device_for(field)
            if field == "LnkCap":
                target.link_speed_max_gts, target.link_width_max = speed, width
            else:
                target.link_speed_gts, target.link_width = speed, width
        elif "<access denied>" in line and current is not None:
            current.access_denied = True
    return devices


def link_fields(line: str) -> tuple[str, float | None, int] | None:
    """("LnkCap" or "LnkSta", GT/s or None for "unknown", width) of one lspci line; None when the line is
    not one, or its speed or width is malformed (1.2.3GT/s): that link stays unknown, by name."""
    field = _LINK_FIELD.search(line)
    at = line.find("Speed ", field.end()) if field else -1
    speed = _SPEED.match(line, at) if at >= 0 else None
    comma = line.find(",", speed.end()) if speed else -1
    width = _WIDTH.match(line, comma + 1) if comma >= 0 else None
    if width is None:
        return None
    return field[1], (float(speed[1]) if speed[1] else None), int(width[1])


def _has(device: PciDevice, field: str) -> bool:
    return {"acs": device.acs_ctl is not None, "LnkCap": device.link_width_max is not None,
            "LnkSta": device.link_width is not None}[field]


def collect(host, timeout: float) -> PcieAcs:
    """A missing, failing or hung lspci is a named unknown, never a probe failure: ACS is a diagnosis, not a
    health fact, and a node is not unhealthy for lacking pciutils."""
    try:
        text = host.command(SOURCE, ARGV, timeout)
    except NotRecorded:
        raise  # a snapshot from before nodecheck read ACS: no data, as for every source
    except NoData as error:
        return PcieAcs(False, f"unknown: lspci is not installed (pciutils): {error}")
    except TimedOut:
        return PcieAcs(False, f"unknown: lspci did not answer within {timeout:g} s")
    except ProbeFailed as error:
        return PcieAcs(False, f"unknown: {error}")
    devices = [d for d in parse_lspci(text) if d.bdf]
    if any(d.access_denied for d in devices):
        return PcieAcs(False, NEEDS_ROOT)
    return PcieAcs(True, None, {d.bdf: bool(d.acs_redirect) for d in devices if d.acs_ctl is not None})


def fill(report, facts: PcieAcs) -> None:
    report.pcie_acs = facts


PROBE = Probe("pcie_acs", collect, 5.0, fill)
