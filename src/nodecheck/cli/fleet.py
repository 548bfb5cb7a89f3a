"""`nodecheck fleet DIR` or `--prometheus URL`: the nodes of a directory of Reports (`inspect --json`, `bench
--json`, one per node), or those a Prometheus scrapes, compared with their peers of the same type (fleet/__init__.py)."""

from __future__ import annotations

import gc
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from nodecheck.cli.app import EXIT_FINDINGS, EXIT_OK, app, fail, read_report_file, report_files

FLEET_SCHEMA_VERSION = 1


@app.command()
def fleet(
    source: Optional[Path] = typer.Argument(None, help="A directory of Reports, one JSON file per node (e.g. from deploy/slurm/nodecheck-sweep)."),
    prometheus: Optional[str] = typer.Option(None, "--prometheus", help="Ask this Prometheus (http://host:9090) instead."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON (schema nodecheck.fleet)."),
    fraction: float = typer.Option(0.9, "--fraction", min=0.01, max=1.0,
                                   help="A node below this fraction of its peers' median on a measurement is out of line."),
) -> None:
    """Compare each node with its peers of the same type: measurements and facts (median, robust z-score) and
    fingerprint drift (driver, VBIOS, NIC firmware, kernel, topology, /etc/nccl.conf, RoCE GID index). Exit 1 when a node
    is out of line."""
    from nodecheck.core.errors import NodecheckError
    from nodecheck.fleet import compare, out_of_line
    from nodecheck.render.table import clean

    if (source is None) == (prometheus is None):
        fail("give a directory of Reports or --prometheus URL (one of them)")
    if prometheus is not None:
        from nodecheck.fleet.prometheus import node_views

        try:
            views, skipped = node_views(prometheus), []
        except NodecheckError as error:
            fail(str(error))
    else:
        views, skipped = _read_reports(source)
    if not views:  # judging nothing is no verdict: never "every node in line"
        for entry in skipped[:20]:
            typer.echo(f"skipped {clean(entry['file'])}: {clean(entry['why'])}", err=True)
        where = f"{source} holds no Report" if source is not None else f"{prometheus} knows no nodecheck node"
        fail(f"nothing to compare: {where}" + (f" ({len(skipped)} file(s) skipped)" if skipped else
                                              " (Reports are *.json files: inspect --json, bench --json)"))
    groups = compare(views, fraction)
    out = out_of_line(groups)
    if as_json:
        typer.echo(json.dumps({"schema": "nodecheck.fleet", "schema_version": FLEET_SCHEMA_VERSION, "fraction": fraction,
                               "nodes": len(views), "skipped": skipped, "groups": [asdict(g) for g in groups],
                               "out_of_line": out}, indent=2))
    else:
        from nodecheck.render.fleet import render_fleet

        render_fleet(groups, skipped, fraction)
    raise typer.Exit(EXIT_FINDINGS if out else EXIT_OK)


def _read_reports(source: Path):
    """Each *.json file of `source` as a node; one that is not a Report is skipped and said why, and so is
    each but the newest of one machine's Reports (its host name and GPU UUIDs): a machine has one vote."""
    if not source.is_dir():
        fail(f"{source}: not a directory of Reports")
    views, skipped, names = [], [], set()
    stamps: list[tuple[float, str]] = []  # each view's Report: (generated_at, file)
    machine_at: dict[tuple, int] = {}  # (host name, its GPUs' UUIDs) -> where in views
    for path, node, why in _nodes(report_files(source)):
        if node is None:
            skipped.append({"file": path.name, "why": why[:200]})
            continue
        view, uuids, generated_at = node
        machine = (view.name, uuids)
        stamp = (generated_at, path.name)
        if machine[1] and (at := machine_at.get(machine)) is not None:  # one machine, one vote: its newest Report
            older, newer = sorted([stamps[at], stamp])
            skipped.append({"file": older[1], "why": f"an older Report of {view.name}: {newer[1]} has the same GPUs"})
            if newer == stamp:
                view.name, views[at], stamps[at] = views[at].name, view, stamp
            continue
        machine_at[machine] = len(views)
        if view.name in names:  # another machine that calls itself the same
            view.name = f"{view.name} ({path.name})"
        names.add(view.name)
        views.append(view)
        stamps.append(stamp)
    return views, skipped


# Reports are read on every CPU from this many files on: each is read alone (a fleet of 10,000 is 430 MB of JSON,
# and reading one typed costs twice its parsing), and below it a pool's start costs more than it saves.
PARALLEL_FROM = 200
MAX_WORKERS = 16


def _nodes(files: list[Path]):
    """(path, (NodeView, its GPUs' UUIDs, generated_at), None) or (path, None, why) per file, in their order."""
    if len(files) < PARALLEL_FROM or (workers := min(MAX_WORKERS, len(os.sched_getaffinity(0)))) < 2:
        yield from map(_node, files)
        return
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            yield from pool.map(_node, files, chunksize=max(1, min(64, len(files) // (4 * workers))))
    except BrokenProcessPool:  # a reader killed (out of memory): no verdict on part of the fleet
        fail(f"{files[0].parent}: a process reading the Reports died (out of memory?): nothing compared")


def _node(path: Path):
    """One file's node: the Report read, viewed, and let go (a view is a few hundred bytes, a Report a few hundred
    thousand). The cyclic collector is off meanwhile: a Report read from JSON holds no cycle, and its hundreds of
    objects made it walk every one alive, a fifth of the reading."""
    from nodecheck.core.errors import NodecheckError
    from nodecheck.fleet import node_view

    collecting = gc.isenabled()
    gc.disable()
    try:
        report = read_report_file(path)
        uuids = tuple(sorted(g.uuid for g in report.gpus if g.uuid))
        return path, (node_view(report, path.stem), uuids, report.generated_at), None
    except NodecheckError as error:
        return path, None, str(error).removeprefix(f"{path}: ")
    finally:
        if collecting:
            gc.enable()
