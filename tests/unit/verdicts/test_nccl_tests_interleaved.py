"""nccl-tests rows that NCCL's debug records split: nccl-tests writes a row in three pieces without a newline between
them (src/util.cu writeBenchmarkLinePreamble, then each half), NCCL writes its records to the same stdout, so with
NCCL_DEBUG=INFO a record runs on from each piece (NVIDIA/nccl#1453: MPICH's "[0]" before every write). The row is read
whole again; a record's host is read without the table cell glued before it."""

import json

import pytest
from helpers import REPO, nodecheck
from nccl_split_rows import HOST, SPLIT_ROWS, pieces, records, split_log, whole_rows

from nodecheck.bench.nccl_debug import parse_nccl_debug
from nodecheck.bench.nccl_interleaved import split_record
from nodecheck.bench.nccl_tests import parse_nccl_log
from nodecheck.core.errors import ParseError

HGX = REPO / "examples" / "hgx-h100-8gpu"


@pytest.mark.parametrize("tagged", [True, False], ids=["mpich-rank-tags", "glued"])
def test_rows_split_by_records_read_as_the_same_rows(tagged):
    """Every whole row of nccl#1453's turn 0, split at its writes with turn 2's real records: the same rows, the same
    figures, and no line left unread; NCCL's debug reader sees one host, not '-1h100clust-worker-1' beside it."""
    whole = parse_nccl_log("\n".join(whole_rows()))
    split_text = split_log(tagged)
    split = parse_nccl_log(split_text)
    assert split.rows == whole.rows and len(split.rows) == 10
    assert split.issues == [] and split.split_rows == 0
    assert split.peak_busbw_gbytes == whole.peak_busbw_gbytes == 29.5
    run = parse_nccl_debug(split_text)
    assert run.nodes == [HOST]
    assert run.nccl_lines == len(split_text.splitlines()) - 10  # every line but each row's last piece is a record


def test_a_log_whose_every_row_was_cut_between_its_pieces_says_so():
    """Turn 2 as stored: five cuts of one log, each row's start and one of its tails in different cuts. The parser
    says the rows were split and cut, not 'is this an nccl-tests log?', and the CLI refuses it with that reason."""
    with pytest.raises(ParseError, match=r"4 result row\(s\) split by NCCL's debug records.*NCCL_DEBUG_FILE"):
        parse_nccl_log(SPLIT_ROWS.read_text())
    result = nodecheck("bench", "--nccl-log", str(SPLIT_ROWS), "--from", str(HGX))
    assert result.returncode == 2 and "split by NCCL's debug records" in result.stderr, result.stderr
    said = json.loads(nodecheck("nccl-log", str(SPLIT_ROWS), "--from", str(HGX), "--json").stdout)
    assert said["nccl"]["nodes"] == [HOST]


def test_a_row_split_once_then_cut_is_said_and_others_are_read():
    """A row whose start came but not its figures is listed by line; the whole rows around it still count."""
    lines = whole_rows()[:3]
    start = pieces(lines[1])[0] + records(0)[0]
    log = parse_nccl_log("\n".join([lines[0], start, *records(0)[:2], lines[2]]))
    assert [r.size_bytes for r in log.rows] == [1048576, 4194304]
    assert log.split_rows == 1 and log.issues[0].startswith("line 2: a result row NCCL's debug records split")


@pytest.mark.parametrize("line", [
    f"{HOST}:497888:497888 [0] NCCL INFO 8 Bytes -> Algo 0 proto 0 time 25.200924",  # a record of its own
    "[0] 1048576 262144 float sum -1[0] 1626.5 0.64 1.24 0[0] 2302.3 0.46 0.87 0",  # a whole row
    "12:00:01 NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",  # a record after a time of day
    "2 nodes NCCL INFO said in prose",
    f"1718000000123 {HOST}:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",  # a record after epoch ms
])
def test_lines_that_are_not_a_row_run_into_a_record_are_left_alone(line):
    assert split_record(line) is None


def test_a_glued_host_loses_only_the_cell_before_it():
    table, record = split_record(f"   8   2   float   sum   -1{HOST}:497888:497888 [0] NCCL INFO 8 Bytes")
    assert table.split()[-1] == "-1" and record.startswith(f"{HOST}:497888")
    table, record = split_record(f"    64.18    0.00    0.00    N/A{HOST}:1:2 [3] NCCL WARN x")
    assert table.split() == ["64.18", "0.00", "0.00", "N/A"] and record.startswith(HOST)
