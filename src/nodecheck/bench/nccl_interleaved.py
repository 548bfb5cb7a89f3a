"""nccl-tests rows that NCCL's own debug output split.

nccl-tests writes a result row in three pieces with `printf` and no newline between them (src/util.cu:
writeBenchmarkLinePreamble, then each half's time, algbw, busbw and #wrong after it ran), and NCCL writes its
debug records to the same stdout (src/debug.cc: ncclDebugFile = stdout). With NCCL_DEBUG=INFO the records a
collective prints (NCCL_DEBUG_SUBSYS=TUNING's "8 Bytes -> Algo 0 proto 0", COLL's "AllReduce: opCount", a lazy
connection's channels) land between the pieces: "       8    2  float  sum  -1host:497888:497888 [0] NCCL INFO ...",
then "   64.18  0.00  0.00  0host:..." (nccl#1453, with MPICH's "[0]" between them). The row is read whole again from
its pieces; NCCL's part of such a line is NCCL's record, its host without the table cell glued before it.
"""

from __future__ import annotations

import re

# MPICH's and Intel MPI's -prepend-rank: "[0]" before each write, so mid-line too ("-1[0]    1626.5": nccl#1453)
RANK_TAG = re.compile(r"\[\d{1,7}\]")
_LEVEL = re.compile(r"\bNCCL (?:INFO|WARN)\b")
# NCCL's head before the level, read backwards from it: "[dev] " (optional), "tid:pid:" and the host (reversed)
_HEAD_REVERSED = re.compile(r"\s{1,8}(?:\]\d{1,5}\[\s{1,8})?\d{1,10}:\d{1,10}:(?P<host>[\w.-]{0,255})")
_LINE_HEAD = re.compile(r"\s{0,64}(?:\[\d{1,7}\]\s{0,8})?[\w.-]{0,255}:\d{1,10}:\d{1,10}\s")  # a record from the start
# a table cell glued to the host: root "-1" or #wrong "0" before a name that starts with a letter
_GLUED_CELL = re.compile(r"(-?\d{1,19})(?=[A-Za-z_])")
_TABLE_START = re.compile(r"\s*(?:\[\d{1,7}\]\s*)?[\d-]")  # a row's start or a tail: a number first (after MPICH's tag)
_ROW_HEAD = re.compile(r"\d{1,19} \d{1,19} [A-Za-z_]\w{0,30}")  # size, count, type
_NUMBER = re.compile(r"-?(?:\d{1,19}(?:\.\d{0,19})?|\.\d{1,19})(?:[eE][+-]?\d{1,4})?")
_LOOK_BACK = 300  # a head is at most host (255) + pid, tid and device
_MAX_LEVELS_TRIED = 4
_FEWEST_CELLS = 4  # a half's time, algbw, busbw and #wrong; a row's start has five


def split_record(line: str) -> tuple[str, str] | None:
    """(the table's text, NCCL's record) of a line where an nccl-tests row or tail runs into an NCCL debug record;
    None for any other line (a record of its own, a row, anything else)."""
    if "NCCL " not in line or not _TABLE_START.match(line) or _LINE_HEAD.match(line):
        return None
    for tried, level in enumerate(_LEVEL.finditer(line)):
        if tried == _MAX_LEVELS_TRIED:
            break
        window = line[max(0, level.start() - _LOOK_BACK):level.start()]
        head = _HEAD_REVERSED.match(window[::-1])
        if head is None:
            continue
        start = level.start() - head.end()
        table, record = line[:start], line[start:]
        if _is_piece(_tokens(table)):
            return table, record
        if table.endswith("N/") and record.startswith("A"):  # "N/Ah100clust-worker-1": an unchecked half's #wrong
            table, record = table + "A", record[1:]
        elif glued := _GLUED_CELL.match(record):  # "-1h100clust-worker-1:...": the root's cell, then the host
            table, record = table + glued[1], record[glued.end():]
        else:
            continue
        if _is_piece(_tokens(table)):
            return table, record
    return None


def is_tail(text: str) -> bool:
    """A piece of a row after its start: time, algbw, busbw and #wrong cells only (N/A where not checked)."""
    tokens = _tokens(text)
    return bool(tokens) and all(_is_cell(t) for t in tokens)


def _is_piece(tokens: list[str]) -> bool:
    """A row's start (size, count, type, then at most redop and root, and maybe a half) or its figures; a stamp
    before a record is one or two tokens, a record's own text is words."""
    if len(tokens) < _FEWEST_CELLS or not _is_cell(tokens[-1]):
        return False
    if _ROW_HEAD.fullmatch(" ".join(tokens[:3])):
        return all(_is_cell(t) for t in tokens[5:])
    return all(_is_cell(t) for t in tokens)


def _tokens(text: str) -> list[str]:
    return RANK_TAG.sub(" ", text).split()


def _is_cell(cell: str) -> bool:
    return cell == "N/A" or _NUMBER.fullmatch(cell) is not None
