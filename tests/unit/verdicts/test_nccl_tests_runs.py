"""An nccl-tests log is judged only as one job's. Under mpirun or srun, an nccl-tests built without MPI=1 runs a whole
test in every process, each its own rank 0: the log then holds several runs (a header, a footer and a rank 0 each),
or runs of one rank whose busbw is 0.00 however fast the GPU. Published logs of both are refused with what to do
(exit 2), never judged against NVLink or the rails; wrong data in them is still an error. Published healthy runs are
neither."""

import json

import pytest
from helpers import PUBLIC, REPO, need, nodecheck, without_device_lines

from nodecheck.bench import plan
from nodecheck.bench.nccl_tests import parse_nccl_log, separate_runs
from nodecheck.bench.nccl_tests_job import one_rank
from nodecheck.config import Config
from nodecheck.core.errors import ParseError
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report

FIXTURES = REPO / "tests" / "fixtures" / "nccl-tests"
HGX = REPO / "examples" / "hgx-h100-8gpu"
TWO_RUNS = FIXTURES / "nccltests182-testgpu1-testgpu2-two-separate-2gpu-runs.txt"
ONE_RANK = FIXTURES / "nccltests294-2x-h100-16-processes-one-rank-each.txt"


def test_two_hosts_separate_runs_are_no_job():
    """nccl-tests#182: testgpu1's and testgpu2's own 2-GPU runs, one footer each. Before, their rows were one log,
    and NCCL's lines from two hosts made it a job across nodes judged against the rails."""
    log = parse_nccl_log(TWO_RUNS.read_text())
    assert (log.footers, log.headers) == (2, 0)
    assert separate_runs(log) == "the log holds more than one nccl-tests run (2 'Avg bus bandwidth' lines)"
    result = nodecheck("bench", "--nccl-log", str(TWO_RUNS), "--from", str(HGX))
    assert result.returncode == 2 and result.stdout == ""
    assert "more than one nccl-tests run" in result.stderr and "make MPI=1" in result.stderr
    assert "one run per file" in result.stderr


def test_rows_of_one_rank_measure_no_link():
    """nccl-tests#294: 16 processes on two H100 nodes, each alone: busbw 0.00 at algbw up to 637.23 GB/s. Before,
    an error: '0 B/s = 0.00 of spec 450.0 GB/s' (NVLink) on an HGX node, as if its NVLink were dead."""
    log = parse_nccl_log(ONE_RANK.read_text())
    assert separate_runs(log) is None  # its paste kept only rows
    assert "algbw reaches 637.23 GB/s" in one_rank(log)
    result = nodecheck("bench", "--nccl-log", str(ONE_RANK), "--from", str(HGX), "--json")
    assert result.returncode == 2 and result.stdout == ""
    assert "a run of one rank" in result.stderr and "measured no link" in result.stderr and "-g N" in result.stderr


def test_wrong_data_in_a_run_of_one_rank_is_still_an_error(tmp_path):
    """nccl-tests#249's one-rank header (its headings say the column counts wrong elements; its A10G device line left
    out, which no H100 node would judge) above nccl-tests#294's rows, the first with its in-place #wrong made 12 (a
    mutation): the GPU computed wrong alone; the speed is not judged, the data is."""
    rows = ONE_RANK.read_text().splitlines()
    cells = rows[0].rsplit(" 0", 1)
    rows[0] = cells[0] + "12" + cells[1]
    assert rows[0].split()[-1] == "12"
    header = without_device_lines(FIXTURES / "nccltests249-g5-a10g-one-rank-header-without-hashes.txt", tmp_path).read_text()
    (tmp_path / "log.txt").write_text(header + "\n".join(rows) + "\n")
    result = nodecheck("bench", "--nccl-log", str(tmp_path / "log.txt"), "--from", str(HGX), "--json")
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert [f["kind"] for f in out["findings"]] == ["bench_wrong_result"]
    measurement = out["measurement"]
    assert measurement["spec_bytes_per_second"] is None and measurement["ratio"] is None
    assert measurement["details"]["spec_basis"].startswith("no spec: a run of one rank")


def test_a_header_of_two_runs_says_so():
    """nccl-tests#306: two headers, then ranks 0 to 7 on node3 and ranks 0 to 4 again on node2; the paste stops before
    its table. Before: 'is this an nccl-tests log?'."""
    with pytest.raises(ParseError) as raised:
        parse_nccl_log((FIXTURES / "nccltests306-2x-h20-two-8-rank-runs-header.txt").read_text())
    said = str(raised.value)
    assert said.startswith("an nccl-tests header without result rows (cut before its table?)")
    assert "2 'nThread' header lines; rank 0 on node3 (pid 1530412) and on node2 (pid 2236260)" in said


