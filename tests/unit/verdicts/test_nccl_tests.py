"""nccl-tests logs: the real published logs (answer key), truncated and garbled ones, the -J JSON report."""

import json

import pytest
from helpers import PUBLIC, answer_key, json_report, make_gpu, make_report, need, nodecheck
from hypothesis import given, settings
from hypothesis import strategies as st

from nodecheck.bench.nccl_tests import parse_nccl_log
from nodecheck.core.errors import ParseError

KEY = answer_key("nccl") if (PUBLIC / "nccl" / "EXPECTED.json").exists() else {}


@pytest.mark.parametrize("name", sorted(KEY) or ["(captures absent)"])
def test_public_logs_match_answer_key(name):
    expected = KEY.get(name) or pytest.skip("../shared/captures/public/nccl is absent")
    log = parse_nccl_log(need(PUBLIC / "nccl" / name).read_text())
    largest = max(log.rows, key=lambda r: r.size_bytes)
    assert len(log.rows) == expected["rows"]
    # the only thing not read is where the person who posted the log cut it ("...")
    assert all("lines were cut from the log here" in issue for issue in log.issues)
    assert bool(log.issues) == any(line.strip() == "..." for line in (PUBLIC / "nccl" / name).read_text().splitlines())
    assert log.peak_busbw_gbytes == max(r.out_of_place.busbw_gbytes for r in log.rows if r.out_of_place)
    assert log.avg_busbw_gbytes == expected["avg_busbw_GBps"]
    assert (largest.size_bytes, largest.out_of_place.busbw_gbytes) == (
        expected["largest_size_bytes"], expected["largest_size_busbw_oop_GBps"])
    assert all(r.in_place is not None for r in log.rows)


@pytest.mark.parametrize("name", sorted(KEY) or ["(captures absent)"])
def test_public_logs_behind_kubectls_time_stamps_read_the_same(name):
    """`kubectl logs --timestamps` (an MPIJob's launcher pod) and `docker logs -t` put an RFC 3339 time before every
    line, before mpirun's or srun's own prefix where the log has one: every log reads as it does without."""
    KEY.get(name) or pytest.skip("../shared/captures/public/nccl is absent")
    text = need(PUBLIC / "nccl" / name).read_text()
    stamped = "\n".join(f"2026-08-10T10:37:28.{i:09d}Z {line}" for i, line in enumerate(text.splitlines()))
    plain, read = parse_nccl_log(text), parse_nccl_log(stamped)
    assert (read.rows, read.peak_busbw_gbytes, read.avg_busbw_gbytes, read.devices) == (
        plain.rows, plain.peak_busbw_gbytes, plain.avg_busbw_gbytes, plain.devices)


