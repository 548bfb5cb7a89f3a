"""NCCL RAS's JSON report (`ncclras -f json`, NCCL 2.28.7 on; NVIDIA/nccl src/ras/client_support.cc
rasDumpCommsToJSON, and the user guide's troubleshooting/ras.rst "JSON Output"), read into the same RasReport as the
text form (job/ras.py), so that one set of rules (job/stuck.py) judges both:

    {"nccl_version", "timestamp", "communicators": [{"hash", "size", "ranks": [{rank, host, pid, cuda_dev,
     nvml_dev, "status": {init_state, async_error, finalize_called, destroy_flag, abort_flag},
     "collective_counts": {"AllReduce": n, ...}}], "missing_ranks": [{..., "status": {unresponsive,
     considered_dead}}]}], "ras": {...}}

and monitor mode's events (`ncclras -m -f json`, 2.29 on): {"event": "PEER_DEAD", "peer": {host, pid, cuda_devs}}.

A file may hold several documents one after another (a query a minute appended): each is one query, in order. Where
the text form prints only the outlier ranks, the JSON holds every rank's counts: ranks are grouped by count per
collective type, as RAS groups them. Bounded like the text form; raises only ParseError."""

from __future__ import annotations

import json
import re
from collections import defaultdict

from nodecheck.core.errors import ParseError
from nodecheck.core.units import is_int
from nodecheck.job.ras import MAX_RAS_BYTES, MAX_REPORTS, RasComm, RasCount, RasRank, RasReport

MAX_COMMS = 100_000
MAX_RANKS = 1 << 20
# ncclResult_t (src/nccl.h.in): what a rank's async_error or init_state says of it
RESULTS = {1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError", 4: "ncclInvalidArgument",
           5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress", 8: "ncclTimeout"}
REMOTE, IN_PROGRESS = 6, 7  # a rank told of another's failure; a rank still initialising (the guide: init_state 7)
_SPACE = re.compile(r"[ \t\r\n]*")
DEAD_EVENTS = ("PEER_DEAD", "PEER_TIMEOUT_DEAD")


def is_ras_json(text: str) -> bool:
    """The head of a RAS JSON document or monitor event (what the CLI tells from Inspector's JSON Lines)."""
    head = text[:4096]
    return head.lstrip().startswith("{") and ('"nccl_version"' in head and '"communicators' in head or '"event"' in head and '"group"' in head)


def parse_ras_json(text: str) -> list[RasReport]:
    if len(text) > MAX_RAS_BYTES:
        raise ParseError(f"RAS output of {len(text)} bytes: more than {MAX_RAS_BYTES >> 20} MiB, not read")
    decoder = json.JSONDecoder()
    reports: list[RasReport] = []
    at, broken = 0, None
    while len(reports) < MAX_REPORTS:
        at = _skip_space(text, at)
        if at >= len(text):
            break
        if text[at] != "{":  # every document RAS writes is an object: anything else ends what can be read
            broken = f"character {at} starts no JSON object"
            break
        try:
            document, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError) as error:
            broken = f"the JSON breaks at character {at}: {str(error).split(':')[0]}"
            break
        if not isinstance(document, dict):
            continue
        if "event" in document:
            _event(document, reports)
        elif isinstance(document.get("communicators"), list):
            reports.append(_report(document))
    if not reports:
        raise ParseError(broken or "no NCCL RAS JSON report (an object with nccl_version and communicators): run `ncclras -f json`")
    if broken:
        reports[-1].ends_early = True
    return reports


