"""NCCL RAS's JSON reports (`ncclras -f json`, src/nodecheck/job/ras_json.py) judged by the same rules as the text
form (job/stuck.py): NVIDIA's published sample (the user guide's "JSON Output" and "Monitoring Mode",
tests/fixtures/nccl-ras/SOURCES.md) as printed, and jobs derived from it by changing what RAS would have seen: more
ranks, one left behind, one holding an error. The verbose text form's clock warning is read for job/ranks.py."""

import copy
import json

import pytest
from helpers import REPO, cli

from nodecheck.core.errors import ParseError
from nodecheck.job.ras import parse_ras
from nodecheck.job.ras_json import is_ras_json, parse_ras_json
from nodecheck.job.stuck import judge_ras

RAS = REPO / "tests/fixtures/nccl-ras"
GUIDE = RAS / "nccl-guide-2.29.1-json-missing-rank.json"
EVENT = RAS / "nccl-guide-2.29-monitor-peer-dead.json"


def test_nvidias_sample_names_the_unresponsive_rank_with_its_gpu():
    (report,) = parse_ras_json(GUIDE.read_text())
    assert (report.version, report.timestamp, report.statuses) == ("2.29.1", "2025-12-19 13:06:53", ["INCOMPLETE"])
    named, notes = judge_ras([report])
    assert [(n.why, n.host, n.pid, n.rank, n.gpu) for n in named] == [("missing", "172.16.64.245", 1524345, 1, "1")]
    assert "unresponsive" in named[0].message and notes == []


def test_the_monitor_event_after_it_says_dead():
    reports = parse_ras_json(GUIDE.read_text() + EVENT.read_text())
    assert len(reports) == 1  # an event joins the query before it
    (entry,) = judge_ras(reports)[0]
    assert (entry.rank, entry.pid) == (1, 1524345) and "considered dead" in entry.message
    (alone,) = parse_ras_json(EVENT.read_text())[0].missing_processes
    assert (alone.pid, alone.node, alone.gpu, alone.status) == (1524345, "172.16.64.245", "1", "dead")


def job(counts: dict[int, int], errors: dict[int, int] | None = None) -> str:
    """The guide's document as RAS would print it for len(counts) ranks on two nodes, none missing, each rank at
    counts[rank] AllReduce operations; errors: rank -> its async_error."""
    document = json.loads(GUIDE.read_text())
    comm = document["communicators"][0]
    template = comm["ranks"][0]
    comm["ranks"], comm["missing_ranks"] = [], []
    comm["size"] = comm["ranks_count"] = len(counts)
    comm["missing_ranks_count"] = 0
    for rank, count in counts.items():
        entry = copy.deepcopy(template)
        entry.update(rank=rank, pid=1524344 + rank, cuda_dev=rank % 4, nvml_dev=rank % 4, host=f"172.16.64.{245 + rank // 4}")
        entry["collective_counts"]["AllReduce"] = count
        entry["status"]["async_error"] = (errors or {}).get(rank, 0)
        comm["ranks"].append(entry)
    return json.dumps(document, indent=2) + "\n"


def test_a_rank_behind_in_two_queries_is_stuck_and_a_minority_ahead_names_nobody():
    behind = {rank: 120 for rank in range(8)} | {5: 117}
    named, notes = judge_ras(parse_ras_json(job(behind)))
    assert named == [] and "rank 5 (172.16.64.246, pid 1524349) 3 AllReduce operation(s) behind in one query" in notes[0]
    later = {rank: 140 for rank in range(8)} | {5: 117}
    named, _ = judge_ras(parse_ras_json(job(behind) + job(later)))
    assert [(n.why, n.rank, n.host, n.gpu) for n in named] == [("stuck", 5, "172.16.64.246", "1")]
    assert "by 3-23 AllReduce operation(s) in 2 queries" in named[0].message
    ahead = {rank: 640 for rank in range(8)} | {2: 641, 3: 641}
    named, notes = judge_ras(parse_ras_json(job(ahead) + job(ahead)))
    assert named == [] and "2 rank(s) of #0-0 ahead of the majority by 1 AllReduce" in notes[0]


def test_a_rank_holding_an_error_is_named_and_those_told_of_it_are_not():
    errors = {3: 2} | {rank: 6 for rank in (0, 1, 2, 4, 5, 6, 7)}  # ncclSystemError on rank 3, ncclRemoteError elsewhere
    named, notes = judge_ras(parse_ras_json(job({rank: 50 for rank in range(8)}, errors)))
    assert [(n.why, n.rank, n.pid) for n in named] == [("error", 3, 1524347)]
    assert "ncclSystemError" in named[0].message
    assert "7 rank(s) hold ncclRemoteError" in notes[0]
    healthy = judge_ras(parse_ras_json(job({rank: 50 for rank in range(8)})))
    assert healthy == ([], [])


def test_several_documents_a_cut_one_and_garbage():
    text = job({0: 1, 1: 1}) + job({0: 2, 1: 2})
    assert len(parse_ras_json(text)) == 2
    cut = parse_ras_json(text + job({0: 3, 1: 3})[:200])
    assert len(cut) == 2 and cut[-1].ends_early
    for bad in ("hello", "{", "[1, 2]", '{"nccl_version": 1}', "{" * 100_000):
        with pytest.raises(ParseError):
            parse_ras_json(bad)
    hostile = json.loads(job({0: 1}))
    hostile["communicators"] = [{"hash": 7, "ranks": [{"rank": -1}, "x", {"rank": 0, "host": 5, "pid": 1}], "missing_ranks": {}}] * 3
    assert parse_ras_json(json.dumps(hostile))[0].comms == []
    assert is_ras_json(GUIDE.read_text()) and is_ras_json(EVENT.read_text())
    assert not is_ras_json('{"header": {}, "metadata": {}, "coll_perf": {}}\n')


def test_the_verbose_text_forms_clock_warning():
    head = (RAS / "nccl1911-mismatch-minority-ahead.txt").read_text()
    synced = head + " Travel times (valid only if system clocks are synchronized between nodes):\n  Minimum 0.000s, maximum 0.002s, average 0.001s\n"
    assert parse_ras(synced)[0].clocks == "synchronized"
    skewed = synced + (" Warning: negative travel times were observed across 2 connections,\n"
                       " indicating that the system clocks are *not* synchronized.\n")
    assert parse_ras(skewed)[0].clocks == "not synchronized"
    assert parse_ras(head)[0].clocks is None


def test_the_command_reads_json_queries(tmp_path):
    (tmp_path / "q1.json").write_text(job({rank: 120 for rank in range(8)} | {5: 117}))
    (tmp_path / "q2.json").write_text(job({rank: 130 for rank in range(8)} | {5: 117}))
    result = cli("nccl-job", str(tmp_path / "q1.json"), str(tmp_path / "q2.json"))
    assert result.returncode == 1 and "stuck: rank 5 (172.16.64.246, pid 1524349)" in result.stdout
    result = cli("nccl-job", str(GUIDE), "--json")
    assert result.returncode == 1 and json.loads(result.stdout)["named"][0]["why"] == "missing"
    (tmp_path / "bad.json").write_text('{"nccl_version": "2.29.1", "communicators": [')
    result = cli("nccl-job", str(tmp_path / "bad.json"))
    assert result.returncode == 2 and "JSON breaks" in result.stderr
