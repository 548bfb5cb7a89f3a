"""NCCL Inspector's output (NVIDIA/nccl plugins/profiler/inspector, README "Output Example"): one JSON Lines file per
process (`<host>-pid<PID>.log` under NCCL_INSPECTOR_DUMP_DIR), each line one object.

    v4.0-v4.2   every record self-contained: {"header": {id, rank, n_ranks, nnodes, ...}, "metadata": {...},
                "coll_perf": {...}} (or "p2p_perf"); 4.1 adds "dump_stats" drop counters
    v4.3        one marker per communicator dump, {"header", "metadata", "dump_stats": {coll_records, p2p_records,
                proxy_records, ...}}, then that many bare {"coll_perf"} / {"p2p_perf"} / {"proxy_trace"} objects

coll_perf: coll, coll_sn (counted per collective type), coll_msg_size_bytes, coll_exec_time_us,
coll_timing_source (kernel_gpu, kernel_cpu, collective_cpu), coll_algobw_gbs, coll_busbw_gbs, coll_algo/coll_proto,
and with NCCL_INSPECTOR_DUMP_VERBOSE event_trace_ts (coll_start_ts, kernel events). A rank is (hostname, pid).

Read as NVIDIA's own inspector_json_reader.py restores the v4.3 context: a bare record outside a marker, or past its
counts, belongs to no communicator and is not read (it is counted). Bounded: MAX_LINE per line, MAX_RECORDS per file;
a line that is not JSON is counted, never a crash. Raises only ParseError (a file with no Inspector record at all)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from nodecheck.core.errors import ParseError
from nodecheck.core.units import is_int

MAX_LINE = 1 << 16  # a verbose record with every channel's kernel events is a few KB
MAX_RECORDS = 2_000_000  # per file: ~200-500 bytes a collective (the README's estimate), so some 500 MB of JSON
KERNEL_TIMING = "kernel_gpu"  # the only source in which every rank's time includes its wait for the latest one


@dataclass
class Op:
    """One collective as one rank saw it."""

    host: str
    pid: int
    comm: str  # the communicator's id (header.id), else its name
    rank: int
    n_ranks: int
    nnodes: int | None
    coll: str
    sn: int
    size: int  # bytes
    exec_us: float
    busbw: float | None  # GB/s, as NCCL computed it
    timing: str | None  # coll_timing_source; None in formats before it
    start_ts: int | None = None  # event_trace_ts.coll_start_ts (verbose), microseconds of that host's clock
    comm_name: str | None = None


@dataclass
class InspectorFile:
    ops: list[Op] = field(default_factory=list)
    p2p: int = 0  # p2p_perf records read (not judged)
    dropped: int = 0  # records the plugin's rings overwrote before they were dumped (dump_stats)
    skipped: dict[str, int] = field(default_factory=dict)  # why lines were not read -> how many
    versions: set[str] = field(default_factory=set)


def parse_inspector(text: str) -> InspectorFile:
    out = InspectorFile()
    context: dict | None = None  # v4.3: the marker's header and metadata, and how many records it still owns
    for line in text.splitlines():
        if len(out.ops) >= MAX_RECORDS:
            _skip(out, f"past {MAX_RECORDS} records")
            break
        if not line.strip():
            continue
        record = _json(line)
        if record is None:
            _skip(out, "not a JSON object")
            continue
        if "dump_stats" in record:
            context = _marker(record, out)
            continue
        if context is not None and len(record) == 1:
            kind = next(iter(record))
            if context["remaining"].get(kind, 0) <= 0:
                _skip(out, "a record past its dump's counts")
                continue
            context["remaining"][kind] -= 1
            record = {"header": context["header"], "metadata": context["metadata"], **record}
        elif "header" not in record or "metadata" not in record:
            _skip(out, "a record with no communicator (outside a dump)")
            continue
        else:
            _version(record, out)
        _record(record, out)
    if not out.ops and not out.p2p and not out.versions:
        raise ParseError("no NCCL Inspector record (JSON Lines with header, metadata and coll_perf)")
    return out


def _json(line: str) -> dict | None:
    if len(line) > MAX_LINE:
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _skip(out: InspectorFile, why: str) -> None:
    out.skipped[why] = out.skipped.get(why, 0) + 1


def _version(record: dict, out: InspectorFile) -> None:
    metadata = record.get("metadata")
    version = metadata.get("inspector_output_format_version") if isinstance(metadata, dict) else None
    if isinstance(version, str):
        out.versions.add(version[:16])


def _marker(record: dict, out: InspectorFile) -> dict | None:
    """A v4.3 dump marker opens a context; an older format's stats record only carries its drop counters."""
    _version(record, out)
    stats = record.get("dump_stats") if isinstance(record.get("dump_stats"), dict) else {}
    for key in ("coll_dropped_since_last_dump", "p2p_dropped_since_last_dump"):
        if is_int(stats.get(key)) and stats[key] > 0:
            out.dropped += stats[key]
    counts = {kind: stats.get(key) for kind, key in (("coll_perf", "coll_records"), ("p2p_perf", "p2p_records"),
                                                      ("proxy_trace", "proxy_records"))}
    if not isinstance(record.get("header"), dict) or not isinstance(record.get("metadata"), dict):
        return None
    if not all(value is None or is_int(value) and 0 <= value <= MAX_RECORDS for value in counts.values()):
        _skip(out, "a dump marker with bad counts")
        return None
    return {"header": record["header"], "metadata": record["metadata"], "remaining": {k: v or 0 for k, v in counts.items()}}