def test_a_header_pasted_without_hashes_is_read():
    """nccl-tests#249: outside a code block every '#' went; the header, devices and headings are still nccl-tests'."""
    text = (FIXTURES / "nccltests249-g5-a10g-one-rank-header-without-hashes.txt").read_text()
    with pytest.raises(ParseError, match="an nccl-tests header without result rows"):
        parse_nccl_log(text)
    row = "   134217728      33554432     float     sum      -1    631.9  212.41    0.00      0     0.51  263017.30    0.00      0\n"
    log = parse_nccl_log(text + row)  # the header above one of nccl-tests#294's rows
    assert (log.headers, log.nthreads, log.ngpus, log.check_column) == (1, 1, 1, "#wrong")
    assert log.devices == ["rank 0 nccl-846b9d30a6bb6b529fb3c170f4809fea-1725464730-worker-0 device 0: NVIDIA A10G"]
    assert log.issues == ["1 line(s) neither a result row, a '#' line nor NCCL's own, not read: line 1: "
                          "\"Warning: Permanently added '[192.168.173.233]:2022' (RSA) to the list of known hosts.\""]


def _published_runs():
    names = sorted(p for p in (PUBLIC / "nccl").glob("*.txt")) if (PUBLIC / "nccl").is_dir() else []
    return names + [p for p in sorted(FIXTURES.glob("*.txt")) if not p.name.startswith(("nccltests182", "nccltests294",
                                                                                         "nccltests306", "nccltests249",
                                                                                         "nccl1453-turn2"))]


@pytest.mark.parametrize("path", _published_runs(), ids=lambda p: p.name)
def test_published_single_runs_are_one_job(path):
    log = parse_nccl_log(path.read_text())
    assert separate_runs(log) is None and one_rank(log) is None
    assert log.headers <= 1 and log.footers <= 1


