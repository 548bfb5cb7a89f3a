"""What NCCL really chose, read from real NCCL_DEBUG=INFO logs people published (answer keys in
../shared/captures/public/nccl-debug/EXPECTED.json), and judged against a node's facts."""

import json
from dataclasses import asdict

import pytest
from helpers import PUBLIC, REPO, answer_key, hgx_h100_with_ndr, hgx_nvml, make_snapshot, need, nodecheck

from nodecheck.bench.nccl_debug import parse_nccl_debug
from nodecheck.core.errors import ParseError
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.verdicts.nccl_run import NcclRun, nccl_findings

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
    from nodecheck.verdicts.nccl_run import nccl_bus_id

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


_HOST = __import__("re").compile(r"^(?P<host>[^\s:]+)(?=:\d+:\d+ \[\d+\] NCCL )")
_RECORD_HEAD = __import__("re").compile(r"^[^\s:]*:\d+:\d+ \[\d+\] (?=NCCL )")


def _records_only(lines: list[str], join: int, sep: str) -> list[str]:
    """Consecutive NCCL lines joined `join` at a time with `sep` (a console paste that lost its newlines)."""
    out, group = [], []
    for line in lines:
        if " NCCL INFO" in line or " NCCL WARN" in line:
            group.append(line)
            if len(group) == join:
                out.append(sep.join(group))
                group = []
            continue
        out += [sep.join(group)] if group else []
        group = []
        out.append(line)
    return out + ([sep.join(group)] if group else [])


# Issue 20 (16): the forms published logs come in, each made from every real capture: name -> (lines -> lines)
PASTES = {
    "empty host": lambda lines: [_HOST.sub("", line) for line in lines],
    "rank tag before the host": lambda lines: [f"[{155 + i % 7}] {line}" for i, line in enumerate(lines)],
    "no prefix": lambda lines: [_RECORD_HEAD.sub("", line) for line in lines],
    "ISO timestamp before the host": lambda lines: [f"2024-06-01T12:00:{i % 60:02d}.123Z {line}" for i, line in enumerate(lines)],
    "bracketed timestamp": lambda lines: [f"[2024-06-01 12:00:{i % 60:02d}] {line}" for i, line in enumerate(lines)],
    "CloudWatch table": lambda lines: [f"| {1717243200000 + i} | {line} |" for i, line in enumerate(lines)],
    "records on one line": lambda lines: _records_only(lines, 3, " "),
    "timestamped records on one line": lambda lines: _records_only(
        [f"2024-06-01 12:00:{i % 60:02d}.{i:03d} {line}" for i, line in enumerate(lines)], 4, " "),
    "console table, records on one line": lambda lines: _records_only(
        [f"{1717243200000 + i} | {line}" for i, line in enumerate(lines)], 2, " | "),
}


@pytest.mark.parametrize("form", PASTES)
def test_every_published_log_reads_the_same_as_people_paste_it(form):
    """Each real capture, turned into a form published logs come in, gives the facts of its answer key;
    host names count nodes only where the paste kept them."""
    key = answer_key("nccl-debug")
    for name, expected in key.items():
        lines = (DEBUG / name).read_text().splitlines()
        run = parse_nccl_debug("\n".join(PASTES[form](lines)))
        got = facts(run)
        want = {k: expected[k] for k in (*KEYED, "warnings")}
        assert {k: got[k] for k in want} == want, (form, name)
        if form in ("empty host", "no prefix"):
            assert got["nodes"] is None or got["nodes"] <= (expected["nodes"] or 0), (form, name, run.nodes)
        else:
            assert got["nodes"] == expected["nodes"], (form, name, run.nodes)


@pytest.mark.parametrize("form", PASTES)
def test_warnings_count_in_every_form(form):
    text = need(DEBUG / "2node-h20-ib-gdrdma-p2p-cumem-nccltests-alltoall.txt").read_text()
    warn = ["node1:11:12 [0] NCCL WARN NET/IB : Got async event : port error"] * 3
    run = parse_nccl_debug("\n".join(PASTES[form](text.splitlines() + warn)))
    assert run.warning_count == 3 and run.warnings == ["NET/IB : Got async event : port error"], (form, run.warnings)


def test_a_time_of_day_is_not_a_host():
    run = parse_nccl_debug("12:00:01 [0] NCCL INFO Using network IB\n12:00:02 [0] NCCL WARN oops\n")
    assert run.nodes == [] and run.network == "IB" and run.warnings == ["oops"]


def test_efa_and_shared_gdrdma_channels_are_gpudirect(tmp_path):
    """aws-ofi-nccl names its network (AWS Libfabric, Libfabric, OFI); a channel with GDRDMA, also followed
    by /Shared (NCCL's shared proxy buffers), is GPUDirect RDMA: no nccl_no_gdr."""
    report = hgx_h100_with_ndr(tmp_path)
    for network in ("AWS Libfabric", "Libfabric", "OFI"):
        text = (f"p4d-a:1:1 [0] NCCL INFO Using network {network}\n"
                f"p4d-a:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/{network}/0/GDRDMA/Shared\n"
                f"p4d-b:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [receive] via NET/{network}/1/GDRDMA\n")
        run = parse_nccl_debug(text)
        assert run.network == network and run.gdr is True and run.nodes == ["p4d-a", "p4d-b"]
        assert "nccl_no_gdr" not in [f.kind for f in nccl_findings(run, report)]
    without = parse_nccl_debug("NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Libfabric/0\n")
    assert without.gdr is False and without.nodes == []


