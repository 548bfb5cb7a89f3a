"""A NIC's PCIe path bounds what it moves: a 400 Gbit/s HCA (50 GB/s) whose link trained at gen4 x16 moves
31.5 GB/s at most. Its path spec says so, the link that trained down is named (pcie_hop_slow), and a job's
bound counts it; a gen5 card in a gen4 slot is the node's design, not a fault. The kernel says the same at
boot ("mlx5_core 0000:b3:00.1: 63.008 Gb/s available PCIe bandwidth, limited by 8 GT/s x8 link at
0000:b2:00.0 (capable of 252.048 Gb/s with 16 GT/s x16 link)", NVIDIA/l2fwd-nv#6: 55 of 100 Gbit/s).

The tree: gpu0 and mlx5_0 behind one PCIe switch, as on an HGX board (root port 0000:00:01.0, the switch's
upstream port 0000:16:00.0, its downstream ports 0000:17:00.0 to the GPU and 0000:17:01.0 to the HCA). The
HCA's port is gpud's H100 NDR node's mlx5_4 (../shared/captures/public/health/ib)."""

import json

import pytest
from helpers import PUBLIC, hgx_nvml, make_snapshot, need, write_pci_tree
from hypothesis import given, settings
from hypothesis import strategies as st

from nodecheck.assemble.rails import nic_rate
from nodecheck.config import Config, loads
from nodecheck.config.init import generate
from nodecheck.core import specs
from nodecheck.core.pci import Hop, slow_hops
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report

GEN5, GEN4, GEN1 = "32.0 GT/s PCIe", "16.0 GT/s PCIe", "2.5 GT/s PCIe"
NDR_PORT = PUBLIC / "health/ib/gpud-sys-class-infiniband-h100/mlx5_4/ports/1"
SWITCH = "pci0000:00/0000:00:01.0/0000:16:00.0"
HCA, SIBLING = "0000:1a:00.0", "0000:2a:00.0"


def node(tmp_path, hca=(GEN5, GEN5), slot=(GEN5, GEN5), uplink=(GEN5, GEN5), rate: str | None = None, gpus: bool = True,
         sibling=(GEN5, GEN5)):
    """The tree above, every link x16; each (max speed, current speed): `hca` the HCA's own end of its link,
    `slot` the downstream port's end, `uplink` both ends of the switch's uplink; `sibling` the link of a second
    NDR HCA, mlx5_1 (SIBLING), on a root port of its own. `rate`: mlx5_0's port rate instead of the captured one."""
    snap = make_snapshot(tmp_path, nvml_gpus=hgx_nvml()[:1] if gpus else None)
    lo = snap / "fs/sys/class/net/lo"  # the one netdev every node has: the HCA has none (an IB-only port)
    lo.mkdir(parents=True)
    for name, value in (("operstate", "unknown"), ("mtu", "65536"), ("type", "772"), ("address", "00:00:00:00:00:00")):
        (lo / name).write_text(value + "\n")
    for device in ("mlx5_0", "mlx5_1"):
        port = snap / f"fs/sys/class/infiniband/{device}/ports/1"
        port.mkdir(parents=True)
        for name in ("state", "phys_state", "link_layer", "rate"):
            given = rate if name == "rate" and device == "mlx5_0" else None
            (port / name).write_text(given or need(NDR_PORT / name).read_text())
    devices = {
        "0000:00:01.0": ("0x060400", "pci0000:00/0000:00:01.0", 16, 16, *uplink),
        "0000:16:00.0": ("0x060400", SWITCH, 16, 16, *uplink),
        "0000:17:00.0": ("0x060400", f"{SWITCH}/0000:17:00.0", 16, 16, GEN5, uplink[1] if gpus else GEN5),
        "0000:17:01.0": ("0x060400", f"{SWITCH}/0000:17:01.0", 16, 16, slot[0], hca[1]),
        HCA: ("0x020700", f"{SWITCH}/0000:17:01.0/{HCA}", 16, 16, *hca),
        "0000:00:02.0": ("0x060400", "pci0000:00/0000:00:02.0", 16, 16, GEN5, sibling[1]),
        SIBLING: ("0x020700", f"pci0000:00/0000:00:02.0/{SIBLING}", 16, 16, *sibling),
    }
    if gpus:  # an idle GPU: its link at 2.5 GT/s
        devices["0000:18:00.0"] = ("0x030200", f"{SWITCH}/0000:17:00.0/0000:18:00.0", 16, 16, GEN5, GEN1)
    write_pci_tree(snap, devices)
    links = json.loads((snap / "fs-links.json").read_text())
    links["/sys/class/net/lo"] = "../../devices/virtual/net/lo"
    links["/sys/class/infiniband/mlx5_0/device"] = f"../../../devices/{SWITCH}/0000:17:01.0/{HCA}"
    links["/sys/class/infiniband/mlx5_1/device"] = f"../../../devices/pci0000:00/0000:00:02.0/{SIBLING}"
    (snap / "fs-links.json").write_text(json.dumps(links))
    return snap


