"""The topology file `nodecheck nccl-topo --write` makes for a VM whose PCI tree is flattened
(src/nodecheck/assemble/nccl_topo_file.py): on the lent H100's own VM capture (tests/fixtures/h100-vm-signals: the
GPU at 0000:00:06.0 and eth0 at 0000:00:03.0 straight under the root bus, one NUMA node), paired by the config,
read back through NCCL's reader; on a two-socket node paired by its NUMA nodes; never guessed."""

import dataclasses

import pytest
from helpers import REPO, cli

from nodecheck.assemble.nccl_topo_file import _mask, flattened, pairing, topology_xml
from nodecheck.config import loads
from nodecheck.core.errors import ConfigError, NodecheckError
from nodecheck.core.pci import Hop
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.probes.nccl_topo import parse_nccl_topo_xml

VM = REPO / "tests" / "fixtures" / "h100-vm-signals"


@pytest.fixture(scope="module")
def vm():
    return build_report(SnapshotHost(VM))


def test_a_flattened_vm_gets_a_file_that_reads_back_as_paired(vm, tmp_path):
    (tmp_path / "c.toml").write_text('[topology]\npairs = [["gpu0", "eth0"]]\n')
    written = cli("nccl-topo", "--write", str(tmp_path / "topo.xml"), "--from", str(VM), "--config", str(tmp_path / "c.toml"))
    assert written.returncode == 0, written.stderr
    assert "1 GPU(s) and their NICs, paired by the config's [topology] pairs (1 GPU(s) straight under the root bus" in written.stdout
    topo = parse_nccl_topo_xml((tmp_path / "topo.xml").read_text())
    ((cpu,), (gpu,), (nic,)) = topo.cpus, topo.gpus, topo.nics
    assert (cpu.numaid, gpu.busid, nic.busid) == (0, "0000:00:06.0", "0000:00:03.0")
    assert gpu.chain[0].busid == nic.chain[0].busid == "ffff:ff:01.0"  # one made-up bridge over the pair
    assert (gpu.chain[-1].link_gts, gpu.chain[-1].link_width) == (32.0, 16)  # NVML's Gen5 x16, not the VM's bridge
    again = cli("nccl-topo", str(tmp_path / "topo.xml"), "--from", str(VM))
    assert again.returncode == 0 and "agrees" in again.stdout


def test_nothing_is_written_without_a_pairing_or_on_a_tree_nccl_reads_itself(vm, tmp_path):
    unpaired = cli("nccl-topo", "--write", str(tmp_path / "x.xml"), "--from", str(VM))
    assert unpaired.returncode == 2 and "name them in the config: [topology] pairs" in unpaired.stderr
    assert not (tmp_path / "x.xml").exists()
    hgx = cli("nccl-topo", "--write", str(tmp_path / "x.xml"), "--from", str(REPO / "examples/hgx-h100-8gpu"))
    assert hgx.returncode == 2 and "the GPUs' PCI paths were not read" in hgx.stderr
    bridged = dataclasses.replace(vm, pcie_paths={"0000:00:06.0": [Hop("0000:00:06.0", 16, 16, None, None),
                                                                   Hop("0000:00:01.0", 16, 16, None, None)]})
    assert flattened(bridged) == (False, "1 of 1 GPU(s) behind PCIe bridges: NCCL reads that tree itself")
    both = cli("nccl-topo", str(tmp_path / "x.xml"), "--write", str(tmp_path / "y.xml"))
    assert both.returncode == 2 and "one of them" in both.stderr
    with pytest.raises(NodecheckError, match="names 'gpu7': no such GPU here"):
        pairing(vm, [("gpu7", "eth0")])
    with pytest.raises(NodecheckError, match="names 'mlx5_9'"):
        pairing(vm, [("gpu0", "mlx5_9")])


def test_two_sockets_pair_their_gpus_and_rdma_nics_by_numa_node(vm):
    (gpu,) = vm.gpus
    (nic,) = [n for n in vm.nics if not n.virtual]
    gpus = [dataclasses.replace(gpu, index=i, pci_bus_id=f"0000:00:{6 + i:02x}.0", numa_node=i // 2) for i in range(4)]
    nics = [dataclasses.replace(nic, name=f"ib{i}", rdma_device=f"mlx5_{i}", kind="infiniband", numa_node=i // 2,
                                pci_address=f"0000:00:{0x10 + i:02x}.0") for i in range(4)]
    report = dataclasses.replace(vm, gpus=gpus, nics=nics, pcie_paths={})
    paired, how = pairing(report, [])
    assert how.startswith("the guest's NUMA nodes") and {i: [n.rdma_device for n in ns] for i, ns in paired.items()} == {
        0: ["mlx5_0"], 1: ["mlx5_1"], 2: ["mlx5_2"], 3: ["mlx5_3"]}
    topo = parse_nccl_topo_xml(topology_xml(report, paired))
    assert [c.numaid for c in topo.cpus] == [0, 1] and [g.cpu for g in topo.gpus] == [0, 0, 1, 1]
    assert [(n.busid, n.chain[-1].pci_class) for n in topo.nics][:1] == [("0000:00:10.0", "0x020700")]
    uneven = dataclasses.replace(report, nics=nics[:3])
    with pytest.raises(NodecheckError, match="do not pair them one to one"):
        pairing(uneven, [])


def test_install_puts_it_where_nccl_reads_one_unasked(vm, tmp_path, monkeypatch):
    from nodecheck.cli import bench

    monkeypatch.setattr(bench, "VIRTUAL_TOPOLOGY", str(tmp_path / "run/nvidia-topologyd/virtualTopology.xml"))
    (tmp_path / "c.toml").write_text('[topology]\npairs = [["gpu0", "eth0"]]\n')
    installed = cli("nccl-topo", "--install", "--from", str(VM), "--config", str(tmp_path / "c.toml"))
    assert installed.returncode == 0 and "NCCL reads it when NCCL_TOPO_FILE is unset" in installed.stdout
    assert parse_nccl_topo_xml((tmp_path / "run/nvidia-topologyd/virtualTopology.xml").read_text()).gpus[0].busid == "0000:00:06.0"
    assert [p.name for p in (tmp_path / "run/nvidia-topologyd").iterdir()] == ["virtualTopology.xml"]  # no temporary left


def test_a_write_that_fails_leaves_no_temporary_beside_its_target(tmp_path):
    (tmp_path / "c.toml").write_text('[topology]\npairs = [["gpu0", "eth0"]]\n')
    (tmp_path / "out/topo.xml").mkdir(parents=True)  # a directory where the file should go: the rename fails
    (tmp_path / "out/topo.xml/kept").write_text("")
    failed = cli("nccl-topo", "--write", str(tmp_path / "out/topo.xml"), "--from", str(VM), "--config", str(tmp_path / "c.toml"))
    assert failed.returncode == 2 and "cannot write the topology file" in failed.stderr, failed.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["topo.xml"]


@pytest.mark.parametrize("text", ['[topology]\npairs = [["gpu0"]]\n', '[topology]\npairs = [["card0", "eth0"]]\n',
                                  '[topology]\npairs = "gpu0"\n', '[topology]\nother = 1\n'])
def test_a_topology_table_not_of_its_shape_is_a_config_error(text):
    with pytest.raises(ConfigError, match="topology"):
        loads(text, "c.toml")


def test_affinity_as_nccl_writes_it():
    assert _mask("0-15") == "0000ffff" and _mask("0-47,96-143") == "0000ffff,ffffffff,00000000,0000ffff,ffffffff"
    assert _mask("") is None and _mask("garbage") is None