def test_no_ib_device_then_sockets_is_a_fallback_across_nodes_not_on_one_node(tmp_path):
    """"NET/IB : No device found" followed by NET/Socket: on the published one-node run over loopback, no
    finding; the same lines from two hosts (an excerpt without channel lines), a socket fallback."""
    report = hgx_h100_with_ndr(tmp_path)
    text = need(DEBUG / "single-node-2xv100-loopback-socket-nccl248-nccltests-header.txt").read_text()
    one = parse_nccl_debug(text)
    assert one.network == "Socket" and one.nodes == ["ds-ml-01-0"]
    assert "nccl_socket_fallback" not in [f.kind for f in nccl_findings(one, report)]
    lines = [line for line in text.splitlines() if ":17755:" in line]
    two = parse_nccl_debug(text + "\n" + "\n".join(line.replace("ds-ml-01-0", "ds-ml-01-1") for line in lines))
    assert two.nodes == ["ds-ml-01-0", "ds-ml-01-1"] and two.inter_node_transports == []
    assert "nccl_socket_fallback" in [f.kind for f in nccl_findings(two, report)]


def test_a_debugging_variable_the_run_took_is_said(tmp_path):
    """AWS's two-node g5 run logged "NCCL_PROTO set by environment to simple" (and its socket interface): every
    collective ran on one protocol whatever its size. `nodecheck nccl-log` lists what NCCL took from its
    environment and names the debugging variable; a run without one names none."""
    from helpers import REPO, cli

    capture = need(DEBUG / "2node-g5-efa-aws-libfabric-gdr-disabled-nccl2234.txt")
    run = parse_nccl_debug(capture.read_text())
    assert run.settings == {"NCCL_SOCKET_IFNAME": "ens5", "NCCL_PROTO": "simple"}
    # ncclParam's own lines end in a full stop (NVIDIA/nccl#1814: "NCCL_IB_GID_INDEX set by environment to 3.")
    line = "host-1:985:1263 [7] NCCL INFO NCCL_IB_GID_INDEX set by environment to 3."
    assert parse_nccl_debug(line).settings == {"NCCL_IB_GID_INDEX": "3"}
    example = str(REPO / "examples" / "hgx-h100-8gpu")
    document = json.loads(cli("nccl-log", str(capture), "--from", example, "--json").stdout)
    assert document["nccl"]["settings"] == run.settings
    (setting,) = [f for f in document["findings"] if f["kind"] == "nccl_setting"]
    assert (setting["severity"], setting["measured"]) == ("warning", "NCCL_PROTO=simple")
    text = cli("nccl-log", str(capture), "--from", example).stdout
    assert "set from its environment: NCCL_SOCKET_IFNAME=ens5, NCCL_PROTO=simple" in text
    clean = capture.read_text().replace("NCCL_PROTO set by environment to simple", "NCCL_PROTO unset")
    (tmp_path / "clean.txt").write_text(clean)
    document = json.loads(cli("nccl-log", str(tmp_path / "clean.txt"), "--from", example, "--json").stdout)
    assert not [f for f in document["findings"] if f["kind"] == "nccl_setting"]


