"""A node's fingerprint (src/nodecheck/assemble/fingerprint.py) from real sources: the HGX H100 topology with NVML values
replayed from the H100 capture (its VBIOS as its `nvidia-smi -q` printed it), gpud's NDR node's NIC firmware
through the real sysfs reader. The topology hash moves with what `inspect` shows differs, and with nothing else."""

import dataclasses
import shutil

from helpers import PUBLIC, hgx_nvml, make_snapshot, need

from nodecheck.assemble.fingerprint import fingerprint, topology_facts, vbios_mismatch
from nodecheck.config import Config
from nodecheck.host.live import LiveHost
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report

TOPO = "hgx-h100-8gpu-8nic-sglang30401.txt"


def hgx(tmp_path, name: str = "node", **nvml):
    return build_report(SnapshotHost(make_snapshot(tmp_path / name, topo=TOPO, nvml_gpus=hgx_nvml(**nvml))))


def test_an_hgx_nodes_fingerprint(tmp_path):
    print_ = fingerprint(hgx(tmp_path))
    assert (print_.sku, print_.driver, print_.cuda, print_.vbios) == ("8x NVIDIA H100 80GB HBM3", "580.159.04", "13.0",
                                                                       "96.00.DA.00.0C")
    assert len(print_.topology) == 12 and int(print_.topology, 16) >= 0


def test_the_topology_hash_moves_with_what_differs_and_nothing_else(tmp_path):
    base = hgx(tmp_path, "a")
    same = hgx(tmp_path, "b")
    later = dataclasses.replace(same, generated_at=same.generated_at + 3600, node=dict(same.node, hostname="gpu-0417"))
    assert fingerprint(base).topology == fingerprint(later).topology  # another node, another time: the same type
    link_down = hgx(tmp_path, "c", inactive={3: [7]})
    assert fingerprint(link_down).topology != fingerprint(base).topology
    assert topology_facts(link_down)["nvlinks"][3] == [18, 17]
    narrow = dataclasses.replace(base, gpus=[dataclasses.replace(g, pcie=dict(g.pcie, width_max=8)) if g.index == 5 else g
                                             for g in base.gpus])
    assert fingerprint(narrow).topology != fingerprint(base).topology


def test_gpus_on_different_vbios_are_a_finding(tmp_path):
    report = hgx(tmp_path)
    mixed = dataclasses.replace(report, gpus=[dataclasses.replace(g, vbios="96.00.99.00.01") if g.index == 6 else g
                                              for g in report.gpus])
    (finding,) = vbios_mismatch(mixed, Config())
    assert (finding.kind, finding.subject, finding.measured, finding.expected) == (
        "gpu_vbios_mismatch", "gpu6", "96.00.99.00.01", "96.00.DA.00.0C")
    assert fingerprint(mixed).vbios == "96.00.99.00.01,96.00.DA.00.0C"
    assert vbios_mismatch(report, Config()) == []


def test_nic_firmware_from_sysfs(tmp_path):
    """gpud's H100 NDR node: mlx5_0's fw_ver through the real reader, on the netdev it owns."""
    root = tmp_path / "root"
    device = root / "sys/devices/pci0000:00/0000:1a:00.0"
    (device / "net/ibp26s0").mkdir(parents=True)
    for name, value in (("type", "32"), ("operstate", "up"), ("mtu", "4092")):
        (device / "net/ibp26s0" / name).write_text(value + "\n")
    (root / "sys/class/net").mkdir(parents=True)
    (root / "sys/class/net/ibp26s0").symlink_to("../../devices/pci0000:00/0000:1a:00.0/net/ibp26s0")
    ib = root / "sys/class/infiniband/mlx5_0"
    ib.mkdir(parents=True)
    shutil.copy(need(PUBLIC / "health/ib/gpud-sys-class-infiniband-h100/mlx5_0/fw_ver"), ib / "fw_ver")
    (ib / "device").symlink_to("../../../devices/pci0000:00/0000:1a:00.0")
    report = build_report(LiveHost(root))
    (nic,) = [n for n in report.nics if n.name == "ibp26s0"]
    assert nic.firmware == "28.41.1000" and fingerprint(report).nic_firmware == "28.41.1000"


def test_the_nccl_conf_hash_is_the_file_as_nccl_reads_it(tmp_path):
    """Empty without a file; the same settings in another order or with comments hash alike (NCCL sees the same
    variables); another NCCL_IB_GID_INDEX does not (on RoCE, a node with it cannot connect to its peers)."""
    from nodecheck.probes.platform import parse_nccl_conf
    from nodecheck.report.model import Platform

    base = hgx(tmp_path)
    assert fingerprint(base).nccl_conf == ""

    def with_conf(text: str):
        return dataclasses.replace(base, platform=Platform(None, False, nccl_conf=parse_nccl_conf(text)))

    one = fingerprint(with_conf("NCCL_IB_GID_INDEX=3\nNCCL_IB_HCA==mlx5_0,mlx5_1\n")).nccl_conf
    assert len(one) == 12 and int(one, 16) >= 0
    assert fingerprint(with_conf("# rails\nNCCL_IB_HCA==mlx5_0,mlx5_1\nNCCL_IB_GID_INDEX=3\n")).nccl_conf == one
    assert fingerprint(with_conf("NCCL_IB_GID_INDEX=5\nNCCL_IB_HCA==mlx5_0,mlx5_1\n")).nccl_conf != one
