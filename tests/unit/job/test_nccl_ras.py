"""NCCL RAS's text reports read (src/nodecheck/job/ras.py) and stuck or missing ranks named (job/stuck.py), on the
reports pasted in NVIDIA/nccl issues (tests/fixtures/nccl-ras/SOURCES.md), each with the answer its thread gives, and
on mutations of them: the same report taken twice with a rank left behind."""

import pytest
from helpers import REPO, cli

from nodecheck.core.errors import ParseError
from nodecheck.job.ras import client_error, parse_ras
from nodecheck.job.stuck import judge_ras

RAS = REPO / "tests/fixtures/nccl-ras"


def test_a_healthy_256_rank_report_reads_ok_and_names_nobody():
    """nccl#1730: RUNNING, OK while PyTorch's watchdog timed out: RAS saw no fault, and nodecheck says none."""
    (report,) = parse_ras((RAS / "nccl1730-256-ranks-ok.txt").read_text())
    assert (report.version, report.statuses, report.comms, report.missing_processes) == ("2.26.2", ["RUNNING", "OK"], [], [])
    assert judge_ras([report]) == ([], [])


def test_a_minority_ahead_names_nobody():
    """nccl#1911: 30 ranks at AllGather 640, ranks 12 and 13 at 641: RAS lists the two, who are not stragglers."""
    (report,) = parse_ras((RAS / "nccl1911-mismatch-minority-ahead.txt").read_text())
    (comm,) = report.comms
    assert (comm.comm_id, comm.errors, comm.coll) == ("fa93daea854b060b", ["MISMATCH"], "AllGather")
    assert [(c.ranks, c.operation, [r.rank for r in c.listed]) for c in comm.counts] == [(30, 640, []), (2, 641, [12, 13])]
    assert comm.counts[1].listed[0].pid == 323032 and comm.counts[1].listed[0].node == "10.137.190.124"
    named, notes = judge_ras([report])
    assert named == [] and "ahead of the majority by 1 AllGather" in notes[0]


def test_a_process_that_sent_no_data_is_named_once_with_its_rank():
    """nccl#1762: process 60004 on 10.4.109.13 (GPU 0) missing, job-wide and as rank 1 of #0-0; the paste is cut
    inside a garbage rank's line (the RAS bug of that thread), which is said and not read."""
    (report,) = parse_ras((RAS / "nccl1762-incomplete-cut.txt").read_text())
    assert report.ends_early and "NOCOMM" in report.statuses
    named, _ = judge_ras([report])
    assert [(n.why, n.host, n.pid, n.rank) for n in named] == [("missing", "10.4.109.13", 60004, 1)]


def behind_by(lag: int) -> str:
    """nccl#1911's report with its minority left behind the majority instead of ahead."""
    text = (RAS / "nccl1911-mismatch-minority-ahead.txt").read_text()
    return text.replace("up to operation 641", f"up to operation {640 - lag}")


def test_a_rank_behind_in_two_queries_is_stuck_and_in_one_only_is_said():
    named, notes = judge_ras(parse_ras(behind_by(3)))
    assert named == [] and "3 AllGather operation(s) behind in one query" in notes[0]
    named, _ = judge_ras(parse_ras(behind_by(3) + "\n" + behind_by(5)))
    assert sorted((n.why, n.rank, n.pid) for n in named) == [("stuck", 12, 323032), ("stuck", 13, 323033)]
    assert "behind its communicator's majority by 3-5 AllGather operation(s) in 2 queries" in named[0].message
    assert judge_ras(parse_ras(behind_by(1) + "\n" + behind_by(1)))[0] == []  # one behind: a collective in flight


def test_column_widths_and_garbage_do_not_matter():
    widened = behind_by(3).replace("  Rank 12 -- GPU 4", "      Rank    12   --   GPU   4")
    assert [r.rank for r in parse_ras(widened)[0].comms[0].counts[1].listed] == [12, 13]
    with pytest.raises(ParseError):
        parse_ras("hello\n")
    parse_ras("NCCL version 2.26.2 compiled with CUDA 12.6\n" + "Rank 1 -- " * 100_000 + "\n#0-0 (zz) X\n" + "x" * (1 << 20))


def test_the_command_reads_ras_beside_inspector_and_exits_by_what_it_named(tmp_path):
    (tmp_path / "q1.txt").write_text(behind_by(4))
    (tmp_path / "q2.txt").write_text(behind_by(6))
    result = cli("nccl-job", str(tmp_path / "q1.txt"), str(tmp_path / "q2.txt"))
    assert result.returncode == 1 and "stuck: rank 12 (10.137.190.124, pid 323032)" in result.stdout
    assert cli("nccl-job", str(RAS / "nccl1911-mismatch-minority-ahead.txt")).returncode == 0


@pytest.mark.parametrize("name, missing", [
    ("healthy", []),
    ("degraded", [("10.194.132.77", 3467978, 6, "6")]),
    ("degraded_2node", [("10.245.40.180", 3534512, 3, "3")]),
])
def test_rccl_reports_from_live_mi300x_nodes_read_like_nccl_ones(name, missing):
    """ROCm's rcclras prints "RCCL version 2.28.3 compiled with ROCm ...": the same report; the answer keys are
    the INCOMPLETE sections of the captures (the process that sent no data, and its rank)."""
    text = (RAS / f"rccl2.28.3-mi300x-{name}.txt").read_text()
    (report,) = parse_ras(text)
    assert (report.library, report.version) == ("RCCL", "2.28.3")
    named, _ = judge_ras([report])
    assert [(n.host, n.pid, n.rank, n.gpu) for n in named] == missing
    result = cli("nccl-job", str(RAS / f"rccl2.28.3-mi300x-{name}.txt"))
    assert result.returncode == (1 if missing else 0) and "RCCL 2.28.3" in result.stdout


def test_a_failed_query_is_said_as_one_not_read_as_an_empty_report():
    """rcclras printing only its own perror ("read socket: Connection reset by peer") got no report: exit 2 and
    say so, never "no rank holds the job back"."""
    result = cli("nccl-job", str(RAS / "rccl2.28.3-mi300x-connection_reset.txt"))
    assert result.returncode == 2 and "client's own error \"read socket: Connection reset by peer\"" in result.stderr
    assert client_error("NCCL unexpectedly closed the connection\n") is not None
    assert client_error((RAS / "rccl2.28.3-mi300x-healthy.txt").read_text()) is None
    assert client_error("read socket: x\n" * 10) is None  # more than the client prints: not its message alone
