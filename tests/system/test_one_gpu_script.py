"""benchmarks/one_gpu_node.py (issue 26, items 2 to 4): the script for the next lease of the one-GPU machine, proved
here. The error-signal rows are judged on the real H100 node's NVML values (its capture, through the real reader and
the real Report and exporter); the copy rows on the worker's result shape with the real H100 run's figures; and the
whole script runs here, without a GPU, so that its steps, the unit's privileges included, are known to work."""

import copy
import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import REPO, h100_node_snapshot, requires_root, write_pci_tree

from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.prometheus.exposition import exposition

sys.path.insert(0, str(REPO / "benchmarks"))
import one_gpu_node as script  # noqa: E402

GPU = "0000:00:06.0"  # the H100's address in its VM
BRIDGE = "0000:00:01.0"


@pytest.fixture
def h100(tmp_path):
    """(NVML's raw answers, the Report as inspect --json prints it, the metrics) of the captured H100 node, with a
    PCIe path of the GPU behind a bridge whose AER files exist (the GPU's do not)."""
    snap = h100_node_snapshot(tmp_path / "snap")
    write_pci_tree(snap, {BRIDGE: ("0x060400", "pci0000:00/0000:00:01.0", 16, 16, "32.0 GT/s PCIe"),
                          GPU: ("0x030200", "pci0000:00/0000:00:01.0/0000:00:06.0", 16, 16, "32.0 GT/s PCIe")},
                   aer={BRIDGE: {"correctable": 2, "nonfatal": 0, "fatal": 0}})
    report = build_report(SnapshotHost(snap))
    return json.loads((snap / "nvml.json").read_text()), report.to_dict(), exposition(report).decode(), snap


def verdicts(rows) -> dict[str, str]:
    return {r.figure: r.verdict for r in rows}


def test_the_h100s_counters_are_carried_through_and_its_nvlink_counters_said_unsupported(h100):
    nvml, report, metrics, _ = h100
    assert nvml["gpus"][0]["nvlinks"][0]["state"] == {"error": "Not Supported"}  # what the PCIe H100 answered
    rows = {r.figure: r for r in script.signal_rows(nvml, report, metrics)}
    assert rows["gpu0 pcie_replays"].verdict == "ok" and rows["gpu0 pcie_replays"].value == "0"
    assert rows["gpu0 clock_event_reasons"].verdict == "ok" and rows["gpu0 clock_event_reasons"].value == "0x0"
    nvlink = rows["gpu0 NVLink error counters"]
    assert (nvlink.value, nvlink.verdict) == ("NVML: Not Supported", "ok")


def test_the_fabric_row_carries_nvmls_answer_through(h100):
    """The H100 VM's GPU has no NVSwitch: NVML's Not Supported must reach the Report as not_supported, with no
    series; a registered GPU's answer must reach both, and a series exported for an unsupported one fails."""
    nvml, report, metrics, _ = h100
    row = {r.figure: r for r in script.signal_rows(nvml, report, metrics)}["gpu0 NVLink fabric"]
    assert (row.value, row.verdict) == ("NVML: Not Supported", "ok")
    stray = metrics + 'nodecheck_gpu_fabric_registered{gpu="0"} 0.0\n'
    assert verdicts(script.signal_rows(nvml, report, stray))["gpu0 NVLink fabric"].startswith("FAILED")
    registered = copy.deepcopy(nvml)
    registered["gpus"][0]["fabric"] = {"state": 3, "status": 0, "status_text": "Success"}
    said = copy.deepcopy(report)
    said["gpus"][0]["fabric"] = {"state": "completed", "status": "Success"}
    series = metrics + 'nodecheck_gpu_fabric_registered{gpu="0"} 1.0\n'
    row = {r.figure: r for r in script.signal_rows(registered, said, series)}["gpu0 NVLink fabric"]
    assert (row.value, row.verdict) == ("state 3, status 0 (Success)", "ok")
    assert verdicts(script.signal_rows(registered, report, series))["gpu0 NVLink fabric"].startswith("FAILED")


def test_a_zero_exported_for_an_unsupported_counter_fails(h100):
    nvml, report, metrics, _ = h100
    zero = metrics + 'nodecheck_gpu_nvlink_errors{counter="replay",gpu="0"} 0.0\n'
    assert verdicts(script.signal_rows(nvml, report, zero))["gpu0 NVLink error counters"].startswith("FAILED")
    unsupported = copy.deepcopy(nvml)
    unsupported["gpus"][0]["pcie_replays"] = {"error": "Not Supported"}
    row = {r.figure: r for r in script.signal_rows(unsupported, report, metrics)}["gpu0 pcie_replays"]
    assert row.value == "NVML: Not Supported" and row.verdict.startswith("FAILED")  # the Report still says 0