def _skip_space(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()


def _report(document: dict) -> RasReport:
    version = document.get("nccl_version")
    report = RasReport(version[:32] if isinstance(version, str) else None)
    stamp = document.get("timestamp")
    report.timestamp = stamp[:32] if isinstance(stamp, str) else None
    for index, comm in enumerate(document["communicators"][:MAX_COMMS]):
        if isinstance(comm, dict):
            _comm(index, comm, report)
    return report


def _comm(index: int, comm: dict, report: RasReport) -> None:
    comm_id = str(comm.get("hash"))[:34].lower().removeprefix("0x")
    ranks = [r for r in _list(comm.get("ranks")) if isinstance(r, dict)]
    counts: dict[str, dict[int, list[RasRank]]] = defaultdict(lambda: defaultdict(list))
    errored, entries = [], []
    for entry in ranks:
        rank = _rank(entry)
        if rank is None:
            continue
        status = entry.get("status") if isinstance(entry.get("status"), dict) else {}
        rank.status = _status(status)
        if rank.status.startswith("ERROR"):
            errored.append(rank)
        colls = entry.get("collective_counts")
        for coll, count in (colls.items() if isinstance(colls, dict) else ()):
            if isinstance(coll, str) and is_int(count) and count >= 0:
                counts[coll[:40]][count].append(rank)
    for coll, by_count in counts.items():
        if len(by_count) > 1:  # RAS's MISMATCH: ranks of one communicator at different operations of a collective
            entry = RasComm(index, 0, comm_id, ["MISMATCH"], coll)
            entry.counts = [RasCount(len(listed), operation, listed) for operation, listed in sorted(by_count.items())]
            entries.append(entry)
    missing = [m for m in _list(comm.get("missing_ranks")) if isinstance(m, dict)]
    if missing:
        entry = RasComm(index, 0, comm_id, ["INCOMPLETE"])
        for item in missing:
            rank = _rank(item)
            if rank is not None:
                status = item.get("status") if isinstance(item.get("status"), dict) else {}
                # neither: missing only, as the text form says (status None)
                rank.status = "dead" if status.get("considered_dead") is True else "unresponsive" if status.get("unresponsive") is True else None
                entry.missing.append(rank)
        entries.append(entry)
    if errored:
        entry = RasComm(index, 0, comm_id, ["ERROR"])
        entry.errored = errored
        entries.append(entry)
    report.comms += entries
    report.statuses += sorted({word for entry in entries for word in entry.errors}) or ["OK"]


def _list(value) -> list:
    return value[:MAX_RANKS] if isinstance(value, list) else []


def _rank(entry: dict) -> RasRank | None:
    rank, host, pid = entry.get("rank"), entry.get("host"), entry.get("pid")
    if not (is_int(rank) and 0 <= rank < MAX_RANKS and isinstance(host, str) and is_int(pid)):
        return None
    cuda, nvml = entry.get("cuda_dev"), entry.get("nvml_dev")
    gpu = str(cuda) if is_int(cuda) else "?"
    if is_int(nvml) and nvml != cuda:
        gpu += f" (NVML {nvml})"  # as RAS's text prints a GPU renumbered by CUDA_VISIBLE_DEVICES
    return RasRank(rank, gpu, pid, host[:255])


def _status(status: dict) -> str:
    """RAS's own reading of a rank's state (client_support.cc: ABORT, FINALIZE, RUNNING, INIT), and ERROR with the
    result code when the rank holds an asynchronous error or failed its initialisation."""
    error, init = status.get("async_error"), status.get("init_state")
    for code in (error, init):
        if is_int(code) and code not in (0, IN_PROGRESS):
            return f"ERROR {RESULTS.get(code, f'result {code}')}"
    if status.get("abort_flag") is True:
        return "ABORT"
    if status.get("finalize_called") is True or status.get("destroy_flag") is True:
        return "FINALIZE"
    return "RUNNING" if init == 0 else "INIT"


def _event(document: dict, reports: list[RasReport]) -> None:
    """A monitor-mode event: a process RAS declared dead joins the latest report's missing processes (a report of
    its own when no status query came before it)."""
    peer = document.get("peer") if isinstance(document.get("peer"), dict) else {}
    if document.get("event") not in DEAD_EVENTS:
        return
    host, pid = peer.get("host"), peer.get("pid")
    if not isinstance(host, str) or not is_int(pid):
        address = peer.get("addr")
        if isinstance(address, str):  # the peer was unknown to RAS: its address only ("ip<port>")
            host, pid = address.split("<")[0][:255], -1
        else:
            return
    gpus = peer.get("cuda_devs")
    gpu = ",".join(str(g) for g in gpus[:64] if is_int(g)) if isinstance(gpus, list) else "?"
    if not reports:
        reports.append(RasReport(None))
    reports[-1].missing_processes.append(RasRank(None, gpu or "?", pid, host[:255], "dead"))
