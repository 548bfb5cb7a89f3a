"""The PCIe path of each GPU and NIC, hop by hop, from sysfs: this machine's real tree, the H100 node's
values (../shared/captures/h100-pcie-vm/sysfs.txt), and switch trees laid out as the kernel lays them out."""

import json

from helpers import make_snapshot, nodecheck, switch_node, tree

from nodecheck.core.pci import Hop, narrow_hops
from nodecheck.host.live import LiveHost
from nodecheck.probes.pcie import collect


def test_this_machine():
    """Every PCI NIC of this node has a path starting with itself (virtio NICs report no link widths)."""
    report = json.loads(nodecheck("inspect", "--json").stdout)
    paths = collect(LiveHost(), 5.0)
    for nic in report["nics"]:
        if nic["pci_address"]:
            assert paths[nic["pci_address"]][0].bdf == nic["pci_address"]


def test_the_h100_nodes_gpu_sits_under_the_root_complex_at_full_width(tmp_path):
    """sysfs.txt of the H100 VM: 0000:00:06.0, class 0x030200, 32 GT/s x16 of x16, parent pci0000:00."""
    report = tree(make_snapshot(tmp_path / "h100"), {"0000:00:06.0": ("0x030200", "pci0000:00/0000:00:06.0", 16, 16)})
    assert report.pcie_paths["0000:00:06.0"] == [Hop("0000:00:06.0", 16, 16, "32.0 GT/s PCIe", None)]
    assert not [f for f in report.findings if f.kind == "pcie_hop_narrow"]


def test_a_switch_uplink_at_x8_is_named_once_with_every_gpu_behind_it(tmp_path):
    report = switch_node(tmp_path, uplink_width=8)
    (finding,) = [f for f in report.findings if f.kind == "pcie_hop_narrow"]
    assert (finding.subject, finding.measured, finding.expected, finding.severity) == ("pci:0000:16:00.0", "x8", "x16", "error")
    assert "gpu0, gpu1 behind it get 50%" in finding.message
    assert [h.bdf for h in report.pcie_paths["0000:18:00.0"]] == ["0000:18:00.0", "0000:17:00.0", "0000:16:00.0", "0000:00:01.0"]


def test_a_healthy_switch_tree_raises_nothing(tmp_path):
    assert not [f for f in switch_node(tmp_path, uplink_width=16).findings if f.kind == "pcie_hop_narrow"]


def test_what_is_not_narrow():
    """A x8 card in a x16 slot trains x8 as it should; a link that is down, or widths sysfs does not give,
    are unknown, never narrow."""
    assert narrow_hops([Hop("a", 8, 8, None, None), Hop("port", 16, 16, None, None)]) == []
    assert narrow_hops([Hop("a", None, 16, None, None), Hop("port", 16, 16, None, None)]) == []
    assert narrow_hops([Hop("a", 4, None, None, None)]) == []
    (found,) = narrow_hops([Hop("nic", 4, 8, None, None), Hop("port", 16, 16, None, None)])
    assert found[0] == 0 and found[2] == 8


def test_the_host_link_spec_is_the_slowest_hop_on_the_way_to_the_cpu(tmp_path):
    """NVML says gen5 x16 for each GPU; behind a gen4 switch uplink (or one trained at x8) the GPU moves no
    more than that hop to the host, and h2d/d2h are judged against it."""
    from nodecheck.core import specs

    def host_spec(report, gpu=0):
        return next(p for p in report.paths if p.path == f"gpu{gpu}:host")

    healthy = host_spec(switch_node(tmp_path / "a", uplink_width=16))
    assert healthy.bytes_per_second == specs.pcie(5, 16).bytes_per_second and "slowest hop" not in healthy.basis
    gen4 = host_spec(switch_node(tmp_path / "b", uplink_width=16, uplink_speed="16.0 GT/s PCIe"))
    assert gen4.bytes_per_second == specs.pcie(4, 16).bytes_per_second
    assert gen4.basis.startswith("PCIe 4.0 x16 (16 GT/s, 128b/130b) at 0000:16:00.0, the slowest hop")
    narrow = switch_node(tmp_path / "c", uplink_width=8)
    assert host_spec(narrow, 1).bytes_per_second == specs.pcie(5, 8).bytes_per_second
    gpu2 = host_spec(narrow, 2)  # not behind that switch: its own link
    assert gpu2.bytes_per_second == specs.pcie(5, 16).bytes_per_second
