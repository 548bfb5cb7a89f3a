"""Command-line arguments, in-process (typer's runner): usage errors exit 2 and say what was wrong,
before anything is probed or measured."""

import pytest
from typer.testing import CliRunner

from nodecheck import __version__
from nodecheck.cli import app


def run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("args, says", [
    (["bench", "--quick", "--full"], "--quick and --full exclude each other"),
    (["bench", "--from", "snap.tar.gz"], "--from goes with --nccl-log"),
    (["scale", "--params", "25M"], "give one of --step-time SECONDS or --flops N"),
    (["scale", "--params", "25M", "--step-time", "0.2", "--grad-dtype", "fp13", "--busbw", "10Gbit/s"], "--grad-dtype 'fp13'"),
    (["scale", "--params", "25M", "--step-time", "0.2"], "give --busbw RATE, or --from a Report"),
    (["serve", "--listen", "localhost"], "expected HOST:PORT"),
])
def test_usage_errors_exit_2_naming_the_argument(args, says):
    result = run(*args)
    assert result.exit_code == 2 and says in result.output, result.output


def test_version():
    for flag in ("--version", "-V"):
        result = run(flag)
        assert result.exit_code == 0 and result.output.strip() == f"nodecheck {__version__}"


def test_shell_completion_completes_commands():
    import os
    import subprocess
    import sys

    env = dict(os.environ, _NODECHECK_COMPLETE="complete_bash", COMP_WORDS="nodecheck ins", COMP_CWORD="1")
    done = subprocess.run([sys.executable, "-c", "from nodecheck.cli import app; app(prog_name='nodecheck')"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["inspect"]