def test_layouts_of_other_collectives():
    gather = parse_nccl_log(need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-all_gather_perf.txt").read_text())
    assert gather.ngpus == 8 and len(gather.devices) == 8 and gather.rows[-1].redop is None
    assert (gather.ranks, gather.hosts) == (8, ["localhost"])  # what tells a log of one node from one across nodes
    assert gather.rows[-1].out_of_place.wrong is None  # "N/A": not validated
    alltoall = parse_nccl_log(need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-alltoall_perf.txt").read_text())
    assert (alltoall.rows[-1].dtype, alltoall.rows[-1].redop, alltoall.rows[-1].in_place.busbw_gbytes) == ("float", None, 226.16)
    reduce = parse_nccl_log(need(PUBLIC / "nccl" / "tinybox-6x-rtx4090-p2p-patched-all_reduce_perf-single-size.txt").read_text())
    assert (reduce.rows[0].redop, reduce.rows[0].root) == ("sum", -1)
    assert reduce.devices[0] == "rank 0 tiny14 device 0: NVIDIA GeForce RTX 4090"


def test_truncated_and_garbled_logs_keep_what_was_read(tmp_path):
    text = need(PUBLIC / "nccl" / "aws-batch-p5-all_reduce_perf-mpirun-tagged.txt").read_text()
    lines = text.splitlines()
    cut = "\n".join(lines[:20] + [lines[20][:60], "\x00\x07 garbage \ufffd", lines[21][: len(lines[21]) - 30]])
    log = parse_nccl_log(cut)
    assert len(log.rows) == 17 + 1 and log.avg_busbw_gbytes is None
    assert log.rows[-1].in_place is None
    assert len(log.issues) == 3 and "unreadable result row" in log.issues[0] and "in-place columns missing" in log.issues[1]
    assert log.issues[2].startswith("1 line(s) neither a result row") and "line 22" in log.issues[2]  # the garbage, said


def test_in_place_only_rows():
    text = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
            "     2097152        524288     float     sum      -1" + " " * 32 + "    43.39   48.34   84.59      0\n")
    (row,) = parse_nccl_log(text).rows
    assert row.out_of_place is None and row.in_place.busbw_gbytes == 84.59


def test_json_report():
    row = {"size": 1073741824, "count": 268435456, "type": "float", "redop": "sum", "root": "    -1",
           "out_of_place": {"time": 4253.0, "alg_bw": 252.47, "bus_bw": 441.81, "nwrong": 0.0},
           "in_place": {"time": 4255.4, "alg_bw": 252.33, "bus_bw": 441.57, "nwrong": None},
           "actual_iterations": 20, "experiment_name": "AllReduce"}
    log = parse_nccl_log(json_report([row, {"size": "?"}]))
    assert (log.format, log.ngpus, log.collective, log.avg_busbw_gbytes) == ("json", 8, "AllReduce", 156.742)
    assert (log.ranks, log.hosts) == (1, ["n1"])
    assert log.rows[0].out_of_place.busbw_gbytes == 441.81 and log.rows[0].in_place.wrong is None and log.rows[0].root == -1
    assert log.issues == ["results[1]: unreadable result \"{'size': '?'}\""]
    with pytest.raises(ParseError, match="not valid JSON"):
        parse_nccl_log(json_report([row])[:300])


@pytest.mark.parametrize("text", ["", "hello\n", "# nThread 1 nGpus 8\n#\n", "{}", "[1, 2]"])
def test_not_a_log(text):
    with pytest.raises(ParseError):
        parse_nccl_log(text)


def test_cli_reads_a_saved_log(tmp_path):
    name = "aws-2x-p4de-all_reduce_perf-srun-prefixed-noavg.txt"
    result = nodecheck("bench", "--nccl-log", str(need(PUBLIC / "nccl" / name)), "--json")
    assert result.returncode == 0, result.stderr
    log = json.loads(result.stdout)["nccl_log"]
    assert len(log["rows"]) == 29 and log["avg_busbw_gbytes"] is None
    human = nodecheck("bench", "--nccl-log", str(PUBLIC / "nccl" / name))
    assert "Avg bus bandwidth: not in the log" in human.stdout and "2147483648" in human.stdout
    (tmp_path / "junk").write_text("Segmentation fault (core dumped)\n")
    bad = nodecheck("bench", "--nccl-log", str(tmp_path / "junk"))
    assert bad.returncode == 2 and "is this an nccl-tests log?" in bad.stderr


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["[1,0]<stdout>:", "0: ", "   8 ", "  2 ", " float ", " sum ", " -1 ", " 12.9 ", " 0.00 ",
                                 " N/A ", " 1e+04 ", "nan ", "\n", "# Avg bus bandwidth : ", "{", '"results": [', "]}"]),
                max_size=40))
def test_fuzz_log_shaped_noise(parts):
    try:
        parse_nccl_log("".join(parts))
    except ParseError:
        pass


def test_the_full_sweep_fits_the_smallest_gpu():
    from nodecheck.bench.nccl_binary import full_sweep_end

    def node(*memory):
        return make_report(gpus=[make_gpu(i, memory_bytes=m) for i, m in enumerate(memory)])

    assert full_sweep_end(node(None, None)) == "8G"  # NVML did not say: nccl-tests' own limit stands
    assert full_sweep_end(node(85520809984)) == "8G"  # an 80 GB H100 (81559 MiB, as NVML read it there)
    assert full_sweep_end(node(85520809984, 17179869184)) == "4G"  # a 16 GiB GPU beside it bounds the node
    assert full_sweep_end(node(2 << 30)) == "512M"


def test_lines_that_are_not_the_table_are_said():
    text = need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-all_reduce_perf.txt").read_text()
    noisy = "Warning: Permanently added 'node2' to the list of known hosts.\n" + text + \
        "node1:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 8 - Destroy COMPLETE\n"
    log = parse_nccl_log(noisy)
    (issue,) = log.issues  # NCCL's own debug line is not an issue: nccl-log reads those
    assert issue.startswith("1 line(s) neither a result row") and "Permanently added" in issue
