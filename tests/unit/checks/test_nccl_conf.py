"""/etc/nccl.conf read as NCCL reads it (src/nodecheck/probes/platform.py parse_nccl_conf: NCCL's src/misc/param.cc setEnvFile)
and judged against the node (src/nodecheck/checks/nccl_conf.py): the shipped HGX H100 example node (examples/hgx-h100-8gpu:
eight NDR rails, mlx5_0 to mlx5_7, each nearest a GPU) with a conf file added. Every finding a warning: the file
comes with the node's image, and an error would drain every node of the image at once."""

import shutil

import pytest
from helpers import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from nodecheck.assemble.rails import fabric_nics
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.probes.platform import MAX_NCCL_CONF_LINES, parse_nccl_conf

EXAMPLE = REPO / "examples" / "hgx-h100-8gpu"
DOCS_EXAMPLE = "NCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME==ens1f0\n"  # NCCL's environment documentation, verbatim


def test_the_documented_example_reads_as_nccl_reads_it():
    assert parse_nccl_conf(DOCS_EXAMPLE) == {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "=ens1f0"}


def test_nccls_own_quirks():
    """Split at the first '=', nothing stripped; '#' lines and lines without '=' skipped; CRLF tolerated; a name
    set twice keeps its first value (setenv without overwrite)."""
    text = ("# NCCL_IB_HCA=mlx5_9\r\nNCCL_IB_HCA = mlx5_9\nexport NCCL_IB_DISABLE=1\nNCCL_IB_GID_INDEX=3\r\n"
            "NCCL_IB_GID_INDEX=5\njust words\nNCCL_TOPO_FILE=/opt/topo.xml=x\n")
    assert parse_nccl_conf(text) == {"NCCL_IB_HCA ": " mlx5_9", "export NCCL_IB_DISABLE": "1", "NCCL_IB_GID_INDEX": "3",
                                     "NCCL_TOPO_FILE": "/opt/topo.xml=x"}


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000))
def test_any_text_parses_bounded(text):
    conf = parse_nccl_conf(text)
    assert len(conf) <= MAX_NCCL_CONF_LINES
    assert all("\n" not in k and "\n" not in v and len(k) <= 1023 and len(v) <= 1023 for k, v in conf.items())


def judged(tmp_path, conf: str | None):
    node = tmp_path / "node"
    shutil.copytree(EXAMPLE, node)
    if conf is not None:
        (node / "fs/etc").mkdir(parents=True)
        (node / "fs/etc/nccl.conf").write_text(conf)
    report = build_report(SnapshotHost(node))
    return report, {(f.subject, f.measured): f for f in report.findings if f.kind == "nccl_config"}


