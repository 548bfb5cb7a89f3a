"""What NCCL really chose, read from real NCCL_DEBUG=INFO logs people published (answer keys in
../shared/captures/public/nccl-debug/EXPECTED.json), and judged against a node's facts."""

import json
from dataclasses import asdict

import pytest
from conftest import PUBLIC, answer_key, hgx_nvml, make_snapshot, need, nodecheck
from test_fabric import hgx_h100_with_ndr

from nodecheck.bench.nccl_debug import parse_nccl_debug
from nodecheck.build import build_report
from nodecheck.errors import ParseError
from nodecheck.nccl_run import NcclRun, nccl_findings
from nodecheck.snapshot import SnapshotHost

DEBUG = PUBLIC / "nccl-debug"
KEYED = ("nccl_version", "network", "ib_devices", "socket_ifaces", "inter_node_transports", "intra_node_transports",
         "gdr", "nvls")


def facts(run: NcclRun) -> dict:
    got = {key: getattr(run, key) for key in KEYED}
    return dict(got, warnings=run.warning_count, nodes=len(run.nodes) or None)


def test_every_published_log_reads_as_its_answer_key():
    key = answer_key("nccl-debug")
    assert len(key) == 10
    for name, expected in key.items():
        run = parse_nccl_debug((DEBUG / name).read_text())
        assert facts(run) == {k: expected[k] for k in (*KEYED, "warnings", "nodes")}, name


def test_launcher_prefixes_change_nothing():
    text = need(DEBUG / "2node-a100-ib-gdrdma-p2p-ipc-read-channels.txt").read_text()
    plain = facts(parse_nccl_debug(text))
    for prefix in ("[1,0]<stdout>:", "0: "):
        assert facts(parse_nccl_debug("\n".join(prefix + line for line in text.splitlines()))) == plain


def test_warnings_are_quoted_and_counted():
    text = need(DEBUG / "2node-h20-ib-gdrdma-p2p-cumem-nccltests-alltoall.txt").read_text()
    warn = "node1:1:2 [0] NCCL WARN NET/IB : Got async event : port error\n"
    run = parse_nccl_debug(text + warn * 3)
    assert run.warning_count == 3 and run.warnings == ["NET/IB : Got async event : port error"]


@pytest.mark.parametrize("text", ["", "all_reduce_perf: 8 GPUs\n", "# nThread 1 nGpus 8\n"])
def test_a_log_without_nccl_lines_is_said_so(text):
    with pytest.raises(ParseError, match="NCCL_DEBUG=INFO"):
        parse_nccl_debug(text)


def test_findings_on_an_hgx_node_with_ndr_rails(tmp_path):
    """On an HGX H100 node with eight ACTIVE NDR rails and NVLink between the GPUs: the published run
    without GPUDirect RDMA is named; a run over sockets, or one over SHM inside the node, is named; the
    healthy published GDRDMA run gives nothing."""
    report = hgx_h100_with_ndr(tmp_path)
    kinds = lambda run: [f.kind for f in nccl_findings(run, report)]  # noqa: E731
    assert kinds(parse_nccl_debug(need(DEBUG / "2node-a100-ib-gdrdma-p2p-ipc-read-channels.txt").read_text())) == []
    assert kinds(parse_nccl_debug((DEBUG / "2node-a100-ib-no-gdr-p2p-direct-pointer-read.txt").read_text())) == ["nccl_no_gdr"]
    assert kinds(NcclRun(network="Socket", inter_node_transports=["NET/Socket/0"])) == ["nccl_socket_fallback"]
    assert kinds(NcclRun(intra_node_transports=["SHM/direct/direct"])) == ["nccl_p2p_disabled"]


def test_no_false_finding_where_the_node_cannot_do_better(tmp_path):
    """Sockets on a node without RDMA NICs, and SHM between GPUs that only meet across sockets, are what
    such a node does: no finding."""
    report = build_report(SnapshotHost(make_snapshot(tmp_path / "pcie", topo="8gpu-pcie-all-sys-2socket-tabs.txt",
                                                     nvml_gpus=hgx_nvml(0))))
    run = NcclRun(network="Socket", inter_node_transports=["NET/Socket/0"], intra_node_transports=["SHM/direct/direct"])
    assert nccl_findings(run, report) == []


