"""nccl-tests results (all_reduce_perf, all_gather_perf, alltoall_perf, ...): the text table, with
or without mpirun (`[1,0]<stdout>:`), srun (`0: `) or MPICH (`[0]`) line prefixes, and the `-J` JSON report.

A row is size, count, type, [redop], [root], then for out-of-place and in-place each: time (us),
algbw, busbw (GB/s) and #wrong (or N/A). alltoall leaves redop blank and old versions have no
root, so a row is read from both ends, never by column position. Lines that cannot be read are
listed in `issues`; whatever could be read is kept (a truncated log still gives its rows).

nccl-tests checks every result (`-c 1`, its default) and says so twice: per row, the count of wrong
elements summed over the ranks (`#wrong`; versions before 2.13 printed the largest relative
difference instead, `error`, where 1e-06 is float rounding, not a failure) and once per test,
"Out of bounds values : N OK|FAILED" (src/util.cu writeResultFooter; the first versions printed
it and the table's headings without '#'). Rows may carry four
per-iteration columns after each half (`-I 1`, nccl-tests 2.19: i_min i_max i_p99 i_cv%) and a
trailing timestamp (`-S 1`, 2.17: %Y-%m-%d %H:%M:%S).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nodecheck.bench.nccl_interleaved import RANK_TAG, is_tail, split_record
from nodecheck.core import typed_json
from nodecheck.core.errors import ParseError

_NCCL_DEBUG = re.compile(r" NCCL (?:INFO|WARN)\b")  # NCCL_DEBUG lines mixed into the output: nccl-log reads those
MAX_UNPARSED_SHOWN = 5
# mpirun --tag-output, srun -l, torchrun's --tee/--redirects ("[default0]:", "[rank12]:")
# `kubectl logs --timestamps` and `docker logs -t` add an RFC 3339 time before any of these
LAUNCHER_PREFIX = re.compile(r"^(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d) )?"
                             r"(?:\[\d+,\d+\]<std(?:out|err)>:|\d+: |\[(?:default|rank)\d{1,7}\]: ?)?")
# numbers of at most 19 digits (int64): a 5,000-digit "size" is no row (int() refuses past 4,300 digits)
_ROW_START = re.compile(r"^\s*(\d{1,19})\s+(\d{1,19})\s+([A-Za-z_][A-Za-z0-9_]*)\b(.*)$")
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_COLLECTIVE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_CONFIG = re.compile(r"^#?\s*nThread\s+(\d{1,9})\s+nGpus\s+(\d{1,9})")
_OUT_OF_BOUNDS = re.compile(r"^\s*(?:#\s*)?Out of bounds values\s*:\s*(\d{1,19})\s+(OK|FAILED)\b")
# the first versions printed the table's headings and footer without '#' (nccl-tests#37)
# and a paste outside a markdown code block loses every '#' (nccl-tests#249, nccl#583)
_BARE_HEADING = re.compile(r"^\s*(?:out-of-place\b|size\s+count\b|\(B\)\s|Avg bus bandwidth\s*:|nThread\s+\d|Using devices\s*$"
                           r"|Blocking Enabled\b|Rank\s+\d{1,9}\s.*\bdevice\s+\d)")
_TIMESTAMP = re.compile(r"\s\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")  # -S 1: a row's suffix (%Y-%m-%d %H:%M:%S)
_PID = re.compile(r"\bPid\s+(\d{1,10})\b")
DEVICE_LINE = re.compile(r"^#?\s*Rank\s+(\d{1,9})\b.*?\bon\s+(\S+)\s+device\s+(\d{1,9})\s+\[[^\]]*\]\s+(.+)$")


@dataclass
class Timing:
    time_us: float
    algbw_gbytes: float  # GB/s, 10^9 bytes
    busbw_gbytes: float
    wrong: float | None  # None when the run did not validate (N/A)


@dataclass
class Row:
    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out_of_place: Timing | None
    in_place: Timing | None
    partial: bool = False  # read from one half where the line was cut: without a root, its last cell may be a time


@dataclass
class NcclLog:
    format: str  # text or json
    collective: str | None
    nthreads: int | None
    ngpus: int | None
    devices: list[str]  # "rank 0 host device 0: NVIDIA H100 80GB HBM3"
    rows: list[Row]
    avg_busbw_gbytes: float | None
    issues: list[str] = field(default_factory=list)  # what could not be read, with line numbers
    peak_busbw_gbytes: float | None = None  # the largest out-of-place busbw of any row: the figure people compare
    ranks: int | None = None  # the highest rank a device line names, plus one: the job had at least that many
    hosts: list[str] = field(default_factory=list)  # the distinct hosts of the device lines, in order
    out_of_bounds: int | None = None  # "Out of bounds values : N": results nccl-tests' check failed, over its tests
    check_column: str | None = None  # "#wrong" (a count of wrong elements) or "error" (before 2.13: a difference)
    columns_per_half: int = 4  # 8 with per-iteration columns (-I 1)
    # only process 0 of a run prints (src/util.cu: PRINT is `if (is_main_thread)`), one '# nThread' header and one footer,
    # and it numbers the ranks across every process (rank = proc x nThreads x nGpus + i): a second header, footer or
    # owner of a rank is a second run
    headers: int = 0
    footers: int = 0
    repeated_rank: str | None = None  # "rank 0 on node3 (pid 1530412) and on node2 (pid 2236260)"
    split_rows: int = 0  # rows NCCL's debug records split that never came whole


def parse_nccl_log(text: str) -> NcclLog:
    """Parse either form. Raises ParseError when nothing at all could be read."""
    if text.lstrip().startswith("{"):
        return _parse_json(text)
    log = NcclLog("text", None, None, None, [], [], None)
    unparsed: list[str] = []
    owners: dict[int, str] = {}  # rank -> the host and pid of its first device line
    pending: _Pending | None = None  # a row whose pieces NCCL's debug records split, read once whole
    for number, raw in enumerate(text.splitlines(), start=1):
        line = LAUNCHER_PREFIX.sub("", raw.rstrip("\r"), count=1)
        split = split_record(line)
        if split:
            line = split[0]
        if tag := RANK_TAG.match(line):
            line = line.replace(tag[0], " ")
        if pending is not None:
            if is_tail(_without_timestamp(line)):
                pending.text += " " + line
                pending.split, pending.pieces = pending.split or bool(split), pending.pieces + 1
                if _read(pending, log.columns_per_half) or pending.pieces == _MAX_PIECES:
                    _take_row(log, pending)
                    pending = None
                continue
            if not line.strip() or (not split and _NCCL_DEBUG.search(line)):
                continue  # NCCL's own records between a row's pieces
            _take_row(log, pending)
            pending = None
        if bounds := _OUT_OF_BOUNDS.match(line):
            log.out_of_bounds = (log.out_of_bounds or 0) + int(bounds[1])
        elif line.lstrip().startswith("#") or _BARE_HEADING.match(line):
            _header_line(log, line.strip(), owners)
        elif _ROW_START.match(_without_timestamp(line)):
            pending = _Pending(number, line, bool(split))
            if _read(pending, log.columns_per_half):
                _take_row(log, pending)
                pending = None
        elif line.strip() in ("...", "[...]", "…"):
            log.issues.append(f"line {number}: '{line.strip()}': lines were cut from the log here (rows may be missing)")
        elif line.strip() and not _NCCL_DEBUG.search(line):
            unparsed.append(f"line {number}: {line.strip()[:100]!r}")
    if pending is not None:
        _take_row(log, pending)
    if unparsed:
        log.issues.append(f"{len(unparsed)} line(s) neither a result row, a '#' line nor NCCL's own, not read: "
                          + "; ".join(unparsed[:MAX_UNPARSED_SHOWN]) + ("; ..." if len(unparsed) > MAX_UNPARSED_SHOWN else ""))
    if not log.rows and log.avg_busbw_gbytes is None:
        if log.split_rows:
            raise ParseError(f"{log.split_rows} result row(s) split by NCCL's debug records (NCCL_DEBUG=INFO writes them "
                             "to nccl-tests' stdout), and no row came whole: the log was cut between a row's pieces. Give "
                             "the whole log, or send NCCL's records to a file of their own (NCCL_DEBUG_FILE)")
        if log.headers or log.devices:
            runs = separate_runs(log)
            raise ParseError("an nccl-tests header without result rows (cut before its table?)" + (f"; {runs}" if runs else ""))
        raise ParseError("no nccl-tests result rows and no 'Avg bus bandwidth' line: is this an nccl-tests log?")
    return _with_peak(log)


@dataclass
class _Pending:
    number: int  # the line the row starts on
    text: str  # its pieces so far
    split: bool  # NCCL's debug records came between them
    pieces: int = 1
    read: tuple = (None, None)  # (row, note) as its pieces so far read


_MAX_PIECES = 3  # the start, then each half's figures: nccl-tests writes no more (a 4th is another row's)


def _read(pending: _Pending, width: int) -> bool:
    """Read the pending row's pieces so far (kept in `pending.read`); whether they make a whole row: both halves, or an
    in-place half that nccl-tests padded on purpose."""
    start = _ROW_START.match(_without_timestamp(pending.text))
    pending.read = _row(start, width) if start else (None, None)
    return pending.read[0] is not None and pending.read[1] is None


def _take_row(log: NcclLog, pending: _Pending) -> None:
    """Keep the row as its pieces read, or say why it cannot be read."""
    row, note = pending.read
    where = f"line {pending.number}"
    if row is None:
        if pending.split:
            log.split_rows += 1
            log.issues.append(f"{where}: a result row NCCL's debug records split, whose figures never followed (cut?): "
                              f"{pending.text.strip()[:100]!r}")
        else:
            log.issues.append(f"{where}: unreadable result row: {pending.text.strip()[:100]!r}")
        return
    log.rows.append(row)
    if note:
        log.issues.append(f"{where}: {note}")


def separate_runs(log: NcclLog) -> str | None:
    """Why the log holds more than one nccl-tests run, or None: each process of an nccl-tests built without MPI=1
    runs a whole test of its own under mpirun or srun, as its own rank 0 (sjeaugey in nccl-tests#182, kwen2501 in
    nccl-tests#27), and pasted runs stack the same way. Their rows are no one job's: not judged together."""
    said = [f"{n} {what}" for n, what in ((log.headers, "'nThread' header lines"), (log.footers, "'Avg bus bandwidth' lines"))
            if n > 1]
    if log.repeated_rank:
        said.append(log.repeated_rank)
    return f"the log holds more than one nccl-tests run ({'; '.join(said)})" if said else None


def _without_timestamp(line: str) -> str:
    """The row without the timestamp -S 1 ends it with: only its last 20 characters are looked at."""
    line = line.rstrip()
    return line[:-20] if _TIMESTAMP.fullmatch(line[-20:]) else line


def _with_peak(log: NcclLog) -> NcclLog:
    figures = [r.out_of_place.busbw_gbytes for r in log.rows if r.out_of_place]
    log.peak_busbw_gbytes = max(figures) if figures else None
    return log


def _header_line(log: NcclLog, line: str, owners: dict[int, str]) -> None:
    if match := _AVG.match(line):
        log.avg_busbw_gbytes = _float(match[1])
        log.footers += 1
    elif match := _COLLECTIVE.match(line):
        log.collective = match[1]
    elif match := _CONFIG.match(line):
        log.nthreads, log.ngpus = int(match[1]), int(match[2])
        log.headers += 1
    elif match := DEVICE_LINE.match(line):
        log.devices.append(f"rank {match[1]} {match[2]} device {match[3]}: {match[4].strip()}")
        _count_rank(log, int(match[1]), match[2])
        pid = _PID.search(line)
        owner = f"{match[2][:64]}" + (f" (pid {pid[1]})" if pid else "")
        first = owners.setdefault(int(match[1]), owner)
        if first != owner and log.repeated_rank is None:
            log.repeated_rank = f"rank {match[1]} on {first} and on {owner}"
    elif " busbw " in line:  # the column names: what the check column holds, and how wide each half is
        words = line.split()
        log.check_column = "#wrong" if "#wrong" in words else "error" if "error" in words else log.check_column
        log.columns_per_half = 8 if "i_cv%" in words else 4


def _count_rank(log: NcclLog, rank: int, host) -> None:
    log.ranks = max(log.ranks or 0, rank + 1)
    if isinstance(host, str) and host and host not in log.hosts:
        log.hosts.append(host)


def _row(start: re.Match, width: int = 4) -> tuple[Row | None, str | None]:
    """A result row, or None; and a note when the row was read only in part. width: the columns of each half (8
    where per-iteration columns follow its time, algbw, busbw and #wrong)."""
    size, count, dtype, tail = int(start[1]), int(start[2]), start[3], start[4]
    tokens = tail.split()
    for groups in (2, 1):
        if len(tokens) < width * groups:
            continue
        middle, body = tokens[: len(tokens) - width * groups], tokens[len(tokens) - width * groups :]
        timings = [_timing(body[i : i + 4]) for i in range(0, width * groups, width)]
        if len(middle) <= 2 and all(timings):
            break
    else:
        return None, None
    redop = next((t for t in middle if not _is_number(t)), None)
    root = next((int(t) for t in middle if re.fullmatch(r"-?\d{1,9}", t)), None)
    if groups == 2:
        return Row(size, count, dtype, redop, root, *timings), None
    # One group: nccl-tests pads a skipped out-of-place part with spaces (trace replay runs in-place
    # only); without that gap the line was cut after its out-of-place part.
    if re.search(r"\S {20,}\S", tail):
        return Row(size, count, dtype, redop, root, None, timings[0]), None
    return Row(size, count, dtype, redop, root, timings[0], None, partial=True), "in-place columns missing (truncated?)"


def _timing(cells: list[str]) -> Timing | None:
    time_us, algbw, busbw = (_float(c) for c in cells[:3])
    wrong = None if cells[3] == "N/A" else _float(cells[3])
    if None in (time_us, algbw, busbw) or (wrong is None and cells[3] != "N/A"):
        return None
    return Timing(time_us, algbw, busbw, wrong)


def _is_number(text: str) -> bool:
    return _float(text) is not None


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def _parse_json(text: str) -> NcclLog:
    """The `-J FILE` report (nccl-tests JSON version 2): config, results[], average_bus_bandwidth."""
    try:
        doc = typed_json.loads(text)
    except ValueError as error:
        raise ParseError(f"nccl-tests JSON report is not valid JSON (truncated?): {error}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ParseError("nccl-tests JSON report has no 'results' list")
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    log = NcclLog("json", None, _int(config.get("nthreads")), _int(config.get("ngpus")), [], [], None)
    for device in config.get("devices") if isinstance(config.get("devices"), list) else []:
        if isinstance(device, dict):
            log.devices.append(f"rank {device.get('rank')} {device.get('hostname')} device {device.get('device')}: "
                               f"{device.get('device_info')}")
            if (rank := _int(device.get("rank"))) is not None and 0 <= rank < 10**9:  # as many digits as a text log's
                _count_rank(log, rank, device.get("hostname"))
    for position, result in enumerate(doc["results"]):
        row = _json_row(result)
        if row is None:
            log.issues.append(f"results[{position}]: unreadable result {str(result)[:100]!r}")
        else:
            log.rows.append(row)
            log.collective = log.collective or (result.get("experiment_name") or None)
    bounds = doc.get("out_of_bounds")
    if isinstance(bounds, dict) and (count := _int(bounds.get("count"))) is not None and count >= 0:
        log.out_of_bounds = count
    log.check_column = "#wrong"  # nwrong: a count
    average = doc.get("average_bus_bandwidth")
    if isinstance(average, dict) and isinstance(average.get("bandwidth"), (int, float)):
        log.avg_busbw_gbytes = float(average["bandwidth"])
    return _with_peak(log)


def _json_row(result) -> Row | None:
    if not isinstance(result, dict) or _int(result.get("size")) is None:
        return None
    timings = [_json_timing(result.get(key)) for key in ("out_of_place", "in_place")]
    if timings == [None, None]:
        return None
    root = str(result.get("root", "")).strip()
    return Row(result["size"], _int(result.get("count")) or 0, str(result.get("type")), result.get("redop") or None,
               int(root) if re.fullmatch(r"-?\d{1,9}", root) else None, *timings)


def _json_timing(body) -> Timing | None:
    if not isinstance(body, dict):
        return None
    values = [body.get(k) for k in ("alg_bw", "bus_bw")]
    time_us = body.get("time", body.get("cpu_time"))
    if not all(isinstance(v, (int, float)) for v in [time_us, *values]):
        return None
    wrong = body.get("nwrong")
    return Timing(float(time_us), float(values[0]), float(values[1]), float(wrong) if isinstance(wrong, (int, float)) else None)


CHECK_EXPECTED = "nccl-tests' own check of every result (-c 1): 0 wrong elements, 'Out of bounds values : 0 OK'"


def failed_check(log: NcclLog) -> dict | None:
    """What nccl-tests' own check of the results found wrong (details.data_check), or None where it found nothing or
    did not check: the wrong elements of the rows whose #wrong column counts them (a row cut before its in-place half
    only where its root column places its cells; an old `error` column is a rounding difference, not a count) and
    the 'Out of bounds values' count."""
    wrong_rows = []
    if log.check_column == "#wrong":
        for row in log.rows:
            counts = [t.wrong for t in (row.out_of_place, row.in_place) if t and t.wrong and t.wrong == int(t.wrong)]
            if counts and (not row.partial or row.root is not None):  # a cut row with its root: its out-of-place half
                wrong_rows.append((row.size_bytes, int(sum(counts))))
    if not wrong_rows and not log.out_of_bounds:
        return None
    return {"expected": CHECK_EXPECTED, "elements": None, "wrong_elements": sum(n for _, n in wrong_rows),
            "wrong_rows": [{"size_bytes": size, "wrong_elements": n} for size, n in wrong_rows[:MAX_WRONG_ROWS]],
            "out_of_bounds": log.out_of_bounds}


def check_said(log: NcclLog) -> str:
    """nccl-tests' data check in words, for the log's summary."""
    check = failed_check(log) or {}
    rows = ", ".join(f"{r['wrong_elements']} at {r['size_bytes']} B" for r in check.get("wrong_rows", [])[:5])
    bounds = "not in the log" if log.out_of_bounds is None else f"{log.out_of_bounds} {'FAILED' if log.out_of_bounds else 'OK'}"
    return f"Out of bounds values: {bounds}" + (f"; #wrong {rows}" if rows else "")


MAX_WRONG_ROWS = 64  # a Report keeps this many; a sweep of 8 B..16 GiB has 32 sizes


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
