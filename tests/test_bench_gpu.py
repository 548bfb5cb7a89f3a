"""GPU bandwidth tests. Here (no GPU) the failure paths run for real: a node whose facts show a GPU
but whose torch has no CUDA, too few GPUs, no torch. On a GPU node the `gpu` tests measure for real."""

import json

import pytest

from conftest import h100_node_snapshot, nodecheck
from nodecheck.bench import plan
from nodecheck.build import build_report
from nodecheck.config import Config
from nodecheck.rules import measurement_findings
from nodecheck.snapshot import SnapshotHost


@pytest.fixture
def h100_report(tmp_path):
    return build_report(SnapshotHost(h100_node_snapshot(tmp_path / "h100")))


def test_missing_cuda_is_a_named_failure(h100_report):
    pytest.importorskip("torch", reason="needs torch (pip install 'nodecheck[bench]')")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    measurements = plan.run(h100_report, Config(), ["h2d", "d2h", "p2p"], "quick", 60, {}, None)
    assert [(m.path, m.test, m.ok) for m in measurements] == [
        ("gpu0:host", "h2d", False), ("gpu0:host", "d2h", False), ("gpus", "p2p", False)]
    assert "CUDA is not available to torch" in measurements[0].error and "h2d on gpu0 failed" in measurements[0].error
    assert "needs at least two GPUs (found 1)" in measurements[2].error
    findings = measurement_findings(measurements, 0.8)
    assert {(f.kind, f.subject) for f in findings} == {("bench_failed", "gpu0:host"), ("bench_failed", "gpus")}


def test_no_torch_is_a_named_failure(h100_report, monkeypatch):
    monkeypatch.setattr(plan, "find_spec", lambda name: None)
    (m,) = plan.run(h100_report, Config(), ["h2d"], "quick", 60, {}, None)
    assert not m.ok and "pip install 'nodecheck[bench]'" in m.error


def test_applicable_tests():
    from nodecheck.model import Gpu, Report

    def report(gpus):
        return Report(0, "t", {}, [], None, [Gpu(i) for i in range(gpus)], None, [], [], [])

    assert plan.applicable(report(0), distributed=False) == []
    assert plan.applicable(report(0), distributed=True) == ["allreduce"]
    assert plan.applicable(report(1), distributed=False) == ["h2d", "d2h"]
    assert plan.applicable(report(8), distributed=False) == ["h2d", "d2h", "p2p", "allreduce"]


def test_cli_on_a_node_without_gpu():
    result = nodecheck("bench", "--tests", "h2d", "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert [(m["test"], m["ok"]) for m in report["measurements"]] == [("h2d", False)]
    assert "no GPU to test" in report["findings"][-1]["message"]
    nothing = nodecheck("bench")
    assert nothing.returncode == 2 and "no test applies here" in nothing.stderr


# --- on a real GPU node ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def live_gpus():
    torch = pytest.importorskip("torch", reason="needs torch (pip install 'nodecheck[bench]')")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    from nodecheck.host import LiveHost

    return build_report(LiveHost())


@pytest.mark.gpu
def test_real_h2d_d2h(live_gpus):
    measurements = plan.run(live_gpus, Config(), ["h2d", "d2h"], "quick", 120, {}, None)
    for m in measurements:
        assert m.ok, m.error
        assert m.spec_bytes_per_second and 0.5 < m.ratio < 1.05, (m.path, m.test, m.ratio)


@pytest.mark.gpu
def test_real_p2p_and_node_allreduce(live_gpus):
    if len(live_gpus.gpus) < 2:
        pytest.skip("needs two GPUs")
    for m in plan.run(live_gpus, Config(), ["p2p", "allreduce"], "quick", 300, {}, None):
        assert m.ok, m.error