def test_a_job_selecting_fewer_rails_than_the_node_has_is_said(tmp_path):
    """bench across nodes in a job that set NCCL_IB_HCA=mlx5_0,mlx5_1 on an eight-rail HGX node: its all-reduce is
    judged against the two rails it selected (src/nodecheck/assemble/rails.fabric_nics), so a job on a quarter of the node's rails
    passed without a word. The run's settings name the rails left out; one that selects none says every job's data
    went over sockets; the same value already in /etc/nccl.conf is nccl_config's to say, not said twice."""
    import dataclasses

    from nodecheck.report.model import Platform

    report = hgx_h100_with_ndr(tmp_path)
    (finding,) = [f for f in nccl_findings(NcclRun(settings={"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}), report)
                  if f.kind == "nccl_setting"]
    assert (finding.severity, finding.measured, finding.expected) == ("warning", "NCCL_IB_HCA==mlx5_0,mlx5_1", "every rail (8)")
    assert "leaves out mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7" in finding.message
    (none,) = [f for f in nccl_findings(NcclRun(settings={"NCCL_IB_HCA": "mlx4"}), report) if f.kind == "nccl_setting"]
    assert "selects none of the node's active RDMA devices" in none.message
    assert [f for f in nccl_findings(NcclRun(settings={"NCCL_IB_HCA": "mlx5"}), report) if f.kind == "nccl_setting"] == []
    conf = dataclasses.replace(report, platform=Platform(None, True, nccl_conf={"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}))
    assert [f for f in nccl_findings(NcclRun(settings={"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}), conf)
            if f.kind == "nccl_setting"] == []


def test_the_hca_selection_nccl_printed_is_read_from_a_published_log(tmp_path):
    """NCCL prints the job's HCA selection shorter than its other parameters (src/transport/net_ib/init.cc: "NCCL_IB_HCA
    set to %s", not "... set by environment to"): nccl-tests#228's eight ranks took mlx5_2:1,mlx5_0:1. The selection was
    never read from a real log, so the shortfall above could not be said of one; held against the eight-rail HGX node
    it is."""
    text = (REPO / "tests" / "fixtures" / "nccl-debug" / "nccltests228-ib-hca-set-to-two-hcas.txt").read_text()
    run = parse_nccl_debug(text)
    assert run.settings == {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5_2:1,mlx5_0:1"}
    (finding,) = [f for f in nccl_findings(run, hgx_h100_with_ndr(tmp_path)) if f.kind == "nccl_setting"]
    assert (finding.measured, finding.expected) == ("NCCL_IB_HCA=mlx5_2:1,mlx5_0:1", "every rail (8)")
    assert "took its NCCL_IB_HCA from its environment (the job's): NCCL_IB_HCA=mlx5_2:1,mlx5_0:1 leaves out mlx5_1," in finding.message
    socket = parse_nccl_debug("h:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set to eth0\n")  # src/misc/socket.cc's form
    assert socket.settings == {"NCCL_SOCKET_IFNAME": "eth0"}


def test_shm_is_judged_per_pair_of_gpus(tmp_path):
    """NCCL takes P2P up to PXB and SHM past it (src/graph/paths.cc). nccl#1817's 8x L20 (PCIe-switch pairs): SHM
    1->2, 3->4, 5->6 and 7->0, between the pairs, as NCCL's defaults do. Held against the published 4x A30 node (NV4
    pairs 0-1 and 2-3, SYS between), the one SHM channel it can place, 1->2, crosses SYS: nothing wrong; before, a
    warning, because NV4 linked two other GPUs. nccl#1609's H800 GPUs 6 and 7 over SHM, on an HGX node where NV18 links
    them: P2P is off, named by pair."""
    from nodecheck.verdicts.nccl_run import nccl_run_from_details

    fixtures = REPO / "tests" / "fixtures" / "nccl-debug"
    l20 = parse_nccl_debug((fixtures / "nccl1817-8x-l20-shm-between-switch-pairs.txt").read_text())
    assert l20.shm_pairs == [["3", "4"], ["1", "2"], ["5", "6"], ["7", "0"]]
    assert l20.intra_node_transports == ["P2P/direct pointer", "SHM/direct/direct"]
    a30 = build_report(SnapshotHost(make_snapshot(tmp_path / "a30", topo="4x-a30-nvlink-bridge-pairs-1nic-xeon6342.txt",
                                                  nvml_gpus=hgx_nvml(4, version=5, name="NVIDIA A30")[:4])))
    assert [f.kind for f in nccl_findings(l20, a30)] == []
    assert [f.kind for f in nccl_findings(NcclRun(intra_node_transports=["SHM/direct/direct"]), a30)] == ["nccl_p2p_disabled"]
    h800 = parse_nccl_debug((fixtures / "nccl1609-h800-shm-between-nvlinked-gpus.txt").read_text())
    hgx = build_report(SnapshotHost(REPO / "examples" / "hgx-h100-8gpu"))
    (finding,) = nccl_findings(h800, hgx)
    assert finding.kind == "nccl_p2p_disabled" and "although gpu6 and gpu7 (NV18) link them: P2P is off" in finding.message
    # the run's own NCCL_P2P_LEVEL moves the line (NCCL logs it by its path name): SYS makes 1->2 due P2P on the A30 node;
    # NCCL_P2P_DISABLE=1 leaves SHM its only way, said as that setting, not as SHM
    import dataclasses

    everywhere = dataclasses.replace(l20, settings={"NCCL_P2P_LEVEL": "SYS"})
    (due,) = nccl_findings(everywhere, a30)
    assert "although gpu1 and gpu2 (SYS) link them" in due.message
    disabled = [f.kind for f in nccl_findings(dataclasses.replace(h800, settings={"NCCL_P2P_DISABLE": "1"}), hgx)]
    assert disabled == ["nccl_setting"]
    # where NVML says the pair has no P2P (as it says of GeForce boards), SHM is all NCCL can take: no finding
    refused = [dataclasses.replace(g, p2p_read={"gpu7": "GPU not supported"} if g.index == 6 else g.p2p_read) for g in hgx.gpus]
    assert nccl_findings(h800, dataclasses.replace(hgx, gpus=refused)) == []
    back = nccl_run_from_details(json.loads(json.dumps(asdict(h800))))
    assert back.shm_pairs == [["6", "7"], ["7", "6"]]
    assert nccl_run_from_details(dict(asdict(h800), shm_pairs=[["6"]])).shm_pairs == []  # a hostile shape: dropped