def test_bench_says_it_where_its_own_run_had_one_rank(tmp_path):
    """all_reduce_perf's stand-in prints nccl-tests#294's rows: bench's measurement fails with the reason, no verdict."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "all_reduce_perf").write_text(f"#!/bin/sh\ncat {ONE_RANK}\n")
    (bin_dir / "all_reduce_perf").chmod(0o755)
    report = build_report(SnapshotHost(HGX))
    (m,) = plan.run(report, Config(), ["nccl_tests"], "quick", 30, {"PATH": f"{bin_dir}:/usr/bin:/bin"}, None)
    assert not m.ok and "a run of one rank" in m.error and m.ratio is None


def test_a_rank_count_the_log_only_bounds_is_said_as_a_bound():
    """nccl-tests#176's 128 ranks at 2.15 GB/s: its rows' busbw/algbw say 87 or more. Before, "87 ranks", and with
    --nodes 16 still "pass --nodes N" (87 does not split over 16); a count that did split set the ranks per node, and
    so the rails, from a lower bound. Now the count is said as a bound, and --nodes settles it only where one count fits
    (no more ranks per node than this node's GPUs)."""
    from nodecheck.bench.collective_rows import ranks_from_rows
    from nodecheck.bench.nccl_binary import _job_ranks, _rank_span

    log = FIXTURES / "nccltests176-128gpu-all_reduce-error-column-1e-06.txt"
    alone = nodecheck("bench", "--nccl-log", str(log), "--from", str(HGX), "--json")
    m = json.loads(alone.stdout)["measurement"]
    assert (m["ranks"], m["spec_bytes_per_second"]) == (None, None)
    assert m["details"]["across_nodes"] == "its rows' busbw/algbw give at least 87 ranks, where this node has 8 GPUs"
    assert m["details"]["spec_basis"].startswith("no spec: at least 87 ranks across nodes") and "pass --nodes N" in m["details"]["spec_basis"]
    sixteen = json.loads(nodecheck("bench", "--nccl-log", str(log), "--from", str(HGX), "--nodes", "16", "--json").stdout)
    basis = sixteen["measurement"]["details"]["spec_basis"]
    assert basis.startswith("no spec: at least 87 ranks on 16 nodes leaves the ranks per node unsettled") and "--nodes" not in basis
    assert _job_ranks((87, None), 16, 8) is None  # 96, 112 or 128
    # CoreWeave's 1440-GPU paste keeps one device line, rank 1439: at least 1440, and its rows allow up to 1532
    rack = parse_nccl_log(need(PUBLIC / "nccl" / "coreweave-gb200-20racks-1440gpu-all_reduce_perf-partial.txt").read_text())
    assert _rank_span(rack, ranks_from_rows(rack, "all_reduce")) == (1440, 1532)
    assert _job_ranks((87, None), 11, 8) == 88  # 11 nodes of at most 8: only 88
    assert _job_ranks((1440, 1532), 180, 8) == 1440 and _job_ranks((16, 16), None, 8) == 16
    assert _job_ranks((0, None), 2, 8) is None and _job_ranks((87, None), None, 8) is None


def test_nccl_lines_of_hosts_that_each_ran_alone_are_no_job_across_nodes(tmp_path):
    """NCCL's own lines in nccl-tests#182: testgpu1 and testgpu2 each destroy ranks 0 and 1 of a 2-rank communicator, and
    no channel went through the network: two jobs, no communicator across the hosts. `nccl-log` says so, and the log's
    two hosts no longer make a job across nodes: were its network sockets (a mutation: `network` set to Socket, as the
    same hosts without IB would log), no socket fallback is claimed on an HGX node whose NDR rails are up."""
    import dataclasses

    from helpers import hgx_h100_with_ndr

    from nodecheck.bench.nccl_debug import parse_nccl_debug
    from nodecheck.verdicts.nccl_run import nccl_findings, nccl_run_from_details

    run = parse_nccl_debug(TWO_RUNS.read_text())
    assert (run.nodes, run.nranks, run.inter_node_transports) == (["testgpu1", "testgpu2"], 2, [])
    assert run.separate_hosts == "ranks 0 to 1 of 2 on testgpu1 and again on testgpu2"
    human = nodecheck("nccl-log", str(TWO_RUNS), "--from", str(HGX))
    assert "separate jobs, no communicator across the hosts: ranks 0 to 1 of 2 on testgpu1 and again on testgpu2" in human.stdout
    # its GPUs (NCCL's busId 3000, 3020) are not the HGX example's: what NCCL did is shown, the node is not judged
    assert human.returncode == 2 and "bus ids 3000, 3020" in human.stderr
    node = hgx_h100_with_ndr(tmp_path)
    over_sockets = dataclasses.replace(run, network="Socket")
    assert nccl_findings(over_sockets, node) == []
    joined = dataclasses.replace(over_sockets, separate_hosts=None)  # read as one job, it would have been
    assert [f.kind for f in nccl_findings(joined, node)] == ["nccl_socket_fallback"]
    back = nccl_run_from_details(dataclasses.asdict(run))
    assert back.separate_hosts == run.separate_hosts
    assert nccl_run_from_details(dict(dataclasses.asdict(run), separate_hosts="x" * 301)).separate_hosts is None


def _published_multi_host_logs():
    folder = PUBLIC / "nccl-debug"
    return sorted(folder.glob("[24]node-*.txt")) if folder.is_dir() else []


@pytest.mark.parametrize("path", _published_multi_host_logs(), ids=lambda p: p.name)
def test_published_jobs_across_nodes_stay_jobs_across_nodes(path):
    """Every published job across 2 or 4 nodes: a communicator spans the hosts (or the paste shows part of one)."""
    from nodecheck.bench.nccl_debug import parse_nccl_debug

    run = parse_nccl_debug(path.read_text())
    assert len(run.nodes) >= 2 and run.separate_hosts is None


def test_a_log_of_other_gpus_is_not_judged_against_this_node():
    """superbench's healthy 8x A100-SXM4-40GB all-reduce held against the HGX H100 example: before, an error, "235.3
    GB/s = 0.52 of spec 450.0 GB/s: check the GPUs' NVLink state", a healthy A100 run read as a broken H100 NVLink. A log
    whose device lines name GPUs, none of them the node's, is refused with why (exit 2). Names are the driver's one
    string to CUDA and NVML alike, older drivers without "NVIDIA" or with "Tesla"; an unnamed board compares with none."""
    from nodecheck.bench.nccl_tests_job import gpu_kinds

    log = need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-all_reduce_perf.txt")
    run = nodecheck("bench", "--nccl-log", str(log), "--from", str(HGX), "--json")
    assert run.returncode == 2 and run.stdout == ""
    assert (f"the log's GPUs are A100-SXM4-40GB, snapshot {HGX}'s are NVIDIA H100 80GB HBM3: a log is judged against a "
            "node of its own kind") in run.stderr
    assert gpu_kinds(["A100-SXM4-40GB"]) == gpu_kinds(["NVIDIA A100-SXM4-40GB"]) == {"a100-sxm4-40gb"}
    assert gpu_kinds(["Tesla V100-SXM2-32GB"]) == gpu_kinds(["NVIDIA  Tesla V100-SXM2-32GB "]) == {"v100-sxm2-32gb"}
    assert gpu_kinds(["NVIDIA Graphics Device", None]) == set()
    assert gpu_kinds(["NVIDIA A100-SXM4-40GB MIG 1g.5gb"]) == {"a100-sxm4-40gb"}  # CUDA's name of a MIG instance