def _record(record: dict, out: InspectorFile) -> None:
    header, metadata = record.get("header"), record.get("metadata")
    if not isinstance(header, dict) or not isinstance(metadata, dict):
        _skip(out, "a record without header or metadata objects")
        return
    if isinstance(record.get("p2p_perf"), dict):
        out.p2p += 1
        return
    perf = record.get("coll_perf")
    if not isinstance(perf, dict):
        if "proxy_trace" not in record:
            _skip(out, "a record that is no collective")
        return
    op = _op(header, metadata, perf)
    if op is None:
        _skip(out, "a collective missing its rank, host, sequence number or time")
    else:
        out.ops.append(op)


def _op(header: dict, metadata: dict, perf: dict) -> Op | None:
    host, pid = metadata.get("hostname"), metadata.get("pid")
    comm = header.get("id") if isinstance(header.get("id"), str) else header.get("comm_name")
    rank, n_ranks, sn, size = header.get("rank"), header.get("n_ranks"), perf.get("coll_sn"), perf.get("coll_msg_size_bytes")
    exec_us, coll = perf.get("coll_exec_time_us"), perf.get("coll")
    if not (isinstance(host, str) and is_int(pid) and isinstance(comm, str) and isinstance(coll, str)):
        return None
    if not (is_int(rank) and is_int(n_ranks) and 0 <= rank < n_ranks <= 1 << 20 and is_int(sn) and sn >= 0):
        return None
    if not (is_int(size) and size >= 0 and isinstance(exec_us, (int, float)) and 0 < exec_us < 1e12):
        return None
    busbw = perf.get("coll_busbw_gbs")
    timing = perf.get("coll_timing_source")
    trace = perf.get("event_trace_ts") if isinstance(perf.get("event_trace_ts"), dict) else {}
    start = trace.get("coll_start_ts")
    nnodes = header.get("nnodes")
    name = header.get("comm_name")
    return Op(host[:128], pid, comm[:64], rank, n_ranks, nnodes if is_int(nnodes) else None, coll[:32], sn, size, float(exec_us),
              float(busbw) if isinstance(busbw, (int, float)) and busbw >= 0 else None, timing[:16] if isinstance(timing, str) else None,
              start if is_int(start) else None, name[:64] if isinstance(name, str) else None)
