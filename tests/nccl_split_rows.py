"""nccl-tests rows as NCCL_DEBUG=INFO splits them, made from real rows and real records: nccl#1453's turn 0 (whole
rows, MPICH's "[0]" before each of nccl-tests' three writes) and its turn 2 (NCCL_DEBUG_SUBSYS=TUNING's records).
nccl-tests writes a row without a newline between its writes (src/util.cu), NCCL its records to the same stdout."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "nccl-tests"
WHOLE_ROWS = FIXTURES / "nccl1453-24-h100-mpich-prepend-rank-slow.txt"  # turn 0: rows without records between pieces
SPLIT_ROWS = FIXTURES / "nccl1453-turn2-tuning-records-split-every-row.txt"  # turn 2: NCCL_DEBUG_SUBSYS=TUNING
HOST = "h100clust-worker-1"


def records(size: int) -> list[str]:
    """The real TUNING records of turn 2 that name this size's algorithm, or its 8-byte ones."""
    lines = [line for line in SPLIT_ROWS.read_text().splitlines() if line.startswith(f"[0] {HOST}:")]
    return [line for line in lines if f" INFO {size} Bytes" in line] or [line for line in lines if " INFO 8 Bytes" in line]


def pieces(row_line: str) -> list[str]:
    """nccl-tests' three writes of a row, each after MPICH's "[0]"."""
    found = [p for p in re.split(r"(?=\[0\])", row_line) if p]
    assert len(found) == 3, row_line
    return found


def split_as_nccl_tests_writes(row_line: str, tagged: bool) -> list[str]:
    """A whole row of turn 0 as nccl-tests and NCCL write it: a record runs on from each of the first two writes
    (glued to it without MPICH's tags), then more records, then the last write."""
    size = int(pieces(row_line)[0].split()[1])
    lines = []
    for piece in pieces(row_line)[:2]:
        head = records(size)[0] if tagged else records(size)[0].removeprefix("[0] ")
        lines.append((piece if tagged else piece.removeprefix("[0]")) + head)
        lines.extend(r if tagged else r.removeprefix("[0] ") for r in records(size)[:3])
    lines.append(pieces(row_line)[2] if tagged else pieces(row_line)[2].removeprefix("[0]"))
    return lines


def whole_rows() -> list[str]:
    return WHOLE_ROWS.read_text().splitlines()[1:]  # line 1 is the tail of a row cut before the paste


def split_log(tagged: bool) -> str:
    return "\n".join(part for line in whole_rows() for part in split_as_nccl_tests_writes(line, tagged))
