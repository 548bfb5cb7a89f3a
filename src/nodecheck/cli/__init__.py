"""The command line: inspect, snapshot, config, bench, nccl-log, nccl-topo, nccl-job, check, serve, scale, prolog, healthcheck,
kernel-log, clear, fleet.
Each family of commands is a module of its own, holding its declarations and the calls they make; this
module registers them, in the order `--help` lists them, and is the entry point."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import typer

from nodecheck.cli.app import EXIT_USAGE, app
from nodecheck.core.errors import ConfigError

FAMILIES = ("inspect", "bench", "job", "serve", "scale", "slurm", "signals", "fleet")  # each registers its commands, in this order
FAMILY_OF = {"inspect": "inspect", "snapshot": "inspect", "config": "inspect", "bench": "bench", "nccl-log": "bench", "nccl-topo": "bench",
             "nccl-job": "job",
             "serve": "serve", "check": "serve", "scale": "scale", "prolog": "slurm", "healthcheck": "slurm",
             "kernel-log": "signals", "clear": "signals", "fleet": "fleet"}


def _families(argv: list[str], environ) -> tuple[str, ...]:
    """The command families to register. Run as the nodecheck command, only the family of the command it runs: the
    others' imports (the bench's, the exporter's) are start-up time `inspect` would pay for nothing. Everything for
    --help, completion, a command it does not know (typer says so), or when imported (tests, other programs)."""
    started_as_command = Path(argv[0]).name == "nodecheck" or argv[0].endswith(("nodecheck/__main__.py", "-m"))
    if not started_as_command or any(name.startswith("_") and name.endswith("_COMPLETE") for name in environ):
        return FAMILIES
    command = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
    return (FAMILY_OF[command],) if command in FAMILY_OF and "--help" not in argv[1:2] else FAMILIES


for _family in _families(sys.argv, os.environ):
    importlib.import_module(f"nodecheck.cli.{_family}")


def main() -> None:
    import signal

    from nodecheck.host.commands import kill_running_commands

    # SIGTERM (systemd, Slurm, a timeout) ends nodecheck like Ctrl-C: `finally` blocks remove temporary
    # files (an extracted snapshot), and commands it started are ended with it
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        app()
    except ConfigError as error:  # raised outside a command body (should not happen, but never a traceback)
        typer.echo(f"nodecheck: {error}", err=True)
        sys.exit(EXIT_USAGE)
    finally:
        kill_running_commands()
