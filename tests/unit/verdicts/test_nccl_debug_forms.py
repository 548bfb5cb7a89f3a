"""Published NCCL debug logs in the forms they are pasted (tests/fixtures/nccl-debug/SOURCES.md names each source):
an anonymised or container host, two machines sharing a host name, NCCL 2.3's words and NCCL before 2.7's ring
lines, aws-ofi-nccl on libfabric's tcp provider, lines that lost NCCL's head, and torchrun's, mpirun's and srun's
rank tags. Each is judged against a node like the one it ran on."""

from dataclasses import asdict

import pytest
from helpers import PUBLIC, REPO, h100_nvml_records, hgx_h100_with_ndr, make_snapshot, need

from nodecheck.bench.nccl_debug import parse_nccl_debug
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.verdicts.nccl_run import nccl_findings, nccl_run_from_details

FORMS = REPO / "tests" / "fixtures" / "nccl-debug"


def run_of(name: str):
    return parse_nccl_debug((FORMS / name).read_text())


def kinds(run, report):
    return [f.kind for f in nccl_findings(run, report)]


def test_an_anonymised_host_in_docker_is_a_socket_fallback(tmp_path):
    """NCCL#952: "<cluster_name>" for the host, NET/Socket channels to the other node's rank 6."""
    run = run_of("nccl952-docker-anonymised-host-socket.txt")
    assert (run.nodes, run.inter_node_transports, run.intra_node_transports) == ([], ["NET/Socket/3"], ["P2P/IPC/read"])
    assert run.nranks == 16
    assert kinds(run, hgx_h100_with_ndr(tmp_path)) == ["nccl_socket_fallback"]


def test_two_machines_sharing_a_host_name_are_not_one_host(tmp_path):
    """nccl-tests#166: both machines are "ubuntu"; rank 7 to rank 8 over sockets names 9 ranks or more, past the
    node's 8 GPUs: a fallback across nodes, not GPUs of one host that NCCL took for two."""
    run = run_of("nccltests166-two-hosts-named-ubuntu-socket.txt")
    assert (run.nodes, run.nranks) == (["ubuntu"], 9)
    assert kinds(run, hgx_h100_with_ndr(tmp_path)) == ["nccl_socket_fallback"]


def test_nccl_2_3s_words_in_a_container():
    """maskrcnn-benchmark#628: "Using internal Network Socket" is NCCL 2.3's "Using network Socket"; 4 ranks."""
    run = run_of("maskrcnn628-container-no-libibverbs-socket.txt")
    assert (run.network, run.nranks, run.nodes, run.warning_count) == ("Socket", 4, ["55d3479b71fb"], 4)


def test_ranks_of_one_host_over_the_network_are_named(tmp_path):
    """NCCL#367: 16 ranks in one container, NCCL before 2.7's "Ring 00 : 15 -> 0 [send] via NET/Socket/0". On a
    16-GPU node every rank fits: NCCL took them for different hosts (a finding); on an 8-GPU node the ranks cannot
    all be this one's, and it reads as a run across nodes."""
    run = run_of("nccl367-one-container-old-ring-net-socket.txt")
    assert (run.inter_node_transports, run.intra_node_transports, run.nranks) == (
        ["NET/Socket/0"], ["direct shared memory"], 16)
    gpus = [dict(h100_nvml_records()[0], uuid=f"GPU-{i}", pci=f"00000000:{0x10 + i:02x}:00.0") for i in range(16)]
    sixteen = build_report(SnapshotHost(make_snapshot(tmp_path / "sixteen", nvml_gpus=gpus)), None)
    (finding,) = nccl_findings(run, sixteen)
    assert finding.kind == "nccl_p2p_disabled" and "NCCL took its ranks for different hosts" in finding.message
    # NCCL before 2.19 printed no per-node count, and an excerpt of one host of a job across nodes reads the same:
    # the question, not a verdict
    assert finding.severity == "info" and "if it spanned nodes" in finding.message
    assert kinds(run, hgx_h100_with_ndr(tmp_path)) == ["nccl_socket_fallback"]


G5 = "2node-g5-efa-aws-libfabric-gdr-disabled-nccl2234.txt"  # ../shared: two g5 hosts, "nNodes 2 localRanks 1"


def one_hosts_lines(text: str, host: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith(host))


