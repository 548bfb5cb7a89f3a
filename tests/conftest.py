"""pytest's fixtures and markers; the helpers every test imports live in tests/helpers.py.

The tree: tests/unit/<package>/ mirrors src/nodecheck (in-process, on captured text, in-memory Reports and
snapshots: `pytest tests/unit` is the inner loop); tests/system/ runs real things (Slurm, Prometheus,
namespaces, the container, an API server, nodecheck as a process, sweeps of hostile input; marker `system`);
tests/gpu/ needs a GPU for most of its tests (marker `gpu` on each)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import REPO


@pytest.fixture(scope="session", autouse=True)
def private_state_directory(tmp_path_factory):
    """nodecheck keeps its state (acknowledgements, counter samples) under $STATE_DIRECTORY: the suite's own,
    never the machine's /var/lib/nodecheck (tests that run nodecheck in a subprocess inherit it)."""
    directory = tmp_path_factory.mktemp("state")
    previous = os.environ.get("STATE_DIRECTORY")
    machines = Path("/var/lib/nodecheck")
    had_one = machines.exists()
    os.environ["STATE_DIRECTORY"] = str(directory)
    yield directory
    if previous is None:
        os.environ.pop("STATE_DIRECTORY", None)
    else:
        os.environ["STATE_DIRECTORY"] = previous
    # a nodecheck run with an environment of its own (slurmd's, `env=`) writes the machine's state: a leak
    assert had_one or not machines.exists(), f"the suite created {machines}: a test ran nodecheck without STATE_DIRECTORY"


@pytest.fixture(scope="session", autouse=True)
def private_temp_directory():
    """The temporary directories of the suite and of the nodecheck processes it starts, in one directory removed at
    the end: a process a test kills on purpose (a crashed exporter, a killed bench, SIGKILL) cannot remove its
    nodecheck-serve-*, nodecheck-bench-* or nodecheck-nccl-tests-* directory, and left one in the machine's /tmp
    each run. It is made like /tmp (sticky, anyone may write), since munged, slurmd and the units' unprivileged
    user reach into the directories tests make there. Processes started with an environment of their own
    (`env=` without TMPDIR) still use /tmp."""
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="nodecheck-suite-tmp-"))
    directory.chmod(0o1777)
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(directory)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    yield directory
    if previous is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous
    tempfile.tempdir = None
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def private_bytecode_cache(tmp_path_factory):
    """Bytecode for the nodecheck processes the tests start, kept in the suite's own directory: where the machine
    sets PYTHONDONTWRITEBYTECODE (this sandbox does), each of hundreds of runs compiled every module again, 0.1 s a
    run; PYTHONPYCACHEPREFIX keeps the bytecode out of the checkout and the machine."""
    saved = {name: os.environ.get(name) for name in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    os.environ["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def system_install():
    """deploy/install.sh run as on a node: into a prefix every user can reach, with root's PATH starting at a
    python3 that must not be used (a pyenv-like one under a root-only home). Yields (command, install's result)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="nodecheck-install-"))
    try:
        base.chmod(0o755)
        trap = base / "root-only-home" / "bin"
        trap.mkdir(parents=True)
        (base / "root-only-home").chmod(0o700)
        (trap / "python3").write_text(f"#!/bin/sh\ntouch {base}/wrong-python-ran\nexit 1\n")
        (trap / "python3").chmod(0o755)
        env = dict(os.environ, NODECHECK_PREFIX=str(base / "opt"), NODECHECK_BIN=str(base / "bin"),
                   PATH=f"{trap}:{os.environ['PATH']}")
        result = subprocess.run(["sh", str(REPO / "deploy/install.sh")], env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        assert not (base / "wrong-python-ran").exists()
        yield base / "bin" / "nodecheck", result
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def processes():
    """Start daemons (an exporter, Prometheus, Alertmanager) for one test; each is ended with it."""
    started: list[subprocess.Popen] = []

    def start(argv: list[str], log: Path) -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pytest_collection_modifyitems(config, items):
    """Every test under tests/system/ carries the `system` marker: `-m "not system"` leaves them out."""
    system = REPO / "tests" / "system"
    for item in items:
        if system in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.system)
