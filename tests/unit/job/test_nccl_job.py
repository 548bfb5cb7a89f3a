"""NCCL Inspector's files read (src/nodecheck/job/inspector.py) and the rank that holds a job back named
(src/nodecheck/job/ranks.py, `nodecheck nccl-job`). NVIDIA's own published records (the plugin's README, v4.3) are
read as printed; the jobs are generated as NCCL times them: a collective ends on every rank when the last rank has
joined, and with kernel timing each rank's time runs from its own start, so a late rank has the shortest time and the
rank that waited longest the lowest bus bandwidth."""

import json
import random

import pytest
from helpers import cli

from nodecheck.core.errors import ParseError
from nodecheck.job.inspector import parse_inspector
from nodecheck.job.ranks import JobVerdict, judge_job

# plugins/profiler/inspector/README.md, "Per-Dump Stats Record" and "Output Example" (JSON v4.3), one object a line
README_MARKER = {"header": {"id": "0x7f8c496ae9f661", "rank": 2, "n_ranks": 8, "nnodes": 1},
                 "metadata": {"inspector_output_format_version": "v4.3", "git_rev": "", "rec_mechanism": "nccl_profiler_interface",
                              "dump_timestamp_us": 1748030377748202, "hostname": "example-hostname", "pid": 1639453},
                 "dump_stats": {"coll_records": 1, "coll_dropped_total": 4096, "coll_dropped_since_last_dump": 512, "p2p_records": 0,
                                "p2p_dropped_total": 0, "p2p_dropped_since_last_dump": 0, "proxy_records": 0}}
README_COLL = {"coll_perf": {"coll": "AllReduce", "coll_algo": "RING", "coll_proto": "LL", "coll_sn": 1407,
                             "coll_msg_size_bytes": 17179869184, "coll_exec_time_us": 61974, "coll_algobw_gbs": 277.210914,
                             "coll_busbw_gbs": 485.119099}}


def test_nvidias_published_v43_records_read_with_their_dumps_context():
    text = "\n".join(json.dumps(r) for r in (README_MARKER, README_COLL, README_COLL))
    read = parse_inspector(text)
    (op,) = read.ops
    assert (op.host, op.pid, op.comm, op.rank, op.n_ranks, op.coll, op.sn, op.size, op.exec_us, op.busbw) == (
        "example-hostname", 1639453, "0x7f8c496ae9f661", 2, 8, "AllReduce", 1407, 17179869184, 61974.0, 485.119099)
    assert read.dropped == 512 and read.versions == {"v4.3"}
    assert read.skipped == {"a record past its dump's counts": 1}  # the second bare record belongs to no dump


def test_nvidias_published_records_as_a_file_of_one_dump():
    from helpers import REPO

    read = parse_inspector((REPO / "tests/fixtures/nccl-inspector/readme-v4.3-example-hostname-pid1639453.log").read_text())
    assert [(op.coll, op.sn, op.timing, op.start_ts) for op in read.ops] == [("AllReduce", 1407, None, None),
                                                                              ("ReduceScatter", 1231, "kernel_gpu", 1752867229235059)]
    assert read.skipped == {} and read.p2p == 0  # the proxy traces belong to the dump and are not judged


def test_older_self_contained_records_and_garbage_lines():
    record = {"header": README_MARKER["header"], "metadata": {**README_MARKER["metadata"], "inspector_output_format_version": "v4.1"},
              **README_COLL}
    text = "\n".join([json.dumps(record), "{not json", "[1, 2]", "x" * (1 << 20), json.dumps(README_COLL)])
    read = parse_inspector(text)
    assert len(read.ops) == 1 and read.versions == {"v4.1"}
    assert read.skipped == {"not a JSON object": 3, "a record with no communicator (outside a dump)": 1}
    with pytest.raises(ParseError):
        parse_inspector("hello\nworld\n")


