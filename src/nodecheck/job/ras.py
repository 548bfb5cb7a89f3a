"""NCCL RAS's text report (`ncclras`, NCCL 2.24 on; NVIDIA/nccl src/ras/client_support.cc), as pasted:

    NCCL version 2.26.2 compiled with CUDA 12.6                 one report per such line (several queries in a file);
                                                                RCCL's rcclras: "RCCL version 2.28.3 compiled with ROCm"
    Job summary / Nodes Processes GPUs ...                      totals, the column widths differ between versions
    Group Comms Nodes Ranks ... Status Errors                   one row per communicator group
    INCOMPLETE / Missing communicator data from 1 job process   then "Process P on node H managing GPU G"
    #0-0 (fa93daea854b060b) MISMATCH                            a communicator, then its lines:
      30 ranks have launched up to operation 640                one per count; the outlier ranks follow it:
      Rank 12 -- GPU 4 managed by process 323032 on node H      ("Rank R has status S -- GPU ..." for one rank)

Every line is split on whitespace and matched by its words, never by column (the widths changed between 2.24 and
2.30). Bounded: MAX_RAS_BYTES of text, MAX_REPORTS. Raises only ParseError (no RAS report in the text)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nodecheck.core.errors import ParseError

MAX_RAS_BYTES = 16 << 20  # a report of a 256-rank job is a few KB; a query per minute for a day fits
MAX_REPORTS = 10_000
MAX_LINE = 4096
_VERSION = re.compile(r"^([NR]CCL) version (\d{1,3}\.\d{1,3}\.\d{1,3})")
HEAD = re.compile(r"^[NR]CCL version \d+\.\d+\.\d+ compiled with (?:CUDA|ROCm)", re.MULTILINE)  # how every report begins
# What the client itself prints when a query fails (src/ras/client.cc: perror and fprintf(stderr, ...)); a file
# holding only that is a failed query, not a report.
_CLIENT_ERROR = re.compile(r"^(?:read socket|write to socket|socket|setsockopt): |^Connecting to \S{1,300}: |^Resolving \S{1,300}: "
                           r"|^NCCL unexpectedly closed the connection$|^Connection timed out|^Unexpected response from NCCL: ")
_COMM = re.compile(r"^#(\d{1,9})-(\d{1,9}) \(([0-9a-fA-F]{1,32})\)\s+([A-Z, ]{2,80})$")
_COUNT = re.compile(r"^(\d{1,9}) ranks? (?:has|have) launched up to operation (\d{1,18})$")
_COLL = re.compile(r"^Communicator ranks have different (\w{1,40}) operation counts$")
_RANK = re.compile(r"^Rank (\d{1,9})(?: has status (\w{1,20}))? -- GPU (\S{1,40}) managed by process (\d{1,10}) on node (\S{1,255})$")
_TRAVEL = re.compile(r"^Minimum (-?\d{1,9}\.\d{1,6})s, maximum")
_NEGATIVE = "Warning: negative travel times were observed"
_PROCESS = re.compile(r"^Process (\d{1,10}) on node (\S{1,255}) managing GPU (\S{1,40})$")


@dataclass
class RasRank:
    rank: int | None  # None: a job process named without a communicator rank
    gpu: str
    pid: int
    node: str
    status: str | None = None  # "Rank R has status S": that rank's own status


@dataclass
class RasCount:
    ranks: int
    operation: int  # the last operation launched (a sequence number, per collective type from 2.26)
    listed: list[RasRank] = field(default_factory=list)  # the outlier ranks RAS lists under it


@dataclass
class RasComm:
    group: int
    index: int
    comm_id: str
    errors: list[str]  # MISMATCH, INCOMPLETE, ...
    coll: str | None = None  # whose counts differ (2.26 on)
    counts: list[RasCount] = field(default_factory=list)
    missing: list[RasRank] = field(default_factory=list)  # "Missing communicator data from N ranks" and those listed
    errored: list[RasRank] = field(default_factory=list)  # ranks holding an NCCL error (the JSON form's status)


@dataclass
class RasReport:
    version: str | None
    library: str = "NCCL"  # or RCCL (ROCm's port, whose rcclras prints the same report)
    statuses: list[str] = field(default_factory=list)  # each group's Status and Errors words, from the table
    comms: list[RasComm] = field(default_factory=list)
    missing_processes: list[RasRank] = field(default_factory=list)  # job processes that sent no data at all
    ends_early: bool = False  # the text ends inside a line RAS writes whole
    timestamp: str | None = None  # when the query ran (the JSON form's, the querying node's local time)
    clocks: str | None = None  # "synchronized" or "not synchronized" (verbose reports' travel times); None: not said


def parse_ras(text: str) -> list[RasReport]:
    """Every report in the text, in order (several queries taken over time, pasted or saved together)."""
    if len(text) > MAX_RAS_BYTES:
        raise ParseError(f"RAS output of {len(text)} bytes: more than {MAX_RAS_BYTES >> 20} MiB, not read")
    reports: list[RasReport] = []
    comm: RasComm | None = None
    count: RasCount | None = None
    in_table = in_missing = False
    last = ""
    for raw in text.splitlines():
        line = " ".join(raw[:MAX_LINE].split())
        found = _VERSION.match(line)
        if found:
            if len(reports) >= MAX_REPORTS:
                break
            reports.append(RasReport(found[2], found[1]))
            comm, count, in_table, in_missing = None, None, False, False
            continue
        if not reports or not line:
            continue
        report = reports[-1]
        if line.startswith("Group Comms"):
            in_table = True
            continue
        if in_table:
            words = line.split()
            if words[0].isdigit() and len(words) >= 8:
                report.statuses += [words[6]] + words[7].split(",")
                continue
            if words[0] != "#":
                in_table = False
        if line == "INCOMPLETE":
            in_missing, comm, count = True, None, None
            continue
        if (found := _COMM.match(line)) is not None:
            comm = RasComm(int(found[1]), int(found[2]), found[3].lower(), [w for w in found[4].replace(",", " ").split()])
            report.comms.append(comm)
            count, in_missing = None, False
            continue
        _clock_line(line, report)
        _comm_line(line, report, comm, in_missing, count)
        if comm is not None and (found := _COUNT.match(line)):
            count = RasCount(int(found[1]), int(found[2]))
            comm.counts.append(count)
        last = line
    if reports and last.startswith("Rank ") and not _RANK.match(last):
        reports[-1].ends_early = True  # cut inside a rank's line
    if not reports:
        raise ParseError("no NCCL RAS report (a line \"NCCL version ...\" followed by its job summary): run `ncclras` on a node of the job")
    return reports


def client_error(text: str) -> str | None:
    """The client's own error line when the text is only that (a query that failed: RAS unreachable, or the
    connection reset by the process), else None."""
    lines = [line.strip() for line in text[:4096].splitlines() if line.strip()]
    if 0 < len(lines) <= 3 and len(text) <= 4096 and _CLIENT_ERROR.match(lines[0]):
        return lines[0][:200]
    return None


def _clock_line(line: str, report: RasReport) -> None:
    """Verbose reports (`ncclras -v`) time the RAS network's messages between nodes: "valid only if system clocks are
    synchronized", and RAS warns when a travel time is negative, "indicating that the system clocks are *not*
    synchronized" (client_support.cc): then no event ordering across hosts can be trusted."""
    if line.startswith(_NEGATIVE):
        report.clocks = "not synchronized"
    elif (found := _TRAVEL.match(line)) is not None and report.clocks is None:
        report.clocks = "not synchronized" if float(found[1]) < 0 else "synchronized"


def _comm_line(line: str, report: RasReport, comm: RasComm | None, in_missing: bool, count: RasCount | None) -> None:
    """A rank or process line, or a communicator's collective, where it belongs."""
    if (found := _PROCESS.match(line)) is not None and in_missing:
        report.missing_processes.append(RasRank(None, found[3], int(found[1]), found[2]))
        return
    if comm is None:
        return
    if (found := _COLL.match(line)) is not None:
        comm.coll = found[1]
    elif (found := _RANK.match(line)) is not None:
        rank = RasRank(int(found[1]), found[3], int(found[4]), found[5], found[2])
        if count is not None:
            count.listed.append(rank)
        elif "INCOMPLETE" in comm.errors:  # listed under "Missing communicator data from N ranks"
            comm.missing.append(rank)
