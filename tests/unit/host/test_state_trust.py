"""nodecheck's state is root's alone, and no one else can stall it: a state directory or file another user owns or
may write is refused (said, the checks it feeds unknown: its remembered Xid 79 would drain, its acknowledgements
hide real Xids), the lock file is 0600 (no one else may open it, so no one else may hold it), a lock held by another
process is waited on for a bounded time, never for ever, and the file never outgrows its own reader."""

import fcntl
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from helpers import UNIT_USER, raised_as_unit_user

from nodecheck.core.errors import NodecheckError
from nodecheck.host.live import LiveHost
from nodecheck.host.state import MAX_STATE_BYTES, STATE_FILE, _locked, acknowledge, boot_id, read_state, record_round
from nodecheck.pipeline import build_report
from nodecheck.probes.history import history_from
from nodecheck.report.events import Acknowledgement, CounterSample, LogMemory, XidEvent


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (to make files another user owns)")


def test_a_held_lock_is_waited_on_for_a_bounded_time(tmp_path):
    """`nobody` holding the lock made the prolog time out and drain, and inspect, clear and config check hang:
    now the write gives up within its wait and the round is kept in memory."""
    record_round(CounterSample(100.0, {"gpu/x/pcie_replays": 0}), 10.0, None, "boot", tmp_path)
    fd = os.open(tmp_path / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(NodecheckError, match="held by another process"), _locked(tmp_path, wait_s=0.3):
            pass
        assert time.monotonic() - started < 5
    finally:
        os.close(fd)
    with _locked(tmp_path, wait_s=0.3):  # released: had at once
        pass


def test_the_lock_is_no_one_elses_to_open(tmp_path):
    """An older nodecheck made the lock 0644; anyone could open it and flock() it. It is made 0600, and the units'
    unprivileged user can no longer open it."""
    needs_root()
    directory = Path(tempfile.mkdtemp(prefix="nodecheck-state-", dir="/tmp"))
    try:
        directory.chmod(0o755)
        (directory / ".lock").touch(mode=0o644)
        (directory / ".lock").chmod(0o644)
        acknowledge(Acknowledgement("gpu_xid", "gpu3", 5, 1, "ops", 1.0), directory)
        assert (directory / ".lock").stat().st_mode & 0o777 == 0o600
        said = raised_as_unit_user(lambda: os.open(directory / ".lock", os.O_RDONLY))
        assert said.startswith("PermissionError"), said
    finally:
        shutil.rmtree(directory)


def xid79_state() -> dict:
    event = XidEvent("xid", "0000:18:00.0", 79, "GPU has fallen off the bus.", 1, 5_000_000)
    return {"boot_id": boot_id(), "acknowledgements": [], "samples": [],
            "kernel_log": {"events": [event.__dict__], "from_usec": 0, "upto_usec": 6_000_000}}


@pytest.mark.parametrize("how", ["owned by another user", "writable by others", "file writable by others"])
def test_a_state_another_user_could_write_is_refused_and_said(request, monkeypatch, how):
    """Its remembered Xid 79 drained a healthy node: now the state is not read, the history probe says why (a
    warning, no drain) and no gpu_xid comes of it."""
    needs_root()
    state = Path(tempfile.mkdtemp(prefix="nodecheck-state-", dir="/tmp"))  # where another user can reach
    request.addfinalizer(lambda: shutil.rmtree(state))
    state.chmod(0o755)
    (state / STATE_FILE).write_text(json.dumps(xid79_state()))
    if how == "owned by another user":
        os.chown(state, UNIT_USER, UNIT_USER)
    elif how == "writable by others":
        state.chmod(0o777)
    else:
        (state / STATE_FILE).chmod(0o666)
    with pytest.raises(NodecheckError, match="not trusted"):
        read_state(state)
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    report = build_report(LiveHost())  # this machine, with the planted state
    history = next(p for p in report.probes if p.name == "history")
    assert not history.ok and "not trusted" in history.error
    assert not [f for f in report.findings if f.kind == "gpu_xid" and f.subject.endswith("0000:18:00.0")]
    finding = next(f for f in report.findings if f.subject == "probe:history")
    assert finding.severity == "warning"


def test_the_same_state_trusted_is_read(tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps(xid79_state()))
    (tmp_path / STATE_FILE).chmod(0o644)
    history = history_from({"boot_id": boot_id(), "state": read_state(tmp_path)})
    assert [e.code for e in history.kernel_log.events] == [79]


def test_the_writer_stays_inside_the_readers_bound_keeping_acknowledgements(tmp_path):
    """~7,000 counters a sample grew the file past 1 MiB, which the reader forgets whole: every acknowledgement
    lost. The oldest samples go first; the acknowledgements stay."""
    for n in range(3):
        acknowledge(Acknowledgement("gpu_xid", f"gpu{n}", 5, 1, "ops", 1.0), tmp_path)
    counters = {f"ib/mlx5_{n // 100}/{n % 100}/port_rcv_errors_with_a_long_name": n for n in range(9_000)}
    events = [XidEvent("xid", "0000:18:00.0", 13, "x" * 100, n, n + 1) for n in range(500)]
    for round_ in range(4):
        record_round(CounterSample(100.0 + 100 * round_, counters), 10.0, LogMemory(events, 0, 1000), boot_id(), tmp_path)
        assert (tmp_path / STATE_FILE).stat().st_size <= MAX_STATE_BYTES
    state = read_state(tmp_path)
    assert state is not None and [a["subject"] for a in state["acknowledgements"]] == ["gpu0", "gpu1", "gpu2"]
    assert state["samples"] and state["samples"][-1]["uptime_s"] == 400.0  # the newest kept


@pytest.mark.parametrize("value", [-10 ** 300, 10 ** 300, -1])
def test_a_counter_no_hardware_holds_is_not_a_sample(value):
    raw = {"boot_id": "b", "state": {"boot_id": "b", "samples": [{"uptime_s": 5.0, "counters": {"gpu/x/pcie_replays": value}}]}}
    assert history_from(raw).samples == []
