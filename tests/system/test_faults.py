"""Bad input and faults: a hung or failing nvidia-smi, a hung NVML, a probe that raises. Each is a
clear, recorded failure; nothing raises out of the probe runner and nothing is left running."""

import os
import stat
import sys
import threading
import time
from pathlib import Path

import pytest
from fakes import fake_pynvml
from hypothesis import given, settings
from hypothesis import strategies as st

from nodecheck.core.errors import NoData, ParseError, ProbeFailed
from nodecheck.host.commands import kill_running_commands, run_command
from nodecheck.host.live import LiveHost
from nodecheck.host.snapshot import RecordingHost, SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.probes import PROBES, Probe, run_probes
from nodecheck.probes.nics import parse_nics
from nodecheck.probes.nvml import dump_nvml


def fake_binary(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_hung_command_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    hung = fake_binary(tmp_path, "nvidia-smi", f"sleep 30 & echo $! > {pidfile}; wait")
    started = time.monotonic()
    with pytest.raises(ProbeFailed, match="did not finish within 0.5 s and was killed"):
        run_command([hung, "topo", "-m"], timeout=0.5)
    assert time.monotonic() - started < 5
    time.sleep(0.1)
    assert not alive(int(pidfile.read_text()))  # the grandchild went with the process group


def alive(pid: int) -> bool:
    """Running, not a zombie (in a container PID 1 may never reap the orphan)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_failing_and_missing_commands(tmp_path):
    failing = fake_binary(tmp_path, "nvidia-smi", 'echo "Failed to initialize NVML: Driver/library version mismatch" >&2; exit 18')
    with pytest.raises(ProbeFailed, match="exited with 18: Failed to initialize NVML"):
        run_command([failing], timeout=5)
    with pytest.raises(NoData, match="not found on PATH"):
        run_command(["nodecheck-no-such-binary"], timeout=5)


def test_garbage_from_nvidia_smi_is_a_failed_probe_not_invented_gpus(tmp_path, monkeypatch):
    fake_binary(tmp_path, "nvidia-smi", "head -c 300 /dev/urandom")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    (result,) = run_probes(LiveHost(), [p for p in PROBES if p.name == "nvidia_smi_topo"]).values()
    assert not result.ok and not result.no_data and "not `nvidia-smi topo -m` output" in result.error


def with_nvidia_devices(root):
    """A LiveHost whose root has /dev/nvidiactl, so NVML is asked (the fake pynvml answers)."""
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / "nvidiactl").touch()
    return LiveHost(root)


def test_without_nvidiactl_nvml_is_not_even_imported(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # an import would raise ImportError
    with pytest.raises(NoData, match="no NVIDIA driver: no /dev/nvidiactl"):
        LiveHost(tmp_path).nvml(timeout=5, dump=dump_nvml)


def test_hung_nvml_does_not_hold_the_agent_nor_gain_a_thread_per_round(tmp_path, monkeypatch):
    module = fake_pynvml.replaying([])
    release = threading.Event()
    module.nvmlInit = lambda: release.wait(30)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    try:
        started = time.monotonic()
        with pytest.raises(ProbeFailed, match="NVML did not answer within 0.3 s"):
            with_nvidia_devices(tmp_path).nvml(timeout=0.3, dump=dump_nvml)
        assert time.monotonic() - started < 2
        threads = threading.active_count()
        for _ in range(5):  # later probe rounds: refused at once while the first call is stuck
            with pytest.raises(ProbeFailed, match="NVML has not returned from a call made"):
                with_nvidia_devices(tmp_path).nvml(timeout=0.3, dump=dump_nvml)
        assert threading.active_count() == threads
    finally:
        release.set()
    module.nvmlInit = lambda: None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # once the stuck call returns, NVML is asked again
        try:
            assert with_nvidia_devices(tmp_path).nvml(timeout=2, dump=dump_nvml)["gpus"] == []
            break
        except ProbeFailed:
            time.sleep(0.05)
    else:
        pytest.fail("NVML was never asked again after the stuck call returned")


def test_absurd_gpu_count_from_nvml_is_refused(tmp_path, monkeypatch):
    module = fake_pynvml.replaying([])
    module.nvmlDeviceGetCount = lambda: 10**6
    monkeypatch.setitem(sys.modules, "pynvml", module)
    with pytest.raises(ProbeFailed, match="NVML reports 1000000 GPUs"):
        with_nvidia_devices(tmp_path).nvml(timeout=5, dump=dump_nvml)


def test_commands_still_running_end_with_nodecheck(tmp_path):
    """A hung command run_command started ends when nodecheck stops (kill_running_commands), with its process."""
    pidfile = tmp_path / "pid"
    hung = fake_binary(tmp_path, "nvidia-smi", f"echo $$ > {pidfile}; exec sleep 60")
    errors = []
    worker = threading.Thread(target=lambda: errors.append(pytest.raises(ProbeFailed, run_command, [hung], 60)))
    worker.start()
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    kill_running_commands()
    worker.join(10)
    assert not worker.is_alive() and not alive(int(pidfile.read_text()))


def test_a_command_stopped_as_it_starts_is_not_missed(tmp_path, monkeypatch):
    """kill_running_commands() in the moment between a command's start and run_command's record of it (a daemon
    stopping then; once in a loaded suite run the test above stopped there): the command is killed, not left to run.
    The moment is widened to half a second by a Popen that returns late."""
    import subprocess

    started = threading.Event()

    class ReturnsLate(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.set()
            time.sleep(0.5)

    monkeypatch.setattr(subprocess, "Popen", ReturnsLate)
    hung = fake_binary(tmp_path, "nvidia-smi", "exec sleep 60")
    raised = []
    worker = threading.Thread(target=lambda: raised.append(pytest.raises(ProbeFailed, run_command, [hung], 60)))
    worker.start()
    assert started.wait(10)
    kill_running_commands()
    worker.join(10)
    assert not worker.is_alive() and len(raised) == 1


def test_runner_records_raising_and_hanging_probes():
    def boom(host, timeout):
        raise KeyError("bug")

    probes = [Probe("boom", boom, 1), Probe("hang", lambda h, t: time.sleep(30), 0.2),
              Probe("fine", lambda h, t: "facts", 1)]
    started = time.monotonic()
    results = run_probes(None, probes, grace=0.1)
    assert time.monotonic() - started < 3
    assert results["boom"].error == "internal error: KeyError: 'bug'" and not results["boom"].ok
    assert results["hang"].error.startswith("did not return within") and not results["hang"].ok
    assert results["hang"].timed_out and not results["boom"].timed_out
    assert results["fine"].ok and results["fine"].facts == "facts"


text_or_none = st.none() | st.text(max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.dictionaries(st.sampled_from(
    ["link", "operstate", "speed", "mtu", "type", "driver", "numa_node", "address"]), text_or_none), max_size=4),
    st.dictionaries(st.text(max_size=8), st.fixed_dictionaries({"device": text_or_none, "netdevs": st.lists(st.text(max_size=8), max_size=2),
                    "ports": st.dictionaries(st.text(max_size=3), st.dictionaries(st.sampled_from(["rate", "state", "link_layer"]), text_or_none))}), max_size=3),
    st.one_of(st.none(), st.text()))
def test_fuzz_nic_parsers(netdevs, rdma, routes):
    try:
        parse_nics(netdevs, rdma, {}, routes)
    except ParseError:
        pass


@pytest.mark.parametrize("counters", ["1\n", ["1"], {"symbol_error": 3}])
def test_an_ib_ports_counters_not_a_table_of_texts_are_a_parse_error(counters):
    """Found by tests/fuzz (seed 20261125): a snapshot whose port `counters` was text crashed the NIC parser with
    AttributeError, where every other wrong shape is a ParseError."""
    rdma = {"mlx5_0": {"device": None, "netdevs": [], "ports": {"1": {"state": "4: ACTIVE", "counters": counters}}}}
    with pytest.raises(ParseError, match="mlx5_0"):
        parse_nics({}, rdma, {}, None)
    healthy = {"mlx5_0": {"device": None, "netdevs": [], "ports": {"1": {"state": "4: ACTIVE", "counters": {"symbol_error": "3\n"}}}}}
    assert parse_nics({}, healthy, {}, None).rdma_devices["mlx5_0"][0].counters == {"symbol_error": 3}




def test_hung_nvidia_smi_is_an_error_that_replays_from_a_snapshot(tmp_path, monkeypatch):
    """Killed at the (capped) probe deadline, recorded as timed out, an error finding; a snapshot taken
    meanwhile replays the same timeout."""
    fake_binary(tmp_path, "nvidia-smi", "sleep 30")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    recording = RecordingHost(LiveHost())
    started = time.monotonic()
    report = build_report(recording, probe_timeout=0.5)
    assert time.monotonic() - started < 10
    outcome = {p.name: p for p in report.probes}["nvidia_smi_topo"]
    assert outcome.timed_out and "did not finish within 0.5 s" in outcome.error
    finding = next(f for f in report.findings if f.subject == "probe:nvidia_smi_topo")
    assert (finding.severity, finding.measured) == ("error", "timed out")
    replayed = build_report(SnapshotHost(recording.write(tmp_path / "snap")))
    assert {p.name: p for p in replayed.probes}["nvidia_smi_topo"].timed_out


def test_a_new_source_is_its_module_and_a_row(tmp_path, monkeypatch):
    """Table-driven probes: a source declared as one Probe (name, collect through the host, timeout, fill)
    is run, recorded and replayed like the others, fills its part of the Report, and can be disabled."""
    from helpers import make_snapshot

    import nodecheck.probes as registry
    from nodecheck.config import Config

    def collect(host, timeout):
        text = host.read_text("/sys/class/dmi/id/product_name")
        if text is None:
            raise NoData("no DMI product name")
        return text.strip()

    def fill(report, product):
        report.node["product"] = product

    dmi = Probe("dmi", collect, 5.0, fill)
    monkeypatch.setattr(registry, "PROBES", [*registry.PROBES, dmi])
    monkeypatch.setattr("nodecheck.pipeline.PROBES", registry.PROBES)
    snap = make_snapshot(tmp_path / "snap")
    (snap / "fs/sys/class/dmi/id").mkdir(parents=True)
    (snap / "fs/sys/class/dmi/id/product_name").write_text("ProLiant XL675d Gen10 Plus\n")
    report = build_report(SnapshotHost(snap))
    assert report.node.get("product") == "ProLiant XL675d Gen10 Plus", report.probes
    off = build_report(SnapshotHost(snap), Config(disabled_probes=["dmi"]))
    assert "product" not in off.node and {p.name: p.no_data for p in off.probes}["dmi"]


def test_each_probe_stops_at_its_own_deadline_not_the_slowests(tmp_path):
    """Issue 21 (2): a hostile PCIe tree kept the walk going 16.3 s and it was recorded ok, since only the
    slowest probe's deadline was enforced. Every read of the host now checks the probe's own deadline:
    a probe walking without end stops at its next read and is recorded as timed out; one that returns
    past its deadline is not used."""
    import time

    from helpers import make_snapshot

    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.probes import Probe, run_probes

    host = SnapshotHost(make_snapshot(tmp_path / "snap"))
    reads = []

    def endless_walk(host, timeout):
        while True:  # a tree with no end: every step reads the host
            reads.append(time.monotonic())
            host.list_dir("/sys/bus/pci/devices")

    def late(host, timeout):
        time.sleep(timeout + 1.5)  # returns, but after its own deadline (and before the slowest probe's)
        return {"facts": 1}

    probes = [Probe("walker", endless_walk, 0.5, None), Probe("late", late, 0.5, None), Probe("slow", lambda h, t: time.sleep(4), 6.0, None)]
    results = run_probes(host, probes=probes, grace=1.0)
    walker, slow_one = results["walker"], results["late"]
    assert walker.timed_out and not walker.ok and "stopped at its deadline" in walker.error, walker
    seen = len(reads)
    time.sleep(0.5)
    assert seen and len(reads) == seen  # it stopped, rather than walking on in the background once given up
    assert slow_one.timed_out and not slow_one.ok and "past its deadline of 0.5 s" in slow_one.error, slow_one
    assert results["slow"].ok


def test_a_listing_is_bounded_like_a_file(tmp_path):
    """Issue 21 (2): a 14.8 MB recorded listing put 1.43 M IOMMU entries in the Report. Live and recorded
    listings stop at MAX_DIR_ENTRIES names."""
    import json

    from helpers import make_snapshot

    from nodecheck.core.limits import MAX_DIR_ENTRIES
    from nodecheck.host.live import LiveHost
    from nodecheck.host.snapshot import SnapshotHost

    snap = make_snapshot(tmp_path / "snap")
    (snap / "fs-dirs.json").write_text(json.dumps({"/sys/kernel/iommu_groups": [str(i) for i in range(MAX_DIR_ENTRIES * 3)]}))
    assert len(SnapshotHost(snap).list_dir("/sys/kernel/iommu_groups")) == MAX_DIR_ENTRIES
    wide = tmp_path / "wide"
    wide.mkdir()
    for i in range(MAX_DIR_ENTRIES + 10):
        (wide / str(i)).touch()
    assert len(LiveHost(str(tmp_path)).list_dir("/wide")) == MAX_DIR_ENTRIES


def test_a_hung_tools_setsid_grandchildren_die_with_it(tmp_path):
    """A hung tool's children that called setsid() left its process group: the kill at the time limit missed them
    and they outlived it. The whole tree is killed now, read from /proc before the kill."""
    from helpers import fake_executable

    from nodecheck.core.errors import TimedOut
    from nodecheck.host.commands import run_command

    pidfile = tmp_path / "escaped"
    tool = fake_executable(tmp_path / "tool", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 600' &\nsleep 600\n")
    with pytest.raises(TimedOut):
        run_command([str(tool)], 1.0, what="tool")
    escaped = int(pidfile.read_text())

    def alive() -> bool:
        try:
            return "sleep" in (Path(f"/proc/{escaped}/cmdline").read_text()) and \
                Path(f"/proc/{escaped}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(), f"pid {escaped} outlived the kill"