def test_a_counter_the_report_lost_fails(h100):
    nvml, report, metrics, _ = h100
    lost = copy.deepcopy(report)
    lost["gpus"][0]["signals"]["pcie_replays"] = None
    assert verdicts(script.signal_rows(nvml, lost, metrics))["gpu0 pcie_replays"].startswith("FAILED")


def test_aer_files_as_read_beside_sysfs(h100):
    _, report, _, snap = h100
    listed = script.list_aer_files(report, snap / "fs/sys/bus/pci/devices")
    assert listed[GPU] == {GPU: [], BRIDGE: ["aer_dev_correctable", "aer_dev_fatal", "aer_dev_nonfatal"]}
    (row,) = script.aer_rows(report, listed)
    assert (row.value, row.reference, row.verdict) == ("1 of 2 read", "1 of 2 in sysfs", "ok")
    listed[GPU][GPU] = ["aer_dev_correctable"]  # sysfs has files the Report did not read
    assert script.aer_rows(report, listed)[0].verdict.startswith("FAILED")


def worker_result(made=(3, 3), nodes=(0, 0), cpus=("0-7", "8-15")) -> dict:
    """The copy worker's answer for GPU 0 measured twice, its rows the real H100 run's 256 MiB pinned figures
    (tests/fixtures/h100-vm-1gpu/live-bench-full.json) with the fields this session added."""
    bench = json.loads((REPO / "tests/fixtures/h100-vm-1gpu/live-bench-full.json").read_text())
    (row,) = [r for r in bench["measurements"][0]["details"]["rows"] if r["size_bytes"] == 256 << 20 and r["memory"] == "pinned"]
    return {"gpus": [{"index": 0, "cpus": c, "pinned_blocks_created": m,
                      "rows": [dict(row, host_numa_node=n, host_address=hex(0x7F0000000000 + i * (256 << 20)))]}
                     for i, (m, n, c) in enumerate(zip(made, nodes, cpus, strict=True))]}


TWO_NODES = {"nodes": {"0": list(range(8)), "1": list(range(8, 16))}}


def test_gpu_0_twice_gets_fresh_pinned_buffers_on_each_passes_node():
    rows = verdicts(script.copy_twice_rows(worker_result(nodes=(0, 1)), TWO_NODES))
    assert rows["copy: pinned blocks made, pass 1 / 2"] == "ok"
    assert rows["copy: host buffer address, pass 1 / 2"] == "ok"
    assert rows["copy: buffer NUMA node, pass 1 (CPUs 0-7)"] == "ok" and rows["copy: buffer NUMA node, pass 2 (CPUs 8-15)"] == "ok"


def test_a_figure_wider_than_its_column_is_written_whole():
    """The lent H100's run (2026-11-28) printed its buffer addresses cut to the column: 0x7f7bfc00000 for
    0x7f7bfc000000, one hex digit short, and the H200's earlier figure was copied into the docs so."""
    from figures import Row, render

    rows = [Row("copy: host buffer address, pass 1 / 2", "0x7f7c6a000000 / 0x7f7bfc000000", "-", None, "logged", "ok")]
    out = render(rows, value_width=30)
    assert "0x7f7bfc00000 " not in out and "    value: 0x7f7c6a000000 / 0x7f7bfc000000" in out.splitlines()
    assert out.splitlines()[1].endswith("logged          ok") and "~" in out.splitlines()[1]  # cut, and said so
    assert "reference:" not in out  # the short one stays in its column


def test_a_reused_block_or_a_buffer_on_the_wrong_node_fails():
    assert verdicts(script.copy_twice_rows(worker_result(made=(3, 0)), TWO_NODES))["copy: pinned blocks made, pass 1 / 2"].startswith("FAILED")
    wrong = verdicts(script.copy_twice_rows(worker_result(nodes=(0, 0)), TWO_NODES))
    assert wrong["copy: buffer NUMA node, pass 2 (CPUs 8-15)"].startswith("FAILED")
    assert verdicts(script.copy_twice_rows(worker_result(made=(None, None)), TWO_NODES))[
        "copy: pinned blocks made, pass 1 / 2"].startswith("n/a")
    failed = script.copy_twice_rows({"error": {"type": "RuntimeError", "message": "CUDA is not available"}}, TWO_NODES)
    assert failed[0].verdict == "FAILED (CUDA is not available)"


