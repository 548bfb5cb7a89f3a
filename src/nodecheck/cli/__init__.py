"""The command line: inspect, snapshot, config, bench, nccl-log, check, serve, scale, prolog, healthcheck,
kernel-log, clear, fleet.
Each family of commands is a module of its own, holding its declarations and the calls they make; this
module registers them, in the order `--help` lists them, and is the entry point."""

from __future__ import annotations

import importlib
import sys

import typer

from nodecheck.cli.app import EXIT_USAGE, app
from nodecheck.core.errors import ConfigError

for _family in ("inspect", "bench", "serve", "scale", "slurm", "signals", "fleet"):  # each registers its commands, in this order
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