def mlx5_0(report):
    return next(n for n in report.nics if n.rdma_device == "mlx5_0")


def judged(snap, config: Config | None = None):
    report = build_report(SnapshotHost(snap), config)
    return report, report.path_spec("nic:mlx5_0"), [f for f in report.findings if f.kind == "pcie_hop_slow"]


def test_a_healthy_hgx_switch_bounds_nothing_and_names_nothing(tmp_path):
    report, spec, slow = judged(node(tmp_path))
    assert report.gpus and [n.pci_address for n in report.nics if n.rdma_device] == [HCA, SIBLING]
    assert spec.bytes_per_second == 50e9 and spec.line_bytes_per_second is None and "limited" not in spec.basis
    assert slow == []


def test_an_hca_trained_at_gen4_is_named_and_bounds_its_spec(tmp_path):
    """Both ends of its link say 16 GT/s, both can do 32: one finding, at the HCA; its spec is gen4 x16's."""
    report, spec, slow = judged(node(tmp_path, hca=(GEN5, GEN4)))
    gen4 = specs.pcie(4, 16).bytes_per_second
    assert (spec.bytes_per_second, spec.line_bytes_per_second) == (gen4, 50e9)
    assert f"limited by PCIe 4.0 x16 (16 GT/s, 128b/130b) at {HCA}" in spec.basis
    (finding,) = slow
    assert (finding.subject, finding.severity, finding.measured, finding.expected) == (f"pci:{HCA}", "error", "gen4", "gen5")
    assert "mlx5_0 behind it cannot reach its link rate" in finding.message
    assert report.fails("error")


def test_the_link_rate_stays_what_the_config_and_nic_slow_compare(tmp_path):
    """nic_slow is about the link the HCA negotiated (400 Gbit/s here), config init writes that rate, and a
    job's bound takes the slower of the config's rate and the PCIe path."""
    report, spec, _ = judged(node(tmp_path, hca=(GEN5, GEN4)))
    assert 'speed_mbps = 400000' in generate(report)
    config = loads('[nics."mlx5_0"]\nspeed_mbps = 400000\nstate = "up"\n', "test")
    rejudged, _, _ = judged(node(tmp_path / "again", hca=(GEN5, GEN4)), config)
    assert not [f for f in rejudged.findings if f.kind == "nic_slow"]
    assert nic_rate(rejudged, mlx5_0(rejudged), config) == specs.pcie(4, 16).bytes_per_second
    healthy, _, _ = judged(node(tmp_path / "healthy"), config)
    assert nic_rate(healthy, mlx5_0(healthy), config) == 50e9


def test_every_hca_trained_down_alike_is_a_warning(tmp_path):
    """Both HCAs of the node at 16 GT/s on gen5 links: a BIOS speed setting or the platform rather than one card,
    which would drain every node of the type at once; a warning, and the fleet's peers say whether it is this
    node's type. The spec is bounded all the same."""
    _, spec, slow = judged(node(tmp_path, hca=(GEN5, GEN4), sibling=(GEN5, GEN4)))
    assert [(f.subject, f.severity) for f in slow] == [(f"pci:{HCA}", "warning"), (f"pci:{SIBLING}", "warning")]
    assert all("trained down alike" in f.message for f in slow)
    assert spec.bytes_per_second == specs.pcie(4, 16).bytes_per_second


def test_a_gen5_hca_in_a_gen4_slot_is_the_design_not_a_fault(tmp_path):
    """The slot can do no more than 16 GT/s: nothing trained down, but the path moves 31.5 GB/s, and a
    bandwidth test is judged against that, not against the 50 GB/s the port negotiated."""
    _, spec, slow = judged(node(tmp_path, hca=(GEN5, GEN4), slot=(GEN4, GEN4), uplink=(GEN4, GEN4)))
    assert slow == [] and spec.bytes_per_second == specs.pcie(4, 16).bytes_per_second


