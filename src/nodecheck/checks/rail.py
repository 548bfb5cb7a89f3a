"""A node's rails compared with each other: the RDMA NICs a job's inter-node traffic leaves by should be
alike, since a collective across nodes runs at its slowest rail. Without a config that states each NIC's
speed, the other rails are the only reference a node has."""

from __future__ import annotations

from collections import Counter

from nodecheck.assemble.paths import nic_line_spec
from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.core.units import format_bits
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

NOT_UP = ("DOWN", "INIT", "ARMED")  # the port states sysfs names short of ACTIVE (and ACTIVE_DEFER)


def _layer(nic) -> str:
    return next((p.link_layer for p in nic.ib_ports if p.state == "ACTIVE" and p.link_layer), nic.kind)


def rail_mtus(report: Report, config: Config) -> list[Finding]:
    """An RDMA NIC whose MTU differs from its peers' on the same link layer (the MTU most of them have, the
    larger on a tie: jumbo frames are set on purpose): RoCE and IPoIB traffic over it is cut into smaller
    packets or dropped where the path expects the larger, and a collective runs at its slowest rail."""
    fabrics: dict[str, list] = {}
    for nic in report.rdma_nics_up():
        if nic.mtu:
            fabrics.setdefault(_layer(nic), []).append(nic)
    findings = []
    for layer, nics in sorted(fabrics.items()):
        counts = Counter(n.mtu for n in nics)
        usual = max(counts, key=lambda mtu: (counts[mtu], mtu))
        for nic in (n for n in nics if n.mtu != usual):
            findings.append(Finding("nic_mtu_mismatch", "warning", nic.name, nic.mtu, usual,
                                    f"{nic.name} has MTU {nic.mtu}, its {counts[usual]} peer(s) on {layer} {usual}: set the "
                                    f"same MTU on every rail (`ip link set {nic.name} mtu {usual}`) and on their switch ports"))
    return findings


def _nearest(report: Report) -> dict[str, list[int]]:
    """NIC name (netdev or RDMA device) -> the GPUs it is nearest to."""
    out: dict[str, list[int]] = {}
    for gpu in report.gpus:
        for name in gpu.nearest_nics:
            out.setdefault(name, []).append(gpu.index)
    return out


def _near(nearest: dict[str, list[int]], nic) -> list[int]:
    """The GPUs a NIC is nearest to, whichever of its names (netdev, RDMA device) the topology used."""
    return nearest.get(nic.name) or nearest.get(nic.rdma_device) or []


def rails_down(report: Report, config: Config) -> list[Finding]:
    """A GPU's nearest RDMA NIC whose ports are all down while another such rail is ACTIVE: NCCL leaves it out and
    that GPU's traffic between nodes crosses to another GPU's rail. A port disabled on purpose (physical state
    Disabled, as a node's unused front-end ports are) is not named; one Polling has no link partner: a cable,
    transceiver or switch port. A warning: `[nics]` with state "up" makes it an error (nic_down)."""
    nearest = _nearest(report)
    rails = [n for n in report.nics if n.rdma_device and n.ib_ports and _near(nearest, n)]
    if not any(p.state == "ACTIVE" for n in rails for p in n.ib_ports):
        return []
    findings = []
    for nic in rails:
        ports = nic.ib_ports
        if not all(p.state in NOT_UP for p in ports) or all(p.phys_state == "Disabled" for p in ports):
            continue  # up, unread or garbled (no fault known), or switched off on purpose
        gpus = ", ".join(f"gpu{i}" for i in _near(nearest, nic))
        state = ", ".join(f"{p.state or 'unknown'} ({p.phys_state or 'physical state unknown'})" for p in ports)
        findings.append(Finding("nic_rail_down", "warning", nic.name, state, "ACTIVE",
                                f"{nic.name}, the nearest NIC of {gpus}, is {state} while other rails are ACTIVE: NCCL leaves "
                                f"it out and the traffic of {gpus} between nodes crosses to another rail; check the cable, "
                                f"transceiver and switch port (`ibstat {nic.rdma_device}`)"))
    return findings


def rail_rates(report: Report, config: Config) -> list[Finding]:
    """A GPU's nearest RDMA NIC that negotiated a lower rate than most such rails on its link layer (the faster
    on a tie): a port that came up at 2X instead of 4X, or HDR instead of NDR, behind a bad cable, transceiver
    or switch port. Only the NICs nearest the GPUs are compared (a storage or front-end NIC is slower by
    design), and only a slower one: a warning, because a node may mix rails on purpose; `[nics] speed_mbps`
    makes it an error (nic_slow)."""
    nearest = _nearest(report)
    fabrics: dict[str, list] = {}
    for nic in report.rdma_nics_up():
        spec, _ = nic_line_spec(nic)
        if spec and _near(nearest, nic):
            fabrics.setdefault(_layer(nic), []).append((nic, spec))
    findings = []
    for layer, rails in sorted(fabrics.items()):
        counts = Counter(spec.bytes_per_second for _, spec in rails)
        usual = max(counts, key=lambda rate: (counts[rate], rate))
        for nic, spec in rails:
            if spec.bytes_per_second < usual:
                name = nic.rdma_device or nic.name
                findings.append(Finding("nic_rate_mismatch", "warning", nic.name, format_bits(spec.bytes_per_second),
                                        format_bits(usual), f"{nic.name} negotiated {spec.basis}, {counts[usual]} other rail(s) on "
                                        f"{layer} {format_bits(usual)}: a collective across nodes runs at its slowest rail; check "
                                        f"the cable/transceiver and the switch port (`ibstat {name}`), or state the rate in "
                                        "[nics] speed_mbps"))
    return findings


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
NIC_MTU_MISMATCH = Kind("nic_mtu_mismatch", "fabric", "{subject} MTU {measured} != {expected}",
    doc=(
        ("warning",
         "an RDMA NIC with an ACTIVE port whose MTU differs from that of its peers on the same link layer (the MTU most of them"
         " have, the larger on a tie); subject the NIC, measured its MTU, expected its peers'"),
    ))
NIC_RATE_MISMATCH = Kind("nic_rate_mismatch", "fabric", "{subject} {measured} < {expected} of the other rails",
    doc=(
        ("warning",
         "a rail (an RDMA NIC nearest a GPU, with an ACTIVE port) that negotiated a lower rate than most rails on its link "
         "layer (the faster on a tie), e.g. `200 Gb/sec (2X NDR)` beside seven `400 Gb/sec (4X NDR)`: a collective across nodes"
         " runs at its slowest rail. NICs no GPU is nearest (storage, front-end) are not compared; a warning because a node may"
         " mix rails on purpose: `[nics] speed_mbps` makes a slow port an error (`nic_slow`)"),
    ))
NIC_RAIL_DOWN = Kind("nic_rail_down", "fabric", "{subject} {measured}, other rails {expected}",
    doc=(
        ("warning",
         "a rail (an RDMA NIC nearest a GPU) whose ports are all down while another rail is ACTIVE: NCCL leaves it out and that"
         " GPU's traffic between nodes crosses to another rail. Measured: each port's state and physical state (`DOWN "
         "(Polling)`: no link partner; `INIT (LinkUp)`: no subnet manager activated it). A port Disabled on purpose, or whose "
         "state is unread or garbled, is not named; `[nics]` with `state = \"up\"` makes it an error (`nic_down`)"),
    ))

MTU = Check((NIC_MTU_MISMATCH,), rail_mtus, needs="nics")
RATES = Check((NIC_RATE_MISMATCH,), rail_rates, needs="nics")
DOWN = Check((NIC_RAIL_DOWN,), rails_down, needs="nics")
