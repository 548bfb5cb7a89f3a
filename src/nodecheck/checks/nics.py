"""The NICs against the config's `[nics]`: present, up, at their speed; and a GPU whose nearest NIC is across the
socket interconnect. Pure."""

from __future__ import annotations

from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.core.link_types import link_family
from nodecheck.core.units import format_bits
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report


def expected_nics(report: Report, config: Config) -> list[Finding]:
    findings = []
    specs = {p.path: p for p in report.paths}
    present = {n.name for n in report.nics} | {n.rdma_device for n in report.nics if n.rdma_device}
    for name in sorted(config.nics):
        if name not in present:
            findings.append(Finding("nic_missing", "error", name, "absent", "present",
                                    f"{name} expected but not found: check the driver (`ip link`, `ibstat`) and the card"))
    for nic in report.nics:
        expectation = config.nic_expectation(nic)
        if expectation is None:
            continue
        if expectation.state != "any" and nic.state != expectation.state:
            findings.append(Finding("nic_down", "error", nic.name, nic.state or "unknown", expectation.state,
                                    f"{nic.name} is {nic.state or 'in an unknown state'}, {expectation.state} expected: "
                                    "check the cable, the switch port and `ip link`"))
            continue
        spec = specs.get(f"nic:{nic.name}")
        if expectation.speed_mbps and spec:
            findings += _nic_speed(nic.name, spec, expectation.speed_mbps)
    return findings


def _nic_speed(name: str, spec, expected_mbps: int) -> list[Finding]:
    expected, negotiated = expected_mbps * 1e6 / 8, spec.link_bytes_per_second
    if negotiated is None:
        return [Finding("nic_speed_unknown", "warning", name, "unknown", format_bits(expected),
                        f"{name} does not report its speed, {format_bits(expected)} expected")]
    if negotiated < expected * 0.999:
        return [Finding("nic_slow", "error", name, format_bits(negotiated), format_bits(expected),
                        f"{name} negotiated {format_bits(negotiated)} < {format_bits(expected)}: "
                        "check the cable/transceiver and the switch port (`ethtool`, `ibstat`)")]
    return []


def far_nics(report: Report, config: Config) -> list[Finding]:
    findings = []
    for gpu in report.gpus:
        if gpu.on_grace():  # its own Grace's NICs read SYS too: topo -m cannot tell them from the other socket's
            continue
        types = [l.type for l in report.links if l.a == gpu.index and isinstance(l.b, str) and l.b in gpu.nearest_nics]
        if types and all(link_family(t) in ("SYS", "SOC") for t in types):
            findings.append(Finding("nic_far_from_gpu", "warning", f"gpu{gpu.index}", "SYS", "NODE or closer",
                                    f"gpu{gpu.index}'s nearest NIC ({', '.join(gpu.nearest_nics)}) is across the socket "
                                    "interconnect: GPUDirect RDMA traffic crosses sockets"))
    return findings


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
NIC_MISSING = Kind("nic_missing", "fabric", "{subject} missing",
    doc=(
        ("error",
         "a NIC named in `[nics]` does not exist"),
    ))
NIC_DOWN = Kind("nic_down", "fabric", "{subject} {measured} != {expected}",
    doc=(
        ("error",
         "a NIC in `[nics]` is not in its expected state"),
    ))
NIC_SLOW = Kind("nic_slow", "fabric", "{subject} {measured} < {expected}",
    doc=(
        ("error",
         "negotiated speed below `speed_mbps`"),
    ))
NIC_SPEED_UNKNOWN = Kind("nic_speed_unknown", "fabric", "{subject} speed unknown, {expected} expected",
    doc=(
        ("warning",
         "a NIC in `[nics]` does not report its speed"),
    ))
NIC_FAR_FROM_GPU = Kind("nic_far_from_gpu", "fabric", "{head}",
    doc=(
        ("warning",
         "a GPU's nearest NIC is across the socket interconnect (SYS); not on a Grace GPU (GH200, GB200, GB300: NVML's "
         "C2C links, or a `GPU NUMA ID` in `topo -m`), whose every NIC reads SYS though its own Grace's are one C2C hop "
         "away"),
    ))

EXPECTED = Check((NIC_MISSING, NIC_DOWN, NIC_SLOW, NIC_SPEED_UNKNOWN), expected_nics, needs="nics")
FAR = Check((NIC_FAR_FROM_GPU,), far_nics, needs="nvidia_smi_topo")
