"""GPU bandwidth tests. Here (no GPU) the failure paths run for real: a node whose facts show a GPU
but whose torch has no CUDA, too few GPUs, no torch. On a GPU node the `gpu` tests measure for real."""

import json
import sys

import pytest
from helpers import h100_node_snapshot, make_gpu, make_report, nodecheck, without_gpus

from nodecheck.bench import plan
from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.report.model import Measurement
from nodecheck.verdicts.bandwidth import measurement_findings


@pytest.fixture
def h100_report(tmp_path):
    return build_report(SnapshotHost(h100_node_snapshot(tmp_path / "h100")))


def test_missing_cuda_is_a_named_failure(h100_report):
    pytest.importorskip("torch", reason="needs torch (sh deploy/install.sh bench)")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    measurements = plan.run(h100_report, Config(), ["h2d", "d2h", "p2p"], "quick", 60, {}, None)
    assert [(m.path, m.test, m.ok) for m in measurements] == [
        ("gpu0:host", "h2d", False), ("gpu0:host", "d2h", False), ("gpus", "p2p", False)]
    assert "CUDA is not available to torch" in measurements[0].error and "h2d on gpu0 failed" in measurements[0].error
    assert "needs at least two GPUs (found 1)" in measurements[2].error
    findings = measurement_findings(measurements, Config())
    assert {(f.kind, f.subject) for f in findings} == {("bench_failed", "gpu0:host"), ("bench_failed", "gpus")}


def test_no_torch_is_a_named_failure(h100_report, monkeypatch):
    monkeypatch.setattr(plan, "find_spec", lambda name: None)
    (m,) = plan.run(h100_report, Config(), ["h2d"], "quick", 60, {}, None)
    assert not m.ok and "sh deploy/install.sh bench" in m.error and f"{sys.executable} -m pip install '.[bench]'" in m.error


def test_applicable_tests():

    def report(gpus):
        return make_report(gpus=[make_gpu(i) for i in range(gpus)])

    assert plan.applicable(report(0), across_nodes=False) == []
    assert plan.applicable(report(0), across_nodes=True) == ["allreduce"]
    # one GPU: a world of one rank moves no data, so no all-reduce unless asked for; the GPU's own tests on every GPU
    assert plan.applicable(report(1), across_nodes=False) == ["h2d", "d2h", "hbm", "gemm"]
    assert plan.applicable(report(8), across_nodes=False) == ["h2d", "d2h", "hbm", "gemm", "p2p", "allreduce"]


