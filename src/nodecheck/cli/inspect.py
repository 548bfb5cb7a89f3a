"""`nodecheck inspect`, `snapshot`, `config init` and `config check`: what this node (or a recorded one) is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from nodecheck.cli.app import (
    CONFIG_OPTION,
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    FROM_OPTION,
    app,
    config_app,
    fail,
    is_report_directory,
    is_report_file,
    load_report,
    read_report_directory,
    read_report_file,
)
from nodecheck.core.errors import NodecheckError


@app.command()
def inspect(
    source: Optional[Path] = typer.Option(None, "--from", help="Replay a snapshot (directory or .tar.gz), or show a saved "
                                          "Report (a JSON file), instead of this machine."),
    as_json: bool = typer.Option(False, "--json", help="Print the Report as JSON (docs/report-schema.md)."),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Report GPUs, links, NUMA locality, NICs, path specs, findings and binding advice. --from also shows a saved
    Report (`inspect --json`, a job's `bench --json`) as it was judged when it was written."""

    if source is not None and is_report_directory(source):
        fail(f"{source} is a directory of Reports, not a snapshot: `nodecheck inspect --from {source}/NODE.json` shows one, "
             f"`nodecheck fleet {source}` compares them")
    saved = source is not None and is_report_file(source)
    try:
        if saved:
            from nodecheck import config as config_module

            report, config = read_report_file(source), config_module.load(config_path)
        else:
            report, config = load_report(source, config_path)
    except NodecheckError as error:
        fail(str(error))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        from nodecheck.render.report import render

        render(report, saved_in=source if saved else None)
    raise typer.Exit(EXIT_FINDINGS if report.fails(config.fail_severity) else EXIT_OK)


@app.command()
def snapshot(
    out: Path = typer.Argument(..., help="Directory to create, or a path ending in .tar.gz."),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Record every raw source the probes read (for `inspect --from` and support tickets)."""
    from nodecheck import config as config_module
    from nodecheck.host.live import LiveHost
    from nodecheck.host.snapshot import RecordingHost
    from nodecheck.pipeline import build_report

    if out.is_symlink():  # dangling or not: nodecheck runs as root and must not write where a link points
        fail(f"{out} is a symbolic link: give the real path")
    if out.exists() and (out.is_file() or any(out.iterdir())):
        fail(f"{out} already exists and is not empty")
    if not out.absolute().parent.is_dir():  # said before the probes run, and no directories made on a typo
        fail(f"{out.absolute().parent} does not exist: create it, or give a path in a directory that does")
    try:
        recorder = RecordingHost(LiveHost())
        report = build_report(recorder, config_module.load(config_path))
        recorder.write(out)
    except (NodecheckError, OSError) as error:
        fail(str(error))
    failed = [p.name for p in report.probes if not p.ok]
    typer.echo(f"snapshot written to {out} ({len(recorder.sources)} sources"
               + (f"; without data from: {', '.join(failed)}" if failed else "") + ")")


@config_app.command("init")
def config_init(
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of standard output."),
    source: Optional[Path] = FROM_OPTION,
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Write this node's facts as a starting config (run it on a known-good node)."""
    from nodecheck.config.init import generate

    try:
        report, _ = load_report(source, None)
    except NodecheckError as error:
        fail(str(error))
    text = generate(report)
    if output is None:
        typer.echo(text, nl=False)
        return
    if output.exists() and not force:
        fail(f"{output} exists; use --force to overwrite")
    try:
        output.write_text(text)
    except OSError as error:
        fail(f"cannot write {output}: {error.strerror or error}")
    typer.echo(f"config written to {output}")


@config_app.command("check")
def config_check(
    file: Path = typer.Argument(..., help="The config to check (TOML)."),
    source: Optional[Path] = typer.Option(None, "--from", help="Judge a snapshot (directory or .tar.gz), a saved Report "
                                          "(JSON), or each Report of a directory (nodecheck-sweep's) instead of this node."),
) -> None:
    """Validate a config and show what it would judge on this node (or a snapshot of a known-good node, or the
    saved Reports of a sweep, --from) before it is deployed: each expectation beside what the node has, the
    findings, and whether the Slurm prolog would drain the node. Exit 0: valid, the node (every node) passes;
    1: the prolog would drain it (one of them); 2: invalid."""
    from nodecheck import config as config_module
    from nodecheck.pipeline import judged_again
    from nodecheck.slurm.prolog import drain_reason, failing_findings
    from nodecheck.verdicts.config_check import as_the_prolog_judges, expectation_rows

    if source is not None and is_report_directory(source):
        _check_reports(file, source)
    saved = source is not None and is_report_file(source)
    try:
        if saved:
            config = config_module.load(file)
            report = judged_again(read_report_file(source), config)
        else:
            report, config = load_report(source, file)
    except NodecheckError as error:
        fail(str(error))
    from nodecheck.render.slurm import config_check_lines

    where = f"{'Report' if saved else 'snapshot'} {source}" if source else "this node"
    findings, measured = as_the_prolog_judges(config, report)
    failing = failing_findings(findings, config.fail_severity)  # as the prolog's node check judges
    reason = drain_reason(failing) or None
    typer.echo("\n".join(config_check_lines(str(file), where, report, expectation_rows(config, report), findings, failing,
                                            reason, config.fail_severity, measured)))
    raise typer.Exit(EXIT_FINDINGS if reason else EXIT_OK)


def _check_reports(file: Path, directory: Path) -> None:
    """`config check FILE --from DIR`: the config against each node's saved Report, as the prolog's node check
    would judge that node; one line per node it would drain. Exits."""
    from nodecheck import config as config_module
    from nodecheck.pipeline import judged_again
    from nodecheck.render.slurm import config_check_nodes_lines
    from nodecheck.slurm.prolog import drain_reason, failing_findings
    from nodecheck.verdicts.config_check import as_the_prolog_judges

    try:
        config = config_module.load(file)
    except NodecheckError as error:
        fail(str(error))
    judged, skipped = [], []
    for path, saved, why in read_report_directory(directory):
        if saved is None:
            skipped.append((path.name, why))
            continue
        report = judged_again(saved, config)
        findings, _ = as_the_prolog_judges(config, report)
        reason = drain_reason(failing_findings(findings, config.fail_severity)) or None
        judged.append((report.node.get("hostname") or path.stem, path.name, reason))
    typer.echo("\n".join(config_check_nodes_lines(str(file), str(directory), judged, skipped)))
    if not judged:
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(EXIT_FINDINGS if any(reason for *_, reason in judged) else EXIT_OK)