def test_torch_seeing_fewer_gpus_must_be_a_named_failure():
    named = {"measurements": [{"test": "h2d", "ok": False, "error": "h2d on gpu0 failed: RuntimeError: CUDA is not available to torch "
                                                                  "2.11.0: CUDA_VISIBLE_DEVICES='' hides every GPU from this process"}]}
    assert script.fewer_rows(named, {"rc": 1})[0].verdict == "ok"
    unnamed = {"measurements": [{"test": "h2d", "ok": False, "error": "h2d on gpu0 failed: RuntimeError: CUDA is not available"}]}
    assert script.fewer_rows(unnamed, {"rc": 1})[0].verdict.startswith("FAILED")
    assert script.fewer_rows({}, {"rc": 1, "stderr": "Traceback"})[0].verdict.startswith("FAILED")


def test_quick_runs_cold_and_warm_and_a_wrong_data_check():
    steps = {"quick-cold-1": {"rc": 0, "wall_s": 7.5}, "quick-warm-1": {"rc": 0, "wall_s": 4.8}, "drop-1": {"ok": False, "why": "EPERM"},
             "quick-cold-2": {"rc": 0, "wall_s": 12.0}, "drop-2": {"ok": True}}
    rows = verdicts(script.quick_rows(steps))
    assert rows == {"bench --quick wall, cold run 1 (cache kept)": "ok", "bench --quick wall, warm run 1": "ok",
                    "bench --quick wall, cold run 2": "HIGH"}
    checks = {"rows": [{"check": "copy", "size_bytes": 256 << 20, "check_s": 0.01, "measurement_s": 0.2, "ratio": 0.05,
                        "wrong_elements": 0},
                       {"check": "allreduce", "size_bytes": 1 << 30, "check_s": 0.05, "measurement_s": 0.5, "ratio": 0.1,
                        "wrong_elements": 7}]}
    assert list(verdicts(script.data_check_rows(checks)).values()) == ["measured", "FAILED (7 wrong elements)"]