def test_cli_on_a_node_without_gpu():
    without_gpus()
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
    torch = pytest.importorskip("torch", reason="needs torch (sh deploy/install.sh bench)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    from nodecheck.host.live import LiveHost

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


@pytest.mark.gpu
def test_real_nccl_world_of_one_completes_with_no_figure(live_gpus):
    run = nodecheck("bench", "--tests", "allreduce", "--json", timeout=300,
                    env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    (m,) = json.loads(run.stdout)["measurements"]
    assert m["ok"], m  # and torchrun's store variable made no in-node rank wait for a store that is not there
    if len(live_gpus.gpus) == 1:
        assert m["direction"] == "none" and m["bytes_per_second"] is None and m["details"]["seconds_per_call"] > 0, m


@pytest.mark.gpu
def test_real_two_ranks_on_one_gpu_name_nccls_duplicate_gpu(live_gpus):
    """Both ranks the first of their "node" (LOCAL_RANK 0), so both on GPU 0: NCCL refuses, and the Report
    says so in NCCL's words, without torch's hints."""
    import os
    import subprocess
    import sys

    from helpers import free_port

    env = dict(os.environ, WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    argv = [sys.executable, "-m", "nodecheck", "bench", "--tests", "allreduce", "--json", "--timeout", "60"]
    other = subprocess.Popen(argv, env=dict(env, RANK="1"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run = subprocess.run(argv, env=dict(env, RANK="0"), capture_output=True, text=True, timeout=240)
    finally:
        other.wait(timeout=240)
    (m,) = json.loads(run.stdout)["measurements"]
    assert not m["ok"] and "Duplicate GPU detected" in m["error"] and "TORCH_USE_CUDA_DSA" not in m["error"], m


@pytest.mark.gpu
def test_real_pair_timing_runs_on_one_gpu(live_gpus):
    """The p2p timing (events on the source stream, both ways on two joined streams), on GPU 0 with itself
    where there is no second GPU: it runs and gives device-copy rates."""
    import torch

    from nodecheck.bench.gpu_worker import pair_rates, verify_pair

    b = 1 if torch.cuda.device_count() > 1 else 0
    rates = pair_rates(torch, 0, b, 64 << 20, 1, 3, both_ways=True)
    assert rates["unidirectional"] > 1e9 and rates["bidirectional"] > 1e9, rates
    assert verify_pair(torch, 0, b) == 0  # the pattern arrives whole on a healthy GPU


def a100_node_with_all_reduce_perf(tmp_path, first: str):
    """(bin dir, Report): an 8x A100 NV12 node (the p4d capture, NVML as A100s answer) and a stand-in
    all_reduce_perf that runs `first`, then prints what the real one printed on such a node (superbench)."""
    from helpers import A100_SXM4, PUBLIC, fake_executable, hgx_nvml, make_snapshot, need

    capture = need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-all_reduce_perf.txt")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_executable(bin_dir / "all_reduce_perf", f"{first}cat {capture}\n")
    snap = make_snapshot(tmp_path / "a100", topo="aws-p4d-24xlarge-8x-a100-nv12.txt", nvml_gpus=hgx_nvml(12, version=5, **A100_SXM4))
    return bin_dir, build_report(SnapshotHost(snap))


def test_nccl_tests_binary_on_an_8x_a100_node(tmp_path):
    """all_reduce_perf stands in by printing what the real one printed on an 8x A100 node (superbench log);
    the node's facts are that node's kind: 8 A100 with NV12 (NVLink 3) between every pair -> 300 GB/s spec."""
    bin_dir, report = a100_node_with_all_reduce_perf(tmp_path, f'echo "$@" > {tmp_path}/args\n')
    stand_in = bin_dir / "all_reduce_perf"
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    assert plan.applicable(report, False, nccl_tests_installed=True)[-1] == "nccl_tests"
    (m,) = plan.run(report, Config(), ["nccl_tests"], "quick", 30, environ, None)
    assert m.ok and (tmp_path / "args").read_text().split() == ["-b", "1G", "-e", "2G", "-f", "2", "-g", "8"]
    assert (m.bytes_per_second, m.spec_bytes_per_second, m.payload_bytes) == (235.26e9, 300e9, 8589934592)
    assert m.ratio == pytest.approx(0.784, abs=0.001)  # seed 002: ~80% of the unidirectional 300 GB/s is normal
    # healthy A100s reach 0.78 of NVLink's line rate: no finding under the calibrated default (0.7) ...
    assert m.details["path_kind"] == "nvlink" and measurement_findings([m], Config()) == []
    # ... one under an operator's own 0.8 for the test
    (finding,) = measurement_findings([m], Config(test_ratios={"nccl_tests": 0.8}))
    assert finding.kind == "bandwidth_below_spec" and "0.78 of spec" in finding.message

    stand_in.write_text("#!/bin/sh\nsleep 30\n")
    (hung,) = plan.run(report, Config(), ["nccl_tests"], "quick", 1, environ, None)
    assert not hung.ok and "all_reduce_perf did not finish within 1 s and was killed" in hung.error
    (absent,) = plan.run(report, Config(), ["nccl_tests"], "quick", 1, {"PATH": "/nonexistent"}, None)
    assert not absent.ok and "not installed" in absent.error


def test_all_reduce_perf_dies_with_a_killed_bench(tmp_path):
    """A C binary has no lifeline thread of its own: when the bench that started it was killed (the prolog's budget,
    serve's bench timeout), all_reduce_perf ran on, in its own session, holding the GPUs. It now runs under
    nodecheck.bench.lifeline and goes within a poll."""
    import os
    import signal
    import subprocess
    import time

    pid_file = tmp_path / "pid"
    bin_dir, _ = a100_node_with_all_reduce_perf(tmp_path, f"echo $$ > {pid_file}\nexec sleep 600\n")
    bench = subprocess.Popen([sys.executable, "-c", "import sys; from nodecheck.bench import plan; from nodecheck.pipeline import build_report; "
                              "from nodecheck.config import Config; from nodecheck.host.snapshot import SnapshotHost; "
                              "plan.run(build_report(SnapshotHost(sys.argv[1])), Config(), ['nccl_tests'], 'quick', 300, "
                              "{'PATH': sys.argv[2] + ':/usr/bin:/bin'}, None)", str(tmp_path / "a100"), str(bin_dir)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline and bench.poll() is None:
            time.sleep(0.1)
        binary = int(pid_file.read_text())
    finally:
        bench.kill()  # the bench alone: the binary is in a session of its own, where no group kill reaches
        bench.wait()
    deadline = time.monotonic() + 15
    while os.path.exists(f"/proc/{binary}") and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = os.path.exists(f"/proc/{binary}")
    if alive:
        os.kill(binary, signal.SIGKILL)
    assert not alive, "all_reduce_perf outlived the bench that started it"


# --- a slow copy measured again before it is believed -----------------------------------------------

# h2d of nodecheck's copy worker in fresh processes on a healthy H100 VM (PCIe gen5 x16, spec 63.0 GB/s),
# one after another (benchmarks/bench_h2d_spread.py, 2026-11-23): noise, not the link
H100_VM_H2D_RUNS_GBS = [42.7, 42.6, 48.7, 43.4, 44.9, 52.5, 54.8, 44.9]


def _replay(monkeypatch, h2d_gbs: list[float]) -> list[int]:
    """gpu._worker replays these h2d figures (d2h 54.8 GB/s, as measured); returns the list of calls."""
    from nodecheck.bench import gpu

    calls = []

    def worker(argv, timeout):
        rate = h2d_gbs[len(calls)] * 1e9
        calls.append(timeout)
        return {"gpus": [{"index": 0, "rows": [{"size_bytes": 256 << 20, "memory": "pinned", "h2d": rate, "d2h": 54.8e9}],
                          "cpus": "0-15"}]}

    monkeypatch.setattr(gpu, "_worker", worker)
    return calls


def test_a_slow_copy_is_measured_again_and_the_best_run_judged(h100_report, monkeypatch):
    from nodecheck.bench import gpu

    calls = _replay(monkeypatch, H100_VM_H2D_RUNS_GBS)
    h2d, d2h = gpu.copy_tests(h100_report, Config(), {"h2d", "d2h"}, "quick", 60)
    assert len(calls) == 3 and h2d.details["runs"] == [42.7e9, 42.6e9, 48.7e9] and h2d.bytes_per_second == 48.7e9
    assert h2d.method.endswith("best of 3 runs") and h2d.ratio == pytest.approx(48.7 / 63.0, abs=0.01)
    assert measurement_findings([h2d, d2h], Config()) == []  # 0.77 >= the calibrated 0.75: no drain


def test_a_narrow_link_stays_slow_in_every_run(h100_report, monkeypatch):
    """gen5 x8 caps every run near half the spec: three runs, one finding, PCIe advice (not a NIC's)."""
    from nodecheck.bench import gpu

    calls = _replay(monkeypatch, [27.4, 27.5, 27.3])
    h2d, d2h = gpu.copy_tests(h100_report, Config(), {"h2d", "d2h"}, "quick", 60)
    assert len(calls) == 3 and h2d.bytes_per_second == 27.5e9
    (finding,) = measurement_findings([h2d, d2h], Config())
    assert finding.subject == "gpu0:host" and "PCIe link" in finding.message and "cable" not in finding.message


def test_a_healthy_copy_runs_once_and_retries_fit_the_time_left(h100_report, monkeypatch):
    from nodecheck.bench import gpu

    calls = _replay(monkeypatch, [54.8])
    (h2d,) = gpu.copy_tests(h100_report, Config(), {"h2d"}, "quick", 60)
    assert len(calls) == 1 and "runs" not in h2d.details and not h2d.method.endswith("runs")
    calls = _replay(monkeypatch, H100_VM_H2D_RUNS_GBS)
    gpu.copy_tests(h100_report, Config(), {"h2d"}, "quick", 0)  # no time left after the first run: no retry
    assert len(calls) == 1


def test_one_worker_measures_every_gpu_and_a_failed_gpu_fails_alone(tmp_path, monkeypatch):
    """8 H100s in one worker process (torch imported once); gpu3 hidden from CUDA fails by itself, and only
    the slow gpu5 is measured again, alone."""
    from helpers import hgx_nvml, make_snapshot

    from nodecheck.bench import gpu

    report = build_report(SnapshotHost(make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                                                     nvml_gpus=hgx_nvml())))
    asked = []

    def worker(argv, timeout):
        listed = json.loads(argv[argv.index("--gpus") + 1])
        asked.append([g["index"] for g in listed])
        out = []
        for g in listed:
            if g["index"] == 3:
                out.append({"index": 3, "error": {"type": "LookupError", "message": "GPU GPU-hgx-3 is not among the CUDA devices"}})
                continue
            rate = 30e9 if g["index"] == 5 and len(asked) == 1 else 55e9
            out.append({"index": g["index"], "cpus": g["cpus"], "rows": [{"size_bytes": 1 << 28, "memory": "pinned", "h2d": rate, "d2h": rate}]})
        return {"gpus": out}

    monkeypatch.setattr(gpu, "_worker", worker)
    measurements = gpu.copy_tests(report, Config(), {"h2d", "d2h"}, "quick", 60)
    assert asked == [list(range(8)), [5]]
    failed = [m for m in measurements if not m.ok]
    assert {m.path for m in failed} == {"gpu3:host"} and "LookupError: GPU GPU-hgx-3" in failed[0].error
    gpu5 = [m for m in measurements if m.path == "gpu5:host"]
    assert all(m.bytes_per_second == 55e9 and m.details["runs"] == [30e9, 55e9] for m in gpu5)


def test_copies_are_timed_in_bulk_at_small_payloads():
    from nodecheck.bench.gpu_worker import copies_per_sample

    assert [copies_per_sample(s) for s in (1 << 20, 16 << 20, 256 << 20, 1 << 30)] == [64, 16, 1, 1]


def test_an_nvlink_pair_without_peer_access_is_its_own_path_with_its_own_advice(tmp_path, monkeypatch):
    """Issue 20 (4): NV18 GPUs that CUDA gives no peer access copy through host memory; that is neither a
    slow NVLink nor a staged PCIe path: kind nvlink-no-peer, advice on peer access (fabric manager), and a
    PCIe pair's advice never names NVLink."""
    from helpers import hgx_nvml, make_snapshot

    from nodecheck.bench import gpu

    report = build_report(SnapshotHost(make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                                                     nvml_gpus=hgx_nvml())))
    pairs = [{"src": 0, "dst": 1, "p2p_access": False, "unidirectional": 20e9, "bidirectional": 30e9},
             {"src": 1, "dst": 0, "p2p_access": False, "unidirectional": 20e9}]
    monkeypatch.setattr(gpu, "_worker", lambda argv, timeout: {"size_bytes": 1 << 28, "pairs": pairs})
    measurements = gpu.p2p_tests(report, "quick", 60)
    assert {m.details["path_kind"] for m in measurements} == {"nvlink-no-peer"}
    findings = measurement_findings(measurements, Config())
    assert len(findings) == 3 and all("no peer access" in f.message and "fabric" in f.message for f in findings)
    pcie = Measurement.measured("gpu0->gpu1", "p2p", 5e9, 31.5e9, 1, "m", "unidirectional", {"path_kind": "pcie"})
    (finding,) = measurement_findings([pcie], Config())
    assert "PCIe links" in finding.message and "NVLink" not in finding.message


def test_nccl_tests_runs_once_per_node_after_the_in_node_tests_without_the_launchers_variables(tmp_path, monkeypatch):
    """Issue 20 (5): under torchrun or srun every local rank ran `all_reduce_perf -g 8` on the same GPUs, with
    the launcher's PMI_/OMPI_/step variables (an MPI build then joins the job's world). Now: local rank 0
    only, after h2d/d2h, with those variables gone (CUDA_VISIBLE_DEVICES kept)."""
    from nodecheck.bench import distributed, gpu

    bin_dir, report = a100_node_with_all_reduce_perf(tmp_path, f"env > {tmp_path}/env.$$\n")
    order = []
    monkeypatch.setattr(gpu, "copy_tests", lambda *a: order.append("h2d") or [Measurement.failed("gpu0:host", "h2d", "m", "-", "x")])
    monkeypatch.setattr(distributed, "run_allreduce", lambda *a, **k: order.append("allreduce") or
                        Measurement.failed("allreduce:16-ranks", "allreduce", "m", "busbw", "stand-in"))
    monkeypatch.setattr(distributed, "other_nodes_results", lambda *a: [])
    launch = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RANK": "8", "WORLD_SIZE": "16", "MASTER_ADDR": "198.18.0.1",
              "PMI_RANK": "8", "PMIX_RANK": "8", "OMPI_COMM_WORLD_RANK": "8", "SLURM_STEP_ID": "0", "SLURM_PROCID": "8",
              "SLURM_LOCALID": "0", "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NCCL_IB_HCA": "mlx5"}
    env = distributed.distributed_env(launch)
    out = plan.run(report, Config(), ["h2d", "nccl_tests", "allreduce"], "quick", 30, launch, env)
    assert [m.test for m in out] == ["h2d", "nccl_tests", "allreduce"] and order == ["h2d", "allreduce"]
    (seen,) = [dict(line.split("=", 1) for line in f.read_text().splitlines() if "=" in line) for f in tmp_path.glob("env.*")]
    assert not [k for k in seen if k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_STEP")) or k in ("RANK", "SLURM_PROCID")]
    assert seen["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and seen["NCCL_IB_HCA"] == "mlx5"
    for other in ("1", "7"):  # the node's other ranks join the all-reduce and run no all_reduce_perf
        out = plan.run(report, Config(), ["h2d", "nccl_tests", "allreduce"], "quick", 30, dict(launch, LOCAL_RANK=other), env)
        assert [m.test for m in out] == ["allreduce"]
    assert len(list(tmp_path.glob("env.*"))) == 1


class _CudaAsSeen:
    """What torch.cuda answers in a process that sees some of the node's GPUs (no CUDA here: the values an
    H100 node gives, device properties with the NVML UUIDs of the visible GPUs, in CUDA's order)."""

    def __init__(self, uuids: list[str]):
        self.uuids = uuids
        self.cuda = self

    def device_count(self):
        return len(self.uuids)

    def get_device_properties(self, ordinal):
        return type("Props", (), {"uuid": self.uuids[ordinal].removeprefix("GPU-")})()

    def can_device_access_peer(self, a, b):
        return True


def test_p2p_pairs_are_named_by_nvml_index_and_unseen_gpus_are_a_named_failure(tmp_path, monkeypatch):
    """Issue 20 (11): with CUDA_VISIBLE_DEVICES=6,7,4,5 CUDA ordinals 0-3 are NVML's GPUs 6, 7, 4, 5: the pairs
    were named gpu0->gpu1 ..., judged against the wrong pair's spec, and GPUs 0-3 silently left out. Now each
    pair carries its NVML index (by UUID) and the four GPUs torch cannot see are a failure naming both counts."""
    import argparse

    from helpers import hgx_nvml, make_snapshot

    from nodecheck.bench import gpu, gpu_worker

    report = build_report(SnapshotHost(make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                                                     nvml_gpus=hgx_nvml())))
    uuids = {g.index: g.uuid for g in report.gpus}
    cuda = _CudaAsSeen([uuids[i] for i in (6, 7, 4, 5)])
    monkeypatch.setattr(gpu_worker, "pair_rates", lambda torch, a, b, size, warmup, repeats, both_ways: (
        {"unidirectional": 300e9 + a * 10 + b, **({"bidirectional": 600e9} if both_ways else {})}))
    monkeypatch.setattr(gpu_worker, "verify_pair", lambda torch, a, b: 0)

    def worker(argv, timeout):
        args = argparse.Namespace(gpus=argv[argv.index("--gpus") + 1], sizes=argv[argv.index("--sizes") + 1], warmup=1, repeats=1)
        return gpu_worker.p2p_test(cuda, args)

    monkeypatch.setattr(gpu, "_worker", worker)
    measurements = gpu.p2p_tests(report, "quick", 60)
    failed = [m for m in measurements if not m.ok]
    (failure,) = failed
    assert "torch sees 4 CUDA device(s), NVML lists 8 GPU(s): gpu0, gpu1, gpu2, gpu3 not visible to CUDA" in failure.error
    one_way = {m.path: m for m in measurements if m.ok and m.direction == "unidirectional"}
    assert sorted(one_way) == sorted(f"gpu{a}->gpu{b}" for a in (4, 5, 6, 7) for b in (4, 5, 6, 7) if a != b)
    assert one_way["gpu6->gpu7"].bytes_per_second == 300e9 + 0 * 10 + 1  # CUDA ordinals 0 and 1


def test_gpu_paths_and_collectives_are_quoted_in_gigabytes_nics_in_gigabits():
    """Issue 20 (11): an h2d of 50 GB/s read "400 Gbit/s" in the table and the finding: nvbandwidth and
    nccl-tests quote GB/s, and so does nodecheck for paths inside a node and for collectives across nodes (an
    across-node all-reduce of 387 GB/s read "3.09248 Tbit/s"); a NIC's own rate stays in Gbit/s."""
    import io

    from rich.console import Console

    from nodecheck.render.bench import render_measurements

    h2d = Measurement.measured("gpu0:host", "h2d", 30e9, 63e9, 1 << 28, "m", "unidirectional", {"path_kind": "pcie"})
    job = Measurement.measured("allreduce:2-ranks", "allreduce", 5e9, 12.5e9, 1 << 25, "m", "busbw", {})
    messages = [f.message for f in measurement_findings([h2d, job], Config())]
    assert "gpu0:host h2d 30.0 GB/s = 0.48 of spec 63.0 GB/s" in messages[0], messages[0]
    assert "allreduce:2-ranks allreduce 5.0 GB/s = 0.40 of spec 12.5 GB/s" in messages[1], messages[1]
    out = io.StringIO()
    render_measurements(make_report(measurements=[h2d, job]), Console(file=out, width=200))
    table = out.getvalue()
    assert "30.0 GB/s" in table and "63.0 GB/s" in table and "5.0 GB/s" in table and "240 Gbit/s" not in table
    from nodecheck.core.units import format_path_rate

    assert format_path_rate("nic", 50e9) == "400 Gbit/s" and format_path_rate("cluster", 386.56e9) == "386.6 GB/s"


def test_a_hung_pair_keeps_the_pairs_that_finished(tmp_path, monkeypatch):
    """Issue 20 (10): one wedged link blocked the p2p worker inside CUDA until the whole test's time limit,
    and every pair's figure was lost with it. Each pair now has its own limit: a watchdog hands over the
    pairs that finished and names the one that hung; the runner keeps the first and fails the second."""
    import argparse
    import threading

    from helpers import hgx_nvml, make_snapshot

    from nodecheck.bench import gpu, gpu_worker

    report = build_report(SnapshotHost(make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                                                     nvml_gpus=hgx_nvml())))
    cuda = _CudaAsSeen([g.uuid for g in report.gpus[:3]])
    released = threading.Event()

    def rates(torch, a, b, size, warmup, repeats, both_ways):
        if (a, b) == (1, 2):
            released.wait(60)  # the wedged copy: blocks until the watchdog has spoken
        return {"unidirectional": 300e9, **({"bidirectional": 600e9} if both_ways else {})}

    monkeypatch.setattr(gpu_worker, "pair_rates", rates)
    monkeypatch.setattr(gpu_worker, "verify_pair", lambda torch, a, b: 0)
    seen = {}

    def on_hang(partial):
        seen["partial"] = partial
        released.set()

    args = argparse.Namespace(gpus=json.dumps([{"index": g.index, "uuid": g.uuid} for g in report.gpus[:3]]), sizes="1024",
                              warmup=1, repeats=1, pair_timeout=3.0, out=str(tmp_path / "out.json"))
    gpu_worker.p2p_test(cuda, args, on_hang=on_hang)
    partial = seen["partial"]
    assert [(p["src"], p["dst"]) for p in partial["pairs"]] == [(0, 1), (0, 2), (1, 0)]
    assert partial["hung"] == {"src": 1, "dst": 2, "limit_s": 3.0}

    three = dataclasses_replace(report, gpus=report.gpus[:3])
    monkeypatch.setattr(gpu, "_worker", lambda argv, timeout: partial)
    measurements = gpu.p2p_tests(three, "quick", 60)
    (failed,) = [m for m in measurements if not m.ok]
    assert failed.path == "gpu1->gpu2" and "did not finish within 3 s" in failed.error and "2 pair(s) after it" in failed.error
    assert sorted(m.path for m in measurements if m.ok and m.direction == "unidirectional") == ["gpu0->gpu1", "gpu0->gpu2",
                                                                                                  "gpu1->gpu0"]


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_a_pair_that_copies_wrong_data_is_its_own_finding(tmp_path, monkeypatch):
    """Issue 20 (10): each pair's copy is verified against the pattern (nvbandwidth does the same); wrong
    elements are a bench_wrong_result error on the one-way path, at whatever speed."""
    from helpers import hgx_nvml, make_snapshot

    from nodecheck.bench import gpu

    report = build_report(SnapshotHost(make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                                                     nvml_gpus=hgx_nvml())))
    pairs = [{"src": 0, "dst": 1, "p2p_access": True, "unidirectional": 380e9, "bidirectional": 760e9, "wrong_elements": 4096},
             {"src": 1, "dst": 0, "p2p_access": True, "unidirectional": 380e9, "wrong_elements": 0}]
    monkeypatch.setattr(gpu, "_worker", lambda argv, timeout: {"size_bytes": 1 << 28, "pairs": pairs})
    findings = measurement_findings(gpu.p2p_tests(report, "quick", 60), Config())
    assert [(f.kind, f.subject) for f in findings] == [("bench_wrong_result", "gpu0->gpu1")]
    assert "4096 of 16777216 elements arrived wrong" in findings[0].message


def test_the_host_buffers_numa_node_is_read_from_the_kernel(tmp_path):
    """Issue 20 (9): the Report said a GPU was measured from its own NUMA node while PyTorch's host cache
    handed GPU 0's pinned block (placed near GPU 0) to GPUs 4-7. The worker now frees that cache between
    GPUs and records where the buffer's pages are, from /proc/self/numa_maps: here for a real buffer of
    this process, and for a two-socket layout in the kernel's format."""
    import os

    from nodecheck.bench.binding import buffer_numa_node

    torch = pytest.importorskip("torch")
    if not os.path.exists("/proc/self/numa_maps"):
        pytest.skip("this kernel has no NUMA accounting (/proc/self/numa_maps)")
    buffer = torch.empty(64 << 20, dtype=torch.uint8)
    buffer.fill_(1)  # pages exist once touched
    nodes = {int(n[4:]) for n in os.listdir("/sys/devices/system/node") if n.startswith("node") and n[4:].isdigit()}
    assert buffer_numa_node(buffer.data_ptr()) in nodes

    maps = tmp_path / "maps"
    numa = tmp_path / "numa_maps"
    maps.write_text("55d0c0000000-55d0c0021000 r--p 00000000 08:01 1234 /usr/bin/python3\n"
                    "7f3c2c000000-7f3c3c000000 rw-s 00000000 00:05 99 /dev/zero (deleted)\n")
    numa.write_text("55d0c0000000 default file=/usr/bin/python3 mapped=33 N0=33 kernelpagesize_kB=4\n"
                    "7f3c2c000000 default file=/dev/zero\\040(deleted) dirty=65536 N0=1024 N1=64512 kernelpagesize_kB=4\n")
    assert buffer_numa_node(0x7f3c30000000, str(maps), str(numa)) == 1  # most pages on the second socket
    assert buffer_numa_node(0x1000, str(maps), str(numa)) is None


def test_a_buffer_on_the_other_socket_is_said(h100_report, monkeypatch):
    from nodecheck.bench import gpu

    row = {"size_bytes": 256 << 20, "memory": "pinned", "h2d": 55e9, "d2h": 54.8e9, "host_numa_node": 1}
    monkeypatch.setattr(gpu, "_worker", lambda argv, timeout: {"gpus": [{"index": 0, "rows": [row], "cpus": "0-15"}]})
    gpu0 = h100_report.gpus[0]
    gpu0.numa_node = 0
    (m,) = gpu.copy_tests(h100_report, Config(), {"h2d"}, "quick", 60)
    assert m.details["host_buffer_numa_node"] == 1 and "NUMA node 1, not the GPU's node 0" in m.details["note"]


def test_the_pinned_host_cache_is_freed_between_gpus():
    """torch 2.13 frees cached pinned blocks with torch.accelerator.empty_host_cache, older torch with a private
    call; the worker uses whichever this torch has (the real call needs a GPU: see the gpu-marked test)."""
    import torch as real_torch

    from nodecheck.bench.gpu_worker import free_host_cache

    assert callable(real_torch.accelerator.empty_host_cache)  # the API the worker reaches for exists in this torch
    calls = []
    new = type("NewTorch", (), {"accelerator": type("A", (), {"empty_host_cache": staticmethod(lambda: calls.append("new"))}),
                                "_C": object()})()
    old = type("OldTorch", (), {"_C": type("C", (), {"_host_emptyCache": staticmethod(lambda: calls.append("old"))})})()
    assert free_host_cache(new) and free_host_cache(old) and calls == ["new", "old"]
    assert free_host_cache(type("NoCache", (), {"_C": object()})()) is False


@pytest.mark.gpu
def test_real_pinned_cache_is_empty_after_freeing(live_gpus):
    import torch

    from nodecheck.bench.gpu_worker import free_host_cache

    block = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    del block
    assert torch.cuda.host_memory_stats()["allocated_bytes.current"] >= 64 << 20  # cached, not given back
    assert free_host_cache(torch)
    assert torch.cuda.host_memory_stats()["allocated_bytes.current"] == 0


@pytest.mark.gpu
def test_real_one_worker_makes_fresh_pinned_buffers_for_each_gpu(live_gpus, tmp_path):
    """Issue 26 (2): GPU 0 measured twice in one worker, bound to two CPU sets: each pass allocates its own pinned
    blocks (none handed back from the first pass's cache), and each buffer's address and NUMA node are recorded."""
    import os
    import subprocess
    import sys

    cpus = sorted(os.sched_getaffinity(0))
    halves = [cpus[: max(1, len(cpus) // 2)], cpus[max(1, len(cpus) // 2):] or cpus[:1]]
    gpus = [{"index": 0, "uuid": live_gpus.gpus[0].uuid, "cpus": ",".join(map(str, half))} for half in halves]
    out = tmp_path / "copy.json"
    subprocess.run([sys.executable, "-m", "nodecheck.bench.gpu_worker", "copy", "--gpus", json.dumps(gpus), "--sizes", str(64 << 20),
                    "--out", str(out)], check=True, timeout=300)
    passes = json.loads(out.read_text())["gpus"]
    print(json.dumps(passes, indent=1))  # the host pointers, for the log
    for p in passes:
        (row,) = p["rows"]
        assert row["host_address"].startswith("0x") and row["h2d"] > 1e9, row
        if os.path.exists("/proc/self/numa_maps"):
            assert isinstance(row["host_numa_node"], int), row
    if any(p["pinned_blocks_created"] is None for p in passes):
        pytest.skip("this torch's host_memory_stats has no num_host_alloc: freshness not countable")
    assert [p["pinned_blocks_created"] > 0 for p in passes] == [True, True], passes
