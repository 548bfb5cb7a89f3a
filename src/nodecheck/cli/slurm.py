"""`nodecheck prolog` and `healthcheck`: the Slurm faces."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

import typer

from nodecheck.cli.app import CONFIG_OPTION, EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, FROM_OPTION, app, fail
from nodecheck.core.errors import ConfigError, NodecheckError

_DRY_RUN = typer.Option(False, "--dry-run", help="Run the checks and print the drain or resume it would do; never call scontrol.")
_JSON = typer.Option(False, "--json", help="Print the outcome as JSON.")


@app.command()
def prolog(
    dry_run: bool = _DRY_RUN,
    as_json: bool = _JSON,
    source: Optional[Path] = FROM_OPTION,
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Slurm Prolog: the quick checks under [prolog] timeout_s; on failure drain this node with a
    `nodecheck:` reason and exit 1 (Slurm requeues the job). Skipped for [prolog] skip_partitions and
    for jobs whose --comment holds [prolog] skip_comment."""
    _slurm_check("prolog", dry_run, as_json, source, config_path)


@app.command()
def healthcheck(
    dry_run: bool = _DRY_RUN,
    as_json: bool = _JSON,
    source: Optional[Path] = FROM_OPTION,
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Slurm HealthCheckProgram: the same checks; drain on failure, resume a node nodecheck drained once
    it passes again (an admin's drain is never touched). Never runs bandwidth tests."""
    _slurm_check("healthcheck", dry_run, as_json, source, config_path)


def _slurm_check(mode: str, dry_run: bool, as_json: bool, source: Optional[Path], config_path: Optional[Path]) -> None:
    import os

    from nodecheck import config as config_module
    from nodecheck.host.live import LiveHost
    from nodecheck.host.snapshot import open_snapshot
    from nodecheck.render.table import clean
    from nodecheck.slurm import prolog as checks
    from nodecheck.slurm.scontrol import DEFAULT_PATH

    os.environ.setdefault("PATH", DEFAULT_PATH)  # Slurm runs prologs and health checks without one
    if source is not None and not dry_run:  # another machine's state never drains or resumes this one
        fail(f"--from judges a recorded node and acts on none: add --dry-run ({mode} --dry-run --from {source})")
    try:
        config = config_module.load(config_path)
    except ConfigError as error:
        outcome = checks.config_failure(str(error), dry_run)
    else:
        try:
            with tempfile.TemporaryDirectory(prefix="nodecheck-snapshot-") as workdir:
                host = LiveHost() if source is None else open_snapshot(source, Path(workdir))
                recorded = None if source is None else str(host.identity().get("hostname") or source.name)
                outcome = checks.execute(mode, host, config, dict(os.environ), dry_run, clean(recorded) if recorded else None)
        except NodecheckError as error:  # an unreadable --from snapshot
            fail(str(error))
    if as_json:
        typer.echo(json.dumps(outcome.to_dict(), indent=2))
    else:
        from nodecheck.render.slurm import outcome_lines

        for line, to_stderr in outcome_lines(mode, outcome, dry_run):
            typer.echo(line, err=to_stderr)
    failed = outcome.error is not None or (outcome.verdict is not None and not outcome.verdict.passed)
    raise typer.Exit(EXIT_USAGE if outcome.slurm_error else EXIT_FINDINGS if failed else EXIT_OK)