def test_a_node_without_a_conf_file_or_with_the_documented_one_says_nothing(tmp_path):
    report, found = judged(tmp_path / "none", None)
    assert found == {} and report.platform is None  # the example records no platform source at all
    report, found = judged(tmp_path / "docs", "NCCL_DEBUG=WARN\nNCCL_IB_HCA=mlx5\n")
    assert found == {} and report.platform.nccl_conf == {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5"}


def test_an_hca_selection_naming_no_active_hca(tmp_path):
    """The image of another node type, whose HCAs were named mlx5_ib0...: NCCL finds none here."""
    report, found = judged(tmp_path, "NCCL_IB_HCA==mlx5_ib0,mlx5_ib1\n")
    (finding,) = found.values()
    assert (finding.severity, finding.subject) == ("warning", "nccl.conf:NCCL_IB_HCA")
    assert "selects none of the node's active RDMA devices" in finding.message and "mlx5_0" in finding.message
    assert not report.fails("error")
    assert fabric_nics(report, {}) == []  # bench's bound sees what NCCL would: no rail
    assert [n.rdma_device for n in fabric_nics(report, {"NCCL_IB_HCA": "=mlx5_3"})] == ["mlx5_3"]  # the job's own wins


def test_an_hca_selection_leaving_rails_out(tmp_path):
    report, found = judged(tmp_path, "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n")
    (finding,) = found.values()
    assert "leaves out mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7" in finding.message
    assert sorted(n.rdma_device for n in fabric_nics(report, {})) == ["mlx5_0", "mlx5_1"]
    _, fine = judged(tmp_path / "excluding", "NCCL_IB_HCA=^mlx5_bond\n")  # a storage bond left out: no rail lost
    assert fine == {}


def test_ib_disabled_and_debugging_variables_left_set(tmp_path):
    _, found = judged(tmp_path, "NCCL_IB_DISABLE=1\nNCCL_P2P_DISABLE=1\nNCCL_SHM_DISABLE=0\nNCCL_ALGO=Ring\n"
                                "NCCL_NET_GDR_LEVEL=LOC\nNCCL_P2P_LEVEL=NVL\n")
    assert set(found) == {("nccl.conf:NCCL_IB_DISABLE", "1"), ("nccl.conf:NCCL_P2P_DISABLE", "1"),
                          ("nccl.conf:NCCL_ALGO", "Ring"), ("nccl.conf:NCCL_NET_GDR_LEVEL", "LOC")}
    assert "over sockets" in found[("nccl.conf:NCCL_IB_DISABLE", "1")].message
    assert all(f.severity == "warning" for f in found.values())


def test_a_line_nccl_never_reads(tmp_path):
    """Shell syntax in the file: NCCL sets "NCCL_IB_HCA " and "export NCCL_P2P_DISABLE", which it never reads; the
    selection is not judged (NCCL does not see it) and the lines are named."""
    _, found = judged(tmp_path, "NCCL_IB_HCA = mlx5_ib0\nexport NCCL_P2P_DISABLE=1\n")
    assert {subject for subject, _ in found} == {"nccl.conf:NCCL_IB_HCA", "nccl.conf:NCCL_P2P_DISABLE"}
    assert all("sets nothing NCCL reads" in f.message for f in found.values())


@pytest.mark.parametrize("value", ["=eth9", "^lo,docker", "ib"])
def test_a_socket_selection_naming_no_interface_up(tmp_path, value):
    """The example node's only netdev is lo (no address recorded): nothing is up with an address, so nothing is
    judged; a node whose traffic NIC is up is judged in test_a_socket_selection_on_a_real_node."""
    _, found = judged(tmp_path, f"NCCL_SOCKET_IFNAME={value}\n")
    assert found == {}


def test_a_socket_selection_on_a_real_node(tmp_path):
    """The captured H100 VM (tests/fixtures/h100-vm-1gpu): eth0 up with 192.0.2.2. An image written for ens*
    interfaces leaves NCCL nothing to bootstrap over; `=eth0` and the prefix `eth` are fine."""
    node = tmp_path / "vm"
    shutil.copytree(REPO / "tests/fixtures/h100-vm-1gpu", node)
    (node / "fs/etc").mkdir(parents=True, exist_ok=True)
    for value, expected in (("ens", True), ("=eth0", False), ("eth", False), ("^eth", True)):
        (node / "fs/etc/nccl.conf").write_text(f"NCCL_SOCKET_IFNAME={value}\n")
        found = [f for f in build_report(SnapshotHost(node)).findings if f.kind == "nccl_config"]
        assert bool(found) == expected, value
        if expected:
            assert "selects no interface that is up with an address, loopback aside (eth0)" in found[0].message


def test_read_live_recorded_and_replayed(tmp_path):
    """The live reader (LiveHost over a root holding /etc/nccl.conf), recorded into a snapshot and replayed: the
    same settings, quirks and all."""
    from nodecheck.host.live import LiveHost
    from nodecheck.host.snapshot import RecordingHost
    from nodecheck.probes.platform import collect

    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/nccl.conf").write_text(DOCS_EXAMPLE + "NCCL_IB_HCA = mlx5\n")
    recording = RecordingHost(LiveHost(root))
    live = collect(recording, 5.0)
    assert live.nccl_conf == {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "=ens1f0", "NCCL_IB_HCA ": " mlx5"}
    assert collect(SnapshotHost(recording.write(tmp_path / "snap")), 5.0).nccl_conf == live.nccl_conf


def test_a_rail_the_topology_names_by_its_netdev_is_still_a_rail():
    """lstopo names a GPU's nearest NIC by its netdev (ibp26s0), nvidia-smi by its RDMA device (mlx5_0): either
    way mlx5_0 is gpu0's rail, and a selection leaving it out is named, as bench's rails (rails.near_gpus) see it."""
    from helpers import make_gpu, make_nic, make_report

    from nodecheck.checks.nccl_conf import nccl_conf_findings
    from nodecheck.report.model import IbPort, Platform

    def hca(name, device):
        port = IbPort(device, 1, "ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")
        return make_nic(name, kind="infiniband", rdma_device=device, ib_ports=[port])

    report = make_report(gpus=[make_gpu(0, nearest_nics=["ibp26s0"]), make_gpu(1, nearest_nics=["mlx5_1"])],
                         nics=[hca("ibp26s0", "mlx5_0"), hca("ibp27s0", "mlx5_1")],
                         platform=Platform(None, False, nccl_conf={"NCCL_IB_HCA": "=mlx5_1"}))
    (finding,) = nccl_conf_findings(report)
    assert "leaves out mlx5_0" in finding.message and finding.expected == "every rail (2)"


def test_a_conf_past_64_kib_is_read_as_nccl_reads_it_not_a_failed_probe(tmp_path):
    """An /etc/nccl.conf over 64 KiB (a long comment block) failed the whole platform probe: NCCL reads it whole,
    so nodecheck reads its first megabyte, live and from a snapshot."""
    from nodecheck.host.live import LiveHost

    big = "# " + "x" * 100 + "\n"
    text = "NCCL_IB_HCA=mlx5\n" + big * 1000 + "NCCL_DEBUG=WARN\n"
    report, _ = judged(tmp_path / "big", text)
    assert report.platform.nccl_conf == {"NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "WARN"}
    assert not [p for p in report.probes if p.name == "platform" and not p.ok]
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nccl.conf").write_text(text)
    assert LiveHost(root).read_text("/etc/nccl.conf") == text