def test_one_hosts_lines_of_a_job_across_nodes_are_not_a_host_nccl_split(tmp_path):
    """A paste of one host's lines of a two-node job, judged against a node whose GPUs its ranks fit: NCCL's own count
    ("nRanks 2 nNodes 2 localRanks 1") says the job spanned nodes; no finding. vllm-dgx-spark#1's excerpt, one Spark's
    eight lines without that count, is said as the question (info), never a warning."""
    g5 = one_hosts_lines(need(PUBLIC / "nccl-debug" / G5).read_text(), "compute-gpu-st-distributed-ml-1")
    run = parse_nccl_debug(g5)
    assert (run.nodes, run.nranks, run.host_split, run.local_ranks_fit) == (["compute-gpu-st-distributed-ml-1"], 2, None, True)
    hgx = hgx_h100_with_ndr(tmp_path)
    assert "nccl_p2p_disabled" not in kinds(run, hgx)
    spark = run_of("vllmdgxspark1-gb10-ray-ibext-dmabuf-no-gdrdma.txt")
    assert [(f.kind, f.severity) for f in nccl_findings(spark, hgx) if f.kind == "nccl_p2p_disabled"] \
        == [("nccl_p2p_disabled", "info")]


def test_more_ranks_on_a_host_than_nccl_counted_per_node_is_a_host_it_split(tmp_path):
    """The g5 job's two ranks printed under one host name (containers sharing a hostname): NCCL counted one rank per
    node, the host printed two, and their channels went through the network: a warning that says so."""
    text = need(PUBLIC / "nccl-debug" / G5).read_text().replace("compute-gpu-st-distributed-ml-2", "compute-gpu-st-distributed-ml-1")
    run = parse_nccl_debug(text)
    assert run.host_split.startswith("compute-gpu-st-distributed-ml-1 printed 2 ranks of a 2-rank communicator")
    (finding,) = [f for f in nccl_findings(run, hgx_h100_with_ndr(tmp_path)) if f.kind == "nccl_p2p_disabled"]
    assert finding.severity == "warning" and "1 per node (localRanks)" in finding.message
    assert nccl_run_from_details(asdict(run)).host_split == run.host_split


def test_nccls_own_one_node_count_and_a_healthy_pair(tmp_path):
    run = run_of("nccl1358-one-node-two-gpus-nnodes.txt")
    assert (run.nranks, run.intra_node_transports, run.inter_node_transports) == (2, ["P2P/direct pointer"], [])
    assert kinds(run, hgx_h100_with_ndr(tmp_path)) == []


@pytest.mark.parametrize("name", ["ofi-tcp-provider-g5-no-prefix.txt", "ofi-tcp-provider-warn-lines.txt"])
def test_aws_ofi_ncc_on_the_tcp_provider_is_sockets_under_the_plugins_name(tmp_path, name):
    """"Using network AWS Libfabric" reads the same over EFA and over TCP; "NET/OFI Selected provider is tcp" tells
    them apart. Lines a grep kept without NCCL's head are read as NCCL's where the text has no headed line at all."""
    run = run_of(name)
    assert run.ofi_provider == "tcp" and run.nccl_lines >= 2
    (finding,) = [f for f in nccl_findings(run, hgx_h100_with_ndr(tmp_path)) if f.kind != "nccl_warning"]
    assert finding.kind == "nccl_socket_fallback" and "libfabric's tcp provider" in finding.message


def test_bare_lines_are_not_read_beside_headed_ones():
    """Prose that quotes "Using network IB" beside a real log's headed lines is not a second NCCL record."""
    text = (FORMS / "nccl1358-one-node-two-gpus-nnodes.txt").read_text() + "Using network Socket\n"
    assert parse_nccl_debug(text).network is None


@pytest.mark.parametrize("tag", ["[1,{r}]<stdout>:", "{r}: ", "[default{r}]:", "[rank{r}]:"])
def test_rank_tagged_pastes_read_as_untagged(tag):
    """NCCL#1235's one host of four GPUs over P2P/IPC/read, each line tagged as mpirun, srun -l and torchrun tag it:
    the same transports and host. torchrun's tag glued to the host hid it, and the host counted no node."""
    lines = (FORMS / "nccl1235-p2p-ipc-read-one-node-4gpu.txt").read_text().splitlines()
    tagged = "\n".join(tag.format(r=line.split("[", 1)[1].split("]", 1)[0]) + line for line in lines)
    run = parse_nccl_debug(tagged)
    assert (run.nodes, run.intra_node_transports, run.inter_node_transports, run.nranks) == (
        ["ng30903"], ["P2P/IPC/read"], [], 4)