def test_the_nccl_log_command(tmp_path):
    snap = make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    log = need(DEBUG / "2node-a100-ib-no-gdr-p2p-direct-pointer-read.txt")
    run = nodecheck("nccl-log", str(log), "--from", str(snap), "--json")
    document = json.loads(run.stdout)
    assert run.returncode == 0 and document["nccl"]["gdr"] is False  # a warning: no exit 1 at the default error
    assert [f["kind"] for f in document["findings"]] == ["nccl_no_gdr"]
    text = nodecheck("nccl-log", str(log), "--from", str(snap)).stdout
    assert "between nodes: NET/IB/0, NET/IB/1, NET/IB/2, NET/IB/3  (GPUDirect RDMA: no)" in text
    (tmp_path / "other.log").write_text("hello\n")
    refused = nodecheck("nccl-log", str(tmp_path / "other.log"), "--from", str(snap))
    assert refused.returncode == 2 and "NCCL_DEBUG=INFO" in refused.stderr


def test_asdict_is_plain_json():
    run = parse_nccl_debug(need(DEBUG / "2node-g5-efa-aws-libfabric-gdr-disabled-nccl2234.txt").read_text())
    assert json.loads(json.dumps(asdict(run)))["network"] == "AWS Libfabric"


def test_a_gpu_on_an_hca_that_is_not_its_rail(tmp_path):
    """kolyoz1's published channels (gpu0 over NET/IBext_v8/0, gpu3 over /3) with NCCL's list of HCAs in its own
    `NET/IB : Using` format (the excerpt cut it): listed in rail order nothing is wrong; listed in reverse,
    gpu0's traffic leaves through mlx5_3 and gpu3's through mlx5_0, across the node. Only this node's lines count."""
    import dataclasses

    text = need(DEBUG / "2node-h100-ibext-v8-gdrdma-cumem-nccltests-ngc.txt").read_text()
    report = hgx_h100_with_ndr(tmp_path)
    here = dataclasses.replace(report, node=dict(report.node, hostname="kolyoz1.cluster"))

    def rails(order):
        using = " ".join(f"[{i}]mlx5_{n}:1/IB" for i, n in enumerate(order))
        run = parse_nccl_debug(f"kolyoz1:1:1 [0] NCCL INFO NET/IBext_v8 : Using {using} ; OOB ib0:10.0.0.1<0>\n{text}")
        return [(f.subject, f.measured, f.expected) for f in nccl_findings(run, here) if f.kind == "nccl_rail_mismatch"]

    assert parse_nccl_debug(text).gpu_net_devices["kolyoz1"] == {"0": [0], "3": [3]}
    assert rails(range(8)) == []
    assert rails(reversed(range(8))) == [("gpu0", "mlx5_7", "mlx5_0"), ("gpu3", "mlx5_4", "mlx5_3")]
    elsewhere = parse_nccl_debug(f"kolyoz1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_7:1/IB\n{text}")
    assert [f for f in nccl_findings(elsewhere, report) if f.kind == "nccl_rail_mismatch"] == []  # not this node


def test_nccl_bus_ids():
    from nodecheck.nccl_run import nccl_bus_id

    assert (nccl_bus_id("0000:92:00.0"), nccl_bus_id("00000000:4A:00.0"), nccl_bus_id(None), nccl_bus_id("x")) == (
        0x92000, 0x4A000, None, None)


def test_digits_that_are_not_numbers_are_not_read_as_rails(tmp_path):
    """'²' passes str.isdigit() but not int(): in a log line or a Report's details it is ignored, not a crash."""
    import dataclasses

    assert parse_nccl_debug("h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/²/GDRDMA\n").gpu_net_devices == {}
    report = hgx_h100_with_ndr(tmp_path)
    here = dataclasses.replace(report, node=dict(report.node, hostname="kolyoz1"))
    run = NcclRun(gpu_net_devices={"kolyoz1": {"²": [0]}}, net_device_names={"kolyoz1": {"0": "mlx5_7:1"}})
    assert nccl_findings(run, here) == []
