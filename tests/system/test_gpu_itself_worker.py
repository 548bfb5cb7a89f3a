"""The GPU's own tests' worker itself (src/nodecheck/bench/gpu_itself_worker.py), run for real with torch's CPU tensors (`--device
cpu`: the same steps on the host's memory, timed by the wall clock) beside a runner that starts one per GPU at once;
its figures judge nothing here, its plumbing everything: buffers sized from what is free, the copied bytes checked,
a worker killed on the way leaving nothing behind."""

import dataclasses
import json
import subprocess
import sys
import time

import pytest
from helpers import h100_node_snapshot

from nodecheck.bench import gpu_itself
from nodecheck.bench.gpu_itself_worker import MIN_BUFFER_BYTES, buffer_bytes
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report

pytest.importorskip("torch", reason="needs torch (sh deploy/install.sh bench)")


def three_gpus(tmp_path):
    report = build_report(SnapshotHost(h100_node_snapshot(tmp_path / "h")))
    (gpu,) = report.gpus
    return dataclasses.replace(report, gpus=[dataclasses.replace(gpu, index=i, uuid=f"GPU-{i}") for i in range(3)])


def test_one_worker_per_gpu_at_once_each_copy_checked(tmp_path):
    measurements = gpu_itself.hbm_tests(three_gpus(tmp_path), "quick", 120, device="cpu")
    assert [m.path for m in measurements] == ["gpu0:memory", "gpu1:memory", "gpu2:memory"]
    for m in measurements:
        assert m.ok, m.error
        assert m.payload_bytes == 64 << 20 and m.details["device"] == "cpu"  # 512 MiB "free" x 0.25 / 2
        assert m.details["data_check"]["wrong_elements"] == 0 and m.bytes_per_second > 0
        assert m.details["data_check"]["elements"] == 2 * (64 << 20) // 4  # every word, both patterns
        assert m.details["data_check"]["seconds"] > 0  # what the check added to the run, as the worker timed it
        assert m.details["siblings"] == 3 and m.details["sibling_ratio"] > 0


def test_gemm_on_each_gpu_at_once_gives_the_same_bits_on_every_one(tmp_path):
    """The silent-data-corruption check for real: inputs made from one seed on the CPU, the multiply done twice in
    each worker and compared across the workers of one model: the same bits everywhere on healthy hardware."""
    from nodecheck.config import Config
    from nodecheck.verdicts.bandwidth import measurement_findings

    measurements = gpu_itself.gpu_tests(three_gpus(tmp_path), {"gemm"}, "quick", 120, device="cpu")
    assert [m.path for m in measurements] == ["gpu0:compute", "gpu1:compute", "gpu2:compute"]
    for m in measurements:
        assert m.ok and m.flops_per_second > 0 and m.bytes_per_second is None, m.error
        check = m.details["result_check"]
        assert check["repeat_agrees"] and (check["agreeing"], check["of"]) == (3, 3) and check["usual"] == check["digests"][0]
        assert check["seconds"] > 0
    assert not [f for f in measurement_findings(measurements, Config()) if f.kind == "gpu_result_mismatch"]


def test_a_worker_killed_on_the_way_is_a_failure_and_leaves_no_process(tmp_path):
    report = three_gpus(tmp_path)
    report.gpus = report.gpus[:1]
    (m,) = gpu_itself.hbm_tests(report, "full", 1.0, device="cpu")  # killed while it imports torch
    assert not m.ok and m.error.startswith("hbm on gpu0 failed:"), m.error
    assert "timed out" in m.error or "did not finish" in m.error, m.error
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _workers():
        time.sleep(0.2)
    assert _workers() == []


def _workers() -> list[str]:
    listed = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, timeout=10).stdout
    return [line for line in listed.splitlines() if "-m nodecheck.bench.gpu_itself_worker" in line]


def test_buffers_are_a_share_of_what_is_free_and_never_fit_in_a_cache():
    assert buffer_bytes(80 << 30, 0.25) == 1 << 30  # an idle H100: 1 GiB each
    assert buffer_bytes(2 << 30, 0.25) == 256 << 20  # a GPU a job has nearly filled: a quarter of what is left
    with pytest.raises(ValueError, match="too little for two buffers of 64 MiB"):
        buffer_bytes(MIN_BUFFER_BYTES, 0.25)


@pytest.mark.parametrize("argv", [["--memory-share", "0.9"], ["--seconds", "0"], ["--gpu", "[1]"]])
def test_the_workers_arguments_are_checked(tmp_path, argv):
    out = tmp_path / "out.json"
    args = {"--gpu": '{"index": 0}', "--seconds": "0.2", "--memory-share": "0.25"}
    args.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    run = subprocess.run([sys.executable, "-m", "nodecheck.bench.gpu_itself_worker", "hbm", "--device", "cpu", "--out", str(out),
                          *[x for pair in args.items() for x in pair]], capture_output=True, text=True, timeout=120)
    if argv[0] == "--gpu":  # parsed, then refused by the worker itself: its own error in its answer
        assert run.returncode == 1 and json.loads(out.read_text())["error"]["type"] == "ValueError"
    else:
        assert run.returncode == 2 and "must be in" in run.stderr