def test_the_whole_script_runs_here_and_the_unit_cannot_read_kmsg(tmp_path):
    """The real steps on this machine (no GPU: those rows fail, named). The unit's step runs unprivileged with
    /dev/kmsg made unreadable, so its kernel log comes from the journal or is a named unknown, never /dev/kmsg."""
    requires_root()
    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    pytest.importorskip("torch", reason="needs torch (sh deploy/install.sh bench)")
    out, scratch = tmp_path / "run", tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run([sys.executable, str(REPO / "benchmarks/one_gpu_node.py"), "--out", str(out), "--data-check-sizes", "1MiB",
                           "--keep-page-cache"],  # the suite's machine is shared: its page cache is not ours to drop
                          capture_output=True, text=True, timeout=600, cwd=REPO, env=dict(os.environ, TMPDIR=str(scratch)))
    assert done.returncode in (1, 2), done.stdout + done.stderr[-3000:]
    assert list(scratch.iterdir()) == []  # no step, the unit's included, left a temporary file behind
    steps = json.loads((out / "steps.json").read_text())
    assert {"nvml", "inspect", "metrics", "unit", "copy-twice", "fewer", "data-check", "quick-cold-3", "quick-warm-3"} <= set(steps)
    unit = json.loads((out / "inspect-unit.json").read_text())
    assert unit["kernel_log"]["source"] != "/dev/kmsg" and (unit["kernel_log"]["known"] or unit["kernel_log"]["why"]), unit["kernel_log"]
    assert "/dev/kmsg: permission denied" in (unit["kernel_log"]["why"] or "/dev/kmsg: permission denied"), unit["kernel_log"]
    assert "kernel log under the unit's privileges" in done.stdout and "data check allreduce, 1 MiB" in done.stdout, done.stdout
    assert "bench --quick wall, cold run 3 (cache kept)" in done.stdout, done.stdout
    (check,) = [r for r in json.loads((out / "data-check.json").read_text())["rows"] if r["check"] == "allreduce"]
    assert check["wrong_elements"] == 0 and check["check_s"] > 0 and check["measurement_s"] > 0
    replayed = subprocess.run([sys.executable, str(REPO / "benchmarks/one_gpu_node.py"), "--replay", str(out)],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
    assert replayed.stdout == done.stdout and replayed.returncode == done.returncode


def test_the_lease_runs_every_file_that_holds_gpu_tests():
    """gpu_node.sh's gpu step names the files to collect (an offline node lacks the test extra's packages that
    other files import): a gpu test added to another file must be added there too, or the lease skips it."""
    import re

    step = re.search(r"^gpu\(\) \{.*$", (REPO / "benchmarks/gpu_node.sh").read_text(), re.M)[0]
    named = set(re.findall(r"tests/(?:[a-z]+/)*(test_\w+\.py)", step))
    marked = {path.name for path in (REPO / "tests").rglob("test_*.py") if re.search(r"pytest\.mark\.gpu\b", path.read_text())}
    assert named == marked


HOSTILE = ['[]', '"text"', '{"gpus": [1, "x", {"signals": [], "index": "0", "pci_bus_id": 5, "nvlinks": {}}], "rows": [{"check": 1}, 2], '
           '"measurements": [{"ok": true, "bytes_per_second": "x", "path": 3, "test": "h2d"}, "m"]}',
           '{"quick-1": {"rc": 0}, "quick-cold-1": "x", "quick-warm-2": {"wall_s": "slow", "rc": 0}, "fewer": [], "nvml": {"wall_s": "slow"}, "unit": 7}',
           '{"pcie_paths": {"0000:00:06.0": [1, {"bdf": []}], "x": "y"}, "gpus": [{"pci_bus_id": "0000:00:06.0", "signals": {"pcie_replays": "0"}}]}',
           '{"nodes": {"x": "y", "0": [1]}, "passes": 3, "kernel_log": {"known": "maybe", "events": 5}}',
           '{"gpus": [{"rows": "x", "cpus": 5}, {"rows": [{"memory": "pinned", "h2d": "fast", "host_numa_node": []}], "pinned_blocks_created": "3"}]}',
           '{"rows": [{"check": "copy", "size_bytes": "big", "check_s": "x", "measurement_s": 0, "wrong_elements": "none"}]}',
           'nodecheck_gpu_nvlink_errors{gpu="0"} 0\n  Running device_to_device_memcpy_write_ce.\n 0 1\n 0 N/A 1.5\n', '\x00\xff garbage']


@pytest.mark.parametrize("seed", range(40))
def test_a_hostile_folder_is_judged_or_refused_never_a_traceback(tmp_path, seed, capsys):
    """--replay reads a folder a person may have pasted into and edited: whatever each file holds, both scripts
    print their table or say they cannot judge it (exit 2), and never raise."""
    import random

    import multi_gpu_node

    rng = random.Random(seed)
    names = ["steps.json", "inspect.json", "copy-twice.json", "cpusets.json", "fewer.json", "nvml.json", "nodecheck.prom",
             "aer-files.json", "inspect-unit.json", "data-check.json", "nvml.txt", "p2p.json", "nvbandwidth.txt", "allreduce.json",
             "nccl-nvls-on.txt", "nccl-nvls-off.txt", "h2d.json", "h2d-gpu0.json", "quick-1.json"]
    for name in names:
        (tmp_path / name).write_text(rng.choice(HOSTILE))
    for main in (script.main, multi_gpu_node.main):
        assert main(["--replay", str(tmp_path)]) in (0, 1, 2)
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(("name", "scripts"), [("steps.json", ("one", "multi")), ("nvml.txt", ("multi",)),
                                             ("inspect.json", ("one",))])
def test_a_fifo_or_an_oversized_file_in_the_folder_is_refused_not_waited_on(tmp_path, name, scripts, capsys):
    """A FIFO in a replay folder once hung both scripts (an open waits for a writer that never comes), and a
    file past the read bound was cut short and judged from part of a run's output. Both are named, exit 2."""
    import os

    import multi_gpu_node
    from figures import MAX_READ

    mains = {"one": script.main, "multi": multi_gpu_node.main}
    os.mkfifo(tmp_path / name)
    for which in scripts:
        assert mains[which](["--replay", str(tmp_path)]) == 2
        assert f"{name}: not a regular file" in capsys.readouterr().err, which
    (tmp_path / name).unlink()
    with open(tmp_path / name, "wb") as big:
        big.truncate(MAX_READ + 1)  # sparse: no 16 MiB written
    for which in scripts:
        assert mains[which](["--replay", str(tmp_path)]) == 2
        assert f"{name}: larger than 16 MiB" in capsys.readouterr().err, which
