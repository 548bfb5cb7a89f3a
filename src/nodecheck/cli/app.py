"""The app every command family registers on, and what they share: exit codes, the --from and --config
options, one way to fail with a message, one way to build the Report.

Exit codes: 0 healthy, 1 a finding at or above the failing severity, 2 usage or config error.
Only the cli package turns a NodecheckError into a message and an exit code.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

import typer

from nodecheck import __version__

# rich_markup_mode=None: help texts are plain text, so `[prolog]` and `[serve]` print as written
app = typer.Typer(add_completion=True, no_args_is_help=True, rich_markup_mode=None,
                  help="What a GPU node is, and whether it performs to spec.")
config_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Expectations file (TOML).")
app.add_typer(config_app, name="config")

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2

FROM_OPTION = typer.Option(None, "--from", help="Replay a snapshot (directory or .tar.gz) instead of this machine.")
REPORT_SCHEMA = "nodecheck.report"
CONFIG_OPTION = typer.Option(None, "--config", "-c", help="Expectations file (default /etc/nodecheck/config.toml if present).")


def fail(message: str, code: int = EXIT_USAGE) -> None:
    typer.echo(f"nodecheck: {message}", err=True)
    raise typer.Exit(code)


def load_report(source: Optional[Path], config_path: Optional[Path], judge: bool = True):
    from nodecheck import config as config_module
    from nodecheck.host.live import LiveHost
    from nodecheck.pipeline import build_report

    config = config_module.load(config_path)
    if source is None:
        return build_report(LiveHost(), config, judge=judge), config
    from nodecheck.host.snapshot import open_snapshot

    with tempfile.TemporaryDirectory(prefix="nodecheck-snapshot-") as workdir:
        return build_report(open_snapshot(source, Path(workdir)), config, judge=judge), config


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nodecheck {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True, help="Show the version.")) -> None:
    pass


def is_report_file(path: Path) -> bool:
    """Whether `path` is a saved Report (a regular file holding a JSON object) rather than a snapshot (a directory
    or a tarball)."""
    try:
        if not path.is_file():  # never opened: a FIFO would block the open
            return False
        with path.open("rb") as file:
            return file.read(64).lstrip()[:1] == b"{"
    except OSError:
        return False


def is_report_directory(path: Path) -> bool:
    """Whether `path` is a directory of saved Reports (`deploy/slurm/nodecheck-sweep`'s, one per node) rather than a
    snapshot: JSON files, and none of the names a snapshot holds."""
    from nodecheck.host.snapshot import SNAPSHOT_MARKERS

    try:
        return path.is_dir() and not any((path / name).exists() for name in SNAPSHOT_MARKERS) and any(path.glob("*.json"))
    except OSError:
        return False


MAX_REPORTS = 100_000  # files in a directory of Reports, one per node: more nodes than any cluster has


def report_files(directory: Path) -> list[Path]:
    """The *.json files of a directory of Reports (a sweep's, one per node), in name order. More than MAX_REPORTS
    files: nothing is read, and the command fails saying so."""
    files = sorted(directory.glob("*.json"))
    if len(files) > MAX_REPORTS:
        fail(f"{directory}: {len(files)} files, more than {MAX_REPORTS} nodes: not read")
    return files


def read_report_directory(directory: Path):
    """Each Report of a directory of them (report_files): (path, Report, None), or (path, None, why) for a file that
    is not a Report (the reader's reason, without the path)."""
    from nodecheck.core.errors import NodecheckError

    for path in report_files(directory):
        try:
            yield path, read_report_file(path), None
        except NodecheckError as error:
            yield path, None, str(error).removeprefix(f"{path}: ")


def _within_a_nodes_bounds(document: dict) -> None:
    """ValueError when a Report holds more GPUs, NICs or links than any node (src/nodecheck/core/limits.py, as a snapshot is
    bounded): 10,000 GPUs took inspect --from 150 s and 2.7 GB, 50,000 a MemoryError."""
    from nodecheck.core.limits import MAX_GPUS, MAX_NICS, MAX_TOPO_DEVICES

    for key, bound in (("gpus", MAX_GPUS), ("nics", MAX_NICS), ("links", MAX_TOPO_DEVICES * MAX_TOPO_DEVICES // 2)):
        value = document.get(key)
        if isinstance(value, list) and len(value) > bound:
            raise ValueError(f"{len(value)} {key}, more than a node holds ({bound}): not read")


def read_report_file(path: Path):
    """A Report saved as JSON (`inspect --json`, `bench --json`: a job's rank 0 writes every node's figures), of
    any size such a job writes; NodecheckError naming the file when it is not one (another of nodecheck's
    documents, such as `fleet --json`, included: read leniently, any JSON object would pass as an empty Report)."""
    from nodecheck.core import typed_json
    from nodecheck.core.errors import NodecheckError
    from nodecheck.core.limits import MAX_JSON_DOCUMENT
    from nodecheck.host.files import read_user_file
    from nodecheck.report.model import Report

    data = read_user_file(path, MAX_JSON_DOCUMENT, "Report")
    try:
        document = typed_json.loads(data)
        schema = document.get("schema") if isinstance(document, dict) else None
        if schema != REPORT_SCHEMA:
            raise ValueError(f"its schema is {str(schema)[:60]!r}, not {REPORT_SCHEMA!r}" if schema else "it has no schema")
        _within_a_nodes_bounds(document)
        return Report.from_dict(document)
    except (ValueError, TypeError, RecursionError) as error:
        raise NodecheckError(f"{path}: not a nodecheck Report: {str(error)[:300]}") from None