def job(tmp_path, hosts=2, per_host=4, ops=40, late=None, lead_us=4100.0, seed=7, timing="kernel_gpu", skew_us=None):
    """One communicator over hosts x per_host ranks, each process a v4.3 file; `late`: the rank that joins each
    operation lead_us after the others (every rank also jitters by up to 200 us). skew_us: {host index: its clock's
    offset}, and each record carries its verbose start time (event_trace_ts.coll_start_ts) on its host's clock."""
    rng = random.Random(seed)
    n = hosts * per_host
    size, work = 1 << 28, 9000.0  # bytes, and the collective's own time once every rank is in
    lines = {rank: [] for rank in range(n)}
    for sn in range(ops):
        arrive = {rank: rng.uniform(0, 200) + (lead_us if rank == late else 0) for rank in range(n)}
        done = max(arrive.values()) + work
        for rank in range(n):
            exec_us = done - arrive[rank]
            perf = {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": exec_us,
                    "coll_timing_source": timing, "coll_algobw_gbs": size / exec_us / 1e3, "coll_busbw_gbs": size / exec_us / 1e3 * 2 * (n - 1) / n}
            if skew_us is not None:  # 1752867229235059: the README's verbose record's start, as a base
                perf["event_trace_ts"] = {"coll_start_ts": int(1752867229235059 + sn * 20000 + arrive[rank] + skew_us.get(rank // per_host, 0))}
            lines[rank].append({"coll_perf": perf})
    for rank in range(n):
        host = f"node{rank // per_host}"
        marker = {"header": {"id": "0xdp0", "rank": rank, "n_ranks": n, "nnodes": hosts},
                  "metadata": {"inspector_output_format_version": "v4.3", "hostname": host, "pid": 1000 + rank},
                  "dump_stats": {"coll_records": ops, "p2p_records": 0}}
        (tmp_path / f"{host}-pid{1000 + rank}.log").write_text("\n".join(json.dumps(r) for r in [marker, *lines[rank]]) + "\n")
    return tmp_path


def ops_of(directory):
    return [op for path in sorted(directory.iterdir()) for op in parse_inspector(path.read_text()).ops]


def test_the_late_rank_is_named_where_the_lowest_bus_bandwidth_names_another(tmp_path):
    ops = ops_of(job(tmp_path, late=5))
    verdict = judge_job(ops)
    (named,) = verdict.named
    assert (named.why, named.rank, named.host, named.pid, named.share) == ("late", 5, "node1", 1005, 1.0)
    assert 3900 < named.lead_us < 4200
    # ROCm cvs's rule: the rank with the lowest mean bus bandwidth: one that waited, never the late one
    mean = {rank: sum(o.busbw for o in ops if o.rank == rank) / 40 for rank in range(8)}
    assert min(mean, key=mean.get) != 5 and max(mean, key=mean.get) == 5


def test_a_healthy_job_and_cpu_timed_records_name_nobody(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    healthy = judge_job(ops_of(job(tmp_path / "a", late=None)))
    assert healthy.named == [] and healthy.ops == 40
    verdict = judge_job(ops_of(job(tmp_path / "b", late=5, timing="collective_cpu")))
    assert verdict.named == [] and "timed on the CPU" in verdict.notes[0]


def test_a_process_in_every_slow_communicator_and_no_fast_one(tmp_path):
    """Four tensor-parallel communicators (one per host, 4 ranks) and four data-parallel ones (rank k of each host):
    node2's local rank 1 has a slow link, so TP group 2 and DP group 1 run at half speed. Only that process is in
    both and in no fast one."""
    from nodecheck.job.inspector import Op

    ops = []
    for host in range(4):
        for local in range(4):
            pid = 100 * host + local
            for comm, rank, slow in ((f"tp{host}", local, host == 2), (f"dp{local}", host, local == 1)):
                for sn in range(10):
                    exec_us = 2000.0 * (2 if slow else 1) * (1 + 0.01 * ((sn + rank) % 3))
                    ops.append(Op(f"node{host}", pid, comm, rank, 4, 4, "AllReduce", sn, 1 << 26, exec_us, (1 << 26) / exec_us / 1e3 * 1.5, "kernel_gpu"))
    verdict = judge_job(ops)
    (named,) = [n for n in verdict.named if n.why == "slow_link"]
    assert (named.host, named.pid, sorted(named.comms)) == ("node2", 201, ["dp1", "tp2"])
    assert named.share == pytest.approx(0.5, abs=0.02)


def test_the_command_names_exits_and_says_its_schema(tmp_path):
    job(tmp_path, late=2)
    result = cli("nccl-job", str(tmp_path), "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert out["schema"] == "nodecheck.nccl_job" and out["ranks"] == 8 and len(out["files"]) == 8
    assert [(n["why"], n["rank"], n["host"]) for n in out["named"]] == [("late", 2, "node0")]
    text = cli("nccl-job", str(tmp_path))
    assert "late: rank 2 (node0, pid 1002) late in 100% of 40 AllReduce operation(s)" in text.stdout
    (tmp_path / "garbage.log").write_text("not inspector\n")
    assert cli("nccl-job", str(tmp_path / "garbage.log")).returncode == 2
    assert cli("nccl-job", str(tmp_path / "absent")).returncode == 2
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    assert cli("nccl-job", str(job(healthy))).returncode == 0


def test_reports_say_why_the_named_rank_is_slow(tmp_path):
    """The late rank 5 is pid 1005 on node1; node1's Report has that pid on gpu1, a clock slowdown there and port
    errors on its rail mlx5_1: the explanation names them, and not node0's or another GPU's findings."""
    from helpers import make_gpu, make_nic, make_report

    from nodecheck.report.findings import Finding
    from nodecheck.report.gpu import GpuProcess

    (tmp_path / "job").mkdir()
    job(tmp_path / "job", late=5)
    reports = tmp_path / "reports"
    reports.mkdir()
    slow = Finding("gpu_clock_slowdown", "warning", "gpu1", "HW power brake", "none", "gpu1 held by HW power brake 30% of the hour")
    rail = Finding("ib_port_errors", "error", "mlx5_1", "40/s", "0", "mlx5_1 symbol errors 40/s")
    other = Finding("gpu_xid", "error", "gpu3", "Xid 79", "none", "gpu3 fell off the bus")
    node1 = make_report(node={"hostname": "node1"}, findings=[slow, rail, other],
                        gpus=[make_gpu(0), make_gpu(1, processes=[GpuProcess(1005)], nearest_nics=["ib1"]), make_gpu(3)],
                        nics=[make_nic("ib1", kind="infiniband", rdma_device="mlx5_1")])
    node0 = make_report(node={"hostname": "node0"}, findings=[Finding("gpu_xid", "error", "gpu0", "Xid 48", "none", "DBE")])
    for name, report in (("node1", node1), ("node0", node0)):
        (reports / f"{name}.json").write_text(json.dumps(report.to_dict()))
    result = cli("nccl-job", str(tmp_path / "job"), "--reports", str(reports), "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    (named,) = json.loads(result.stdout)["named"]
    assert [b.split(":")[0] + ": " + b.split(": ", 1)[1].split(" ")[0] for b in named["because"]] == [
        "node1 gpu1 (rails ib1): ib_port_errors", "node1 gpu1 (rails ib1): gpu_clock_slowdown"]
    shown = cli("nccl-job", str(tmp_path / "job"), "--reports", str(tmp_path / "job"))  # no Report there
    assert "because no Report of node1 among those given" in shown.stdout


def test_verbose_start_times_name_the_late_rank_even_when_timed_on_the_cpu(tmp_path):
    """CPU-timed records hold no wait, but the late rank still calls each collective last: its start is the latest.
    Between hosts that only holds when their clocks agree (RAS's verbose travel times say so)."""
    from nodecheck.job.starts import late_by_start

    (tmp_path / "a").mkdir()
    ops = ops_of(job(tmp_path / "a", late=5, timing="collective_cpu", skew_us={}))
    verdict = judge_job(ops)
    late_by_start(ops, None, verdict)
    (named,) = verdict.named
    assert (named.why, named.rank, named.host) == ("late", 5, "node1") and "started latest of its host in 100%" in named.message
    assert 3900 < named.lead_us < 4300 and "only between ranks of one host" in verdict.notes[-1]


def test_start_times_across_hosts_only_with_agreeing_clocks(tmp_path):
    """One rank a host: a host's clock 30 ms ahead makes its rank start 'latest' every time; compared across hosts
    only when RAS says the clocks agree, and then the truly late rank is named."""
    from nodecheck.job.starts import late_by_start

    (tmp_path / "skewed").mkdir()
    (tmp_path / "synced").mkdir()
    skewed = ops_of(job(tmp_path / "skewed", hosts=8, per_host=1, late=3, timing="collective_cpu", skew_us={6: 30000}))
    for clocks in (None, "not synchronized"):
        verdict = JobVerdict()
        late_by_start(skewed, clocks, verdict)
        assert verdict.named == []  # one rank a host: nothing to compare within a host
    synced = ops_of(job(tmp_path / "synced", hosts=8, per_host=1, late=3, timing="collective_cpu", skew_us={}))
    verdict = JobVerdict()
    late_by_start(synced, "synchronized", verdict)
    assert [(n.rank, n.host) for n in verdict.named] == [(3, "node3")] and "across hosts" in verdict.notes[0]


def test_kernel_and_start_rules_agree_on_one_entry(tmp_path):
    from nodecheck.job.starts import late_by_start

    ops = ops_of(job(tmp_path, late=2, skew_us={}))
    verdict = judge_job(ops)
    late_by_start(ops, None, verdict)
    (named,) = verdict.named
    assert named.rank == 2 and "shortest" not in named.message and "; its collectives started latest of its host" in named.message


def test_the_command_takes_rass_word_on_the_clocks(tmp_path):
    from helpers import REPO

    (tmp_path / "job").mkdir()
    job(tmp_path / "job", hosts=8, per_host=1, late=3, timing="collective_cpu", skew_us={})
    head = (REPO / "tests/fixtures/nccl-ras/nccl1730-256-ranks-ok.txt").read_text()
    travel = " Travel times (valid only if system clocks are synchronized between nodes):\n  Minimum {}s, maximum 0.002s, average 0.001s\n"
    result = cli("nccl-job", str(tmp_path / "job"))
    assert result.returncode == 0, result.stdout  # no RAS word on the clocks, one rank a host: nobody
    (tmp_path / "skewed.txt").write_text(head + travel.format("-0.013"))
    assert cli("nccl-job", str(tmp_path / "job"), str(tmp_path / "skewed.txt")).returncode == 0
    (tmp_path / "synced.txt").write_text(head + travel.format("0.000"))
    result = cli("nccl-job", str(tmp_path / "job"), str(tmp_path / "synced.txt"))
    assert result.returncode == 1 and "late: rank 3 (node3" in result.stdout, result.stdout
