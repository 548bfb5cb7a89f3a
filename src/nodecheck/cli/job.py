"""`nodecheck nccl-job`: which rank holds a real job back, from NCCL Inspector's per-rank files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from nodecheck.cli.app import EXIT_FINDINGS, EXIT_OK, app, fail, read_report_file, report_files
from nodecheck.core.errors import NodecheckError, ParseError

MAX_FILE = 256 << 20  # one process's JSON Lines: ~200-500 bytes a collective
MAX_FILES = 20_000  # a job of some thousands of ranks, a file each
MAX_DEPTH = 3  # NCCL_INSPECTOR_DUMP_DIR, a job's directory of them, one more level


@app.command("nccl-job")
def nccl_job(
    paths: list[Path] = typer.Argument(..., help="NCCL Inspector files (<host>-pid<PID>.log) or directories of them (NCCL_INSPECTOR_DUMP_DIR), and saved `ncclras` reports."),
    reports: Optional[Path] = typer.Option(None, "--reports", help="A directory of the job's node Reports (as fleet reads them): say why each named rank is slow."),
    as_json: bool = typer.Option(False, "--json", help="Print what was read and the ranks named as JSON (schema nodecheck.nccl_job)."),
) -> None:
    """The rank that holds a job back, from NCCL Inspector's records of every rank: the one whose collectives are the
    shortest (every other rank's time includes its wait for it), and the process common to every slow communicator;
    from saved RAS reports, processes that sent no data and ranks behind their communicator in two queries. nodecheck
    never queries a job's RAS itself. Exit 0 nothing to name, 1 a rank named, 2 nothing readable."""
    from dataclasses import asdict

    from nodecheck.job.inspector import parse_inspector
    from nodecheck.job.inspector_prom import is_inspector_prom, parse_inspector_prom
    from nodecheck.job.ranks import judge_job
    from nodecheck.job.ras import HEAD, client_error, parse_ras
    from nodecheck.job.ras_json import is_ras_json, parse_ras_json
    from nodecheck.job.starts import clocks_said, late_by_start
    from nodecheck.job.stuck import judge_ras

    ops, read, notes, ras, prom = [], [], [], [], []
    for path in _files(paths):
        try:
            text = _read(path)
            if is_inspector_prom(text):
                samples, skipped = parse_inspector_prom(text)
                prom += samples
                read.append({"path": str(path), "prometheus_samples": len(samples), "skipped": {"not an Inspector metric": skipped} if skipped else {}})
                continue
            if (failed := client_error(text)) is not None:
                raise ParseError(f"not a RAS report but the client's own error \"{failed}\": that query failed (RAS "
                                 "unreachable, or the process closed it; see the NCCL versions whose RAS is safe in docs/jobs.md)")
            is_ras_text = HEAD.search(text[:1 << 16]) is not None
            if is_ras_text or is_ras_json(text):
                queries = parse_ras(text) if is_ras_text else parse_ras_json(text)
                ras += queries
                read.append({"path": str(path), "ras_reports": len(queries)})
                continue
            parsed = parse_inspector(text)
        except (NodecheckError, ParseError) as error:
            if path in paths:  # a file named on the command line must be one
                fail(str(error) if str(path) in str(error) else f"{path}: {error}")
            notes.append(f"{path}: {error}: left out")
            continue
        ops += parsed.ops
        read.append({"path": str(path), "collectives": len(parsed.ops), "p2p": parsed.p2p, "dropped": parsed.dropped,
                     "skipped": parsed.skipped, "versions": sorted(parsed.versions)})
        if parsed.dropped:
            notes.append(f"{path}: the plugin's rings overwrote {parsed.dropped} record(s) before they were dumped "
                         "(NCCL_INSPECTOR_DUMP_COLL_RING_SIZE): those operations are not compared")
    if not read:
        fail("no NCCL Inspector file could be read in " + ", ".join(map(str, paths)))
    verdict = judge_job(ops)
    late_by_start(ops, clocks_said(ras), verdict)
    if prom:
        from nodecheck.job.peers import judge_peers

        named, said = judge_peers(prom)
        verdict.named += named
        notes += said
    if ras:
        named, said = judge_ras(ras)
        verdict.named += named
        notes += said + [f"RAS: {len(ras)} report(s), {', '.join(sorted({f'{r.library} {r.version}' for r in ras if r.version}))}"]
    verdict.notes = notes + (verdict.notes if ops else [])
    if reports is not None and verdict.named:
        from nodecheck.job.why import explain

        explain(verdict.named, _read_reports(reports, verdict.notes))
    if as_json:
        typer.echo(json.dumps({"schema": "nodecheck.nccl_job", "schema_version": 1, "files": read,
                               "ranks": len({(op.host, op.pid) for op in ops}), **asdict(verdict)}, indent=2))
    else:
        from nodecheck.render.job import nccl_job_lines

        typer.echo("\n".join(nccl_job_lines(verdict, sum(1 for p in read if "collectives" in p), len({(op.host, op.pid) for op in ops}),
                                             len(ras), (sum(1 for p in read if "prometheus_samples" in p), len({(s.node, s.gpu) for s in prom})))))
    raise typer.Exit(EXIT_FINDINGS if verdict.named else EXIT_OK)


def _files(paths: list[Path]) -> list[Path]:
    """The files named, and the regular files under each directory named (MAX_DEPTH deep, MAX_FILES in all, sorted);
    links are not followed out of a directory."""
    found: list[Path] = []
    for path in paths:
        if not path.is_dir():
            found.append(path)
            continue
        stack = [(path, 0)]
        while stack and len(found) < MAX_FILES:
            directory, depth = stack.pop()
            try:
                entries = sorted(directory.iterdir())
            except OSError as error:
                fail(f"{directory}: cannot list ({error.strerror or error})")
            for entry in entries:
                if entry.is_symlink():
                    continue
                if entry.is_dir() and depth + 1 < MAX_DEPTH:
                    stack.append((entry, depth + 1))
                elif entry.is_file():
                    found.append(entry)
    if len(found) >= MAX_FILES:
        fail(f"more than {MAX_FILES} files under {', '.join(map(str, paths))}: name the job's own directory")
    return found


def _read(path: Path) -> str:
    from nodecheck.host.files import read_user_file

    return read_user_file(path, MAX_FILE, "NCCL Inspector output").decode("utf-8", errors="replace")


def _read_reports(directory: Path, notes: list[str]) -> list:
    """The Reports of the job's nodes; a file that is not one is said and left out."""
    if not directory.is_dir():
        fail(f"{directory}: not a directory of Reports")
    read = []
    for path in report_files(directory):
        try:
            read.append(read_report_file(path))
        except NodecheckError as error:
            notes.append(f"{error}: left out")
    return read