def test_an_idle_uplink_a_gpu_shares_is_not_judged_by_its_speed(tmp_path):
    """The switch's uplink carries the idle GPU's traffic too, and sits at 2.5 GT/s with it: it is judged at
    its max speed (as the GPU's host link is), neither named nor bounding the HCA."""
    _, spec, slow = judged(node(tmp_path, uplink=(GEN5, GEN1)))
    assert slow == [] and spec.bytes_per_second == 50e9


def test_without_gpus_every_link_of_the_nic_is_judged(tmp_path):
    """A CPU node: nothing shares the uplink with a GPU, so an uplink at gen1 of gen5 is named (once, at the
    switch's upstream port, the root port seeing the same link) and bounds the HCA."""
    report, spec, slow = judged(node(tmp_path, uplink=(GEN5, GEN1), gpus=False))
    assert not report.gpus
    assert [(f.subject, f.severity, f.measured) for f in slow] == [("pci:0000:16:00.0", "error", "gen1")]
    assert spec.bytes_per_second == specs.pcie(1, 16).bytes_per_second


def test_a_link_with_bandwidth_to_spare_is_a_warning(tmp_path):
    """A 100 Gbit/s EDR port (12.5 GB/s) over gen4 x16 (31.5 GB/s): the link still trained down."""
    _, spec, slow = judged(node(tmp_path, hca=(GEN5, GEN4), rate="100 Gb/sec (4X EDR)\n"))
    (finding,) = slow
    assert finding.severity == "warning" and "keeps its link rate" in finding.message
    assert spec.bytes_per_second == 12.5e9 and spec.line_bytes_per_second is None


@pytest.mark.parametrize("hops", [
    [Hop("nic", 16, 16, None, GEN5), Hop("port", 16, 16, GEN5, GEN5)],  # speed unreadable: unknown
    [Hop("nic", 16, 16, "Unknown", GEN5)],  # a VF, a link down
    [Hop("nic", 16, 16, GEN4, "garbage")],
    [Hop("nic", 16, 16, GEN4, GEN5), Hop("port", 16, 16, GEN4, GEN4)],  # the port above can do no more
])
def test_what_is_not_slow(hops):
    assert slow_hops(hops, {h.bdf for h in hops}) == []


def test_only_the_judged_hops_are_named():
    hops = [Hop("nic", 16, 16, GEN4, GEN5), Hop("dsp", 16, 16, GEN4, GEN5), Hop("usp", 16, 16, GEN1, GEN5),
            Hop("root", 16, 16, GEN1, GEN5)]
    assert [(h.bdf, gen, capable) for _, h, gen, capable in slow_hops(hops, {"nic", "dsp", "usp", "root"})] == [
        ("nic", 4, 5), ("usp", 1, 5)]
    assert slow_hops(hops, {"nic", "dsp"})[0][1].bdf == "nic" and len(slow_hops(hops, {"nic", "dsp"})) == 1
    assert slow_hops(hops, {"root"}) == [(3, hops[3], 1, 5)]


@pytest.mark.parametrize("garbled", ["1.2.3 GT/s PCIe", "...GT/s", "9999999 GT/s PCIe", "\x00", "nan GT/s", "-8.0 GT/s"])
def test_a_garbled_link_speed_is_unknown_not_a_crash(tmp_path, garbled):
    """sysfs text from a broken device, or a hostile snapshot, in every speed file of the NIC's and the GPU's
    paths: no spec bound, nothing named slow, and the build completes (a "1.2.3 GT/s" once raised ValueError
    in float(), ending the whole Report)."""
    report, spec, slow = judged(node(tmp_path, hca=(garbled, garbled), slot=(garbled, garbled), uplink=(garbled, GEN5)))
    assert slow == [] and spec.bytes_per_second == 50e9
    assert report.path_spec("gpu0:host").bytes_per_second == specs.pcie(5, 16).bytes_per_second


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | st.from_regex(r"\A\s*[0-9.e+-]{1,12}\s*GT/s( PCIe)?\Z"))
def test_every_text_is_a_generation_or_unknown(text):
    assert specs.pcie_generation(text) in (None, 1, 2, 3, 4, 5, 6, 7)
