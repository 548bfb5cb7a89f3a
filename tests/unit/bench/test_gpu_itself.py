"""`bench --tests hbm` (src/nodecheck/bench/gpu_itself.py): each GPU's memory bandwidth against its model's spec and
against its siblings, from the workers' answers replayed here (the real worker runs on CPU torch in
tests/system/test_gpu_itself_worker.py). An 8x H100 SXM node (the HGX topology and the H100 capture's NVML values):
healthy GPUs read 2.8 TB/s (0.84 of 3.35, what Nsight Compute reads of coalesced HBM3 loads on H100 SXM); one
braked GPU 2.45 TB/s (0.73: passes its spec, 0.875 of its siblings), one at 2.0 TB/s (0.60: below its spec), one
whose copy arrived wrong, one whose worker died, one held by a job."""

import dataclasses

import pytest
from helpers import hgx_nvml, make_snapshot

from nodecheck.bench import gpu_itself
from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.report.gpu import GpuProcess
from nodecheck.verdicts.bandwidth import measurement_findings

HEALTHY = 2.8e12
GiB = 1 << 30


@pytest.fixture(scope="module")
def hgx(tmp_path_factory):
    snap = make_snapshot(tmp_path_factory.mktemp("hgx") / "node", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    return build_report(SnapshotHost(snap))


def answer(rate: float, wrong: int = 0) -> dict:
    return {"index": 0, "device": "cuda:0", "hbm": {"size_bytes": GiB, "copies_per_sample": 8, "samples": 40,
                                                    "seconds_per_copy": 2 * GiB / rate, "bytes_per_second": rate,
                                                    "best_bytes_per_second": rate * 1.01, "words_checked": GiB // 2,
                                                    "wrong_words": wrong, "free_bytes": 80 * GiB}}


def replayed(monkeypatch, answers: dict[int, dict], test: str = "hbm"):
    asked = []

    def run(gpu, asked_test, plan, timeout, device):
        assert asked_test == test
        asked.append(gpu.index)
        return answers[gpu.index]
    monkeypatch.setattr(gpu_itself, "_run", run)
    return asked


def test_each_gpu_is_judged_against_its_spec_and_its_siblings(monkeypatch, hgx):
    report = dataclasses.replace(hgx, gpus=list(hgx.gpus))
    job = GpuProcess(pid=4242, type="compute", memory_bytes=70 * GiB, name="python", job=17)
    report.gpus[7] = dataclasses.replace(report.gpus[7], processes=[job])
    answers = {i: answer(HEALTHY) for i in range(8)}
    answers.update({2: answer(2.45e12), 3: answer(2.0e12), 4: answer(HEALTHY, wrong=3),
                    5: {"error": "the hbm worker of gpu5 was killed by signal 9"}})
    asked = replayed(monkeypatch, answers)
    measurements = gpu_itself.hbm_tests(report, "quick", 60)
    assert asked == [0, 1, 2, 3, 4, 5, 6]  # the GPU a job holds is not touched
    by_path = {m.path: m for m in measurements}
    assert [m.path for m in measurements] == ["gpu7:memory"] + [f"gpu{i}:memory" for i in range(7)]
    healthy = by_path["gpu0:memory"]
    assert (healthy.ok, healthy.scope, healthy.direction, healthy.spec_bytes_per_second) == (True, "gpu", "read+write", 3.35e12)
    assert healthy.ratio == pytest.approx(0.836, abs=0.001) and healthy.details["siblings"] == 6
    assert healthy.details["sibling_median"] == HEALTHY and "all 7 GPU(s) at once" in healthy.method

    findings = {(f.kind, f.subject): f for f in measurement_findings(measurements, Config())}
    assert set(findings) == {("gpu_below_siblings", "gpu2:memory"), ("bandwidth_below_spec", "gpu3:memory"),
                             ("gpu_below_siblings", "gpu3:memory"), ("bench_wrong_result", "gpu4:memory"),
                             ("bench_failed", "gpu5:memory"), ("bench_skipped", "gpu7:memory")}
    braked = findings[("gpu_below_siblings", "gpu2:memory")]
    assert (braked.severity, braked.measured, braked.expected) == ("warning", "0.88", ">= 0.9")
    assert "nvidia-smi -q -d PERFORMANCE,CLOCK" in braked.message
    slow = findings[("bandwidth_below_spec", "gpu3:memory")]
    assert (slow.severity, slow.measured, slow.expected) == ("error", "0.60", ">= 0.7")
    assert findings[("bench_skipped", "gpu7:memory")].severity == "info"
    assert "held by pid 4242 python (job 17): not tested" in findings[("bench_skipped", "gpu7:memory")].message
    assert "3 of 536870912 elements arrived wrong" in findings[("bench_wrong_result", "gpu4:memory")].message


def test_a_gpu_without_a_spec_is_judged_by_its_siblings_alone(monkeypatch, hgx):
    report = dataclasses.replace(hgx, gpus=[dataclasses.replace(g, name="NVIDIA H20-3e", spec=None) for g in hgx.gpus[:4]])
    replayed(monkeypatch, {0: answer(3.0e12), 1: answer(3.0e12), 2: answer(3.0e12), 3: answer(2.0e12)})
    measurements = gpu_itself.hbm_tests(report, "full", 60)
    assert all(m.ok and m.spec_bytes_per_second is None and m.ratio is None for m in measurements)
    assert "no spec for 'NVIDIA H20-3e'" in measurements[0].details["spec_basis"]
    assert [(f.kind, f.subject) for f in measurement_findings(measurements, Config())] == [("gpu_below_siblings", "gpu3:memory")]


def test_two_gpus_of_a_model_are_not_judged_against_each_other(monkeypatch, hgx):
    """Two cannot say which one is slow: siblings are compared from three on."""
    report = dataclasses.replace(hgx, gpus=hgx.gpus[:2])
    replayed(monkeypatch, {0: answer(HEALTHY), 1: answer(2.4e12)})
    measurements = gpu_itself.hbm_tests(report, "quick", 60)
    assert all("sibling_ratio" not in m.details for m in measurements)
    assert measurement_findings(measurements, Config()) == []


@pytest.mark.parametrize("garbled", [{"hbm": {"bytes_per_second": "fast"}}, {"hbm": []}, {"hbm": {"size_bytes": 1}}, {}])
def test_a_workers_answer_that_is_not_one_is_a_failure_naming_the_gpu(monkeypatch, hgx, garbled):
    report = dataclasses.replace(hgx, gpus=hgx.gpus[:1])
    replayed(monkeypatch, {0: garbled})
    (m,) = gpu_itself.hbm_tests(report, "quick", 60)
    assert not m.ok and m.error.startswith("hbm on gpu0")


def test_an_answer_above_what_memory_moves_says_the_model_was_misread(monkeypatch, hgx):
    """A copy reads and writes each byte once: 1.1 x the spec or more is a model rated wrong (an H200 read as an H100)."""
    report = dataclasses.replace(hgx, gpus=hgx.gpus[:1])
    replayed(monkeypatch, {0: answer(4.3e12)})
    (finding,) = measurement_findings(gpu_itself.hbm_tests(report, "quick", 60), Config())
    assert (finding.kind, finding.measured) == ("bandwidth_above_bound", "1.28")


def test_hbm_is_a_bench_test_that_applies_where_there_are_gpus(hgx):
    from nodecheck.bench.plan import applicable, without_mig_gpus
    from nodecheck.report.model import BENCH_TESTS, path_identity

    assert "hbm" in BENCH_TESTS and "hbm" in applicable(hgx, across_nodes=False)
    assert "hbm" not in applicable(dataclasses.replace(hgx, gpus=[]), across_nodes=False)
    mig = dataclasses.replace(hgx, gpus=[dataclasses.replace(hgx.gpus[0], mig_enabled=True), hgx.gpus[1]])
    assert without_mig_gpus(mig, {"hbm", "p2p"})[1] == {"hbm"}
    assert path_identity("gpu12:memory") == ("gpu", ["gpu12"], None)
    assert Config().threshold("hbm", "memory")[0] == 0.7 and Config().threshold("gemm", "compute")[0] == 0.55
    assert "gemm" in applicable(hgx, across_nodes=False) and path_identity("gpu3:compute") == ("gpu", ["gpu3"], None)


# gemm: healthy H100 SXMs read 797.5 TFLOPS in BF16 at 8192 (0.81 of 989.4: zzc0721/torch-performance-test-data#79)
HEALTHY_FLOPS = 797.5e12
USUAL, OTHER = "a" * 64, "b" * 64


def computed(flops: float, digests=(USUAL, USUAL)) -> dict:
    return {"index": 0, "device": "cuda:0", "gemm": {"n": 8192, "dtype": "bf16", "multiplies_per_sample": 36, "samples": 30,
                                                     "seconds_per_multiply": 2 * 8192**3 / flops, "flops_per_second": flops,
                                                     "best_flops_per_second": flops * 1.01,
                                                     "check": {"n": 4096, "seed": 20261129, "digests": list(digests),
                                                               "seconds": 0.021}}}


def test_gemm_judges_throughput_against_the_dense_spec_and_the_bits_against_the_siblings(monkeypatch, hgx):
    answers = {i: computed(HEALTHY_FLOPS) for i in range(8)}
    answers.update({1: computed(680e12), 2: computed(500e12), 5: computed(HEALTHY_FLOPS, (OTHER, OTHER)),
                    6: computed(HEALTHY_FLOPS, (USUAL, OTHER))})
    replayed(monkeypatch, answers, "gemm")
    measurements = gpu_itself.gpu_tests(hgx, {"gemm"}, "quick", 60)
    healthy = measurements[0]
    assert (healthy.path, healthy.test, healthy.direction, healthy.bytes_per_second) == ("gpu0:compute", "gemm", "bf16 dense", None)
    assert (healthy.flops_per_second, healthy.spec_flops_per_second) == (HEALTHY_FLOPS, 989.4e12)
    assert healthy.ratio == pytest.approx(0.806, abs=0.001) and healthy.figure == HEALTHY_FLOPS
    assert healthy.details["result_check"] == {"inputs": "4096 x 4096 BF16 from seed 20261129", "digests": [USUAL, USUAL],
                                               "seconds": 0.021, "repeat_agrees": True, "usual": USUAL, "agreeing": 7, "of": 8}
    findings = {(f.kind, f.subject): f for f in measurement_findings(measurements, Config())}
    assert set(findings) == {("gpu_below_siblings", "gpu1:compute"), ("bandwidth_below_spec", "gpu2:compute"),
                             ("gpu_below_siblings", "gpu2:compute"), ("gpu_result_mismatch", "gpu5:compute"),
                             ("gpu_result_mismatch", "gpu6:compute")}
    slow = findings[("bandwidth_below_spec", "gpu2:compute")]
    assert (slow.measured, slow.expected) == ("0.51", ">= 0.55") and "500 TFLOPS = 0.51 of spec 989 TFLOPS" in slow.message
    assert "680 TFLOPS = 0.85 of the median of its 8 sibling GPUs of the same model (798 TFLOPS)" in findings[
        ("gpu_below_siblings", "gpu1:compute")].message
    assert "gpu5 computed other bits than 7 of the 8 GPUs of its model" in findings[("gpu_result_mismatch", "gpu5:compute")].message
    assert "gpu6 gave two different results for the same multiply" in findings[("gpu_result_mismatch", "gpu6:compute")].message


def test_two_gpus_that_disagree_are_both_named(monkeypatch, hgx):
    report = dataclasses.replace(hgx, gpus=hgx.gpus[:2])
    replayed(monkeypatch, {0: computed(HEALTHY_FLOPS, (USUAL, USUAL)), 1: computed(HEALTHY_FLOPS, (OTHER, OTHER))}, "gemm")
    findings = measurement_findings(gpu_itself.gpu_tests(report, {"gemm"}, "quick", 60), Config())
    assert [(f.kind, f.subject) for f in findings] == [("gpu_result_mismatch", "gpu0:compute"), ("gpu_result_mismatch", "gpu1:compute")]
    assert "none a majority" in findings[0].message


@pytest.mark.parametrize("garbled", [{"gemm": {"flops_per_second": 1.0, "n": 1, "samples": 1, "check": {"digests": ["a"]}}},
                                     {"gemm": {"flops_per_second": 1.0, "n": "x"}}, {"gemm": "fast"}])
def test_a_gemm_answer_that_is_not_one_is_a_failure(monkeypatch, hgx, garbled):
    report = dataclasses.replace(hgx, gpus=hgx.gpus[:1])
    replayed(monkeypatch, {0: garbled}, "gemm")
    (m,) = gpu_itself.gpu_tests(report, {"gemm"}, "quick", 60)
    assert not m.ok and m.error.startswith("gemm on gpu0")


@pytest.mark.parametrize("seconds", ["0.02", -1.0, True, 1e30, None, [0.02]])
def test_a_check_duration_that_is_no_plain_one_is_left_out_and_the_figure_kept(monkeypatch, hgx, seconds):
    """What the data and result checks cost comes from the worker's answer: one that is no duration is None, never
    a failure of the measurement it rides on."""
    report = dataclasses.replace(hgx, gpus=hgx.gpus[:1])
    copy, multiply = answer(HEALTHY), computed(HEALTHY_FLOPS)
    copy["hbm"]["check_seconds"] = multiply["gemm"]["check"]["seconds"] = seconds
    replayed(monkeypatch, {0: copy}, "hbm")
    (m,) = gpu_itself.hbm_tests(report, "quick", 60)
    assert m.ok and m.details["data_check"]["seconds"] is None and m.details["data_check"]["wrong_elements"] == 0
    replayed(monkeypatch, {0: multiply}, "gemm")
    (m,) = gpu_itself.gpu_tests(report, {"gemm"}, "quick", 60)
    assert m.ok and m.details["result_check"]["seconds"] is None and m.details["result_check"]["repeat_agrees"]


def test_a_gemm_figure_reads_in_tflops_in_every_face(monkeypatch, hgx):
    from rich.console import Console

    from nodecheck.prometheus.exposition import _measurements
    from nodecheck.render.bench import measurement_tables
    from nodecheck.verdicts.bandwidth import with_measurements

    report = dataclasses.replace(hgx, gpus=hgx.gpus[:1])
    replayed(monkeypatch, {0: computed(500e12)}, "gemm")
    judged = with_measurements(report, gpu_itself.gpu_tests(report, {"gemm"}, "quick", 60), 1.8e9, Config())
    console = Console(record=True, width=200)
    measurement_tables(console, judged)
    row = next(line for line in console.export_text().splitlines() if "gpu0:compute" in line)
    assert "500 TFLOPS" in row and "989 TFLOPS" in row and "0.51" in row
    samples = {(s.name, s.labels.get("test")): s.value for metric in _measurements(judged) for s in metric.samples}
    assert samples[("nodecheck_bandwidth_ratio", "gemm")] == pytest.approx(0.505, abs=0.001)
    assert samples[("nodecheck_gpu_flops_per_second", "gemm")] == 500e12
    assert ("nodecheck_bandwidth_bytes_per_second", "gemm") not in samples  # no byte rate: not a zero


# torch.matmul BF16 8192 x 8192 on healthy GPUs, as published (zzc0721/torch-performance-test-data: issue #79, #95,
# #108, #45 (its FP16 figure: the issue gives no BF16 one)): (NVML name, GiB, TFLOPS)
PUBLISHED_HEALTHY_GEMM = [("NVIDIA H100 80GB HBM3", 80, 797.51), ("NVIDIA H100 PCIe", 80, 492.84),
                          ("NVIDIA A100-PCIE-40GB", 40, 215.26), ("NVIDIA H200", 141, 790.29)]


@pytest.mark.parametrize(("name", "gib", "tflops"), PUBLISHED_HEALTHY_GEMM)
def test_published_healthy_gemm_runs_raise_no_finding(monkeypatch, hgx, name, gib, tflops):
    from nodecheck.assemble.gpu_specs import gpu_spec

    gpus = [dataclasses.replace(g, name=name, memory_bytes=gib << 30, spec=gpu_spec(name, gib << 30)) for g in hgx.gpus[:4]]
    replayed(monkeypatch, {g.index: computed(tflops * 1e12) for g in gpus}, "gemm")
    measurements = gpu_itself.gpu_tests(dataclasses.replace(hgx, gpus=gpus), {"gemm"}, "quick", 60)
    assert all(m.ok and m.ratio >= 0.6 for m in measurements)  # each at least 0.05 above the threshold
    assert measurement_findings(measurements, Config()) == []


def test_config_check_judges_a_saved_gemm_in_its_unit(monkeypatch, hgx):
    """`config check --from` a saved bench Report: its gemm is judged by the config's thresholds, in TFLOPS, and
    counted where [prolog] bench runs it."""
    from nodecheck.verdicts.config_check import as_the_prolog_judges

    report = dataclasses.replace(hgx, gpus=hgx.gpus[:1])
    replayed(monkeypatch, {0: computed(500e12)}, "gemm")
    saved = dataclasses.replace(report, measurements=gpu_itself.gpu_tests(report, {"gemm"}, "quick", 60))
    config = Config()
    config.prolog.bench = ["gemm"]
    findings, lines = as_the_prolog_judges(config, saved)
    ((line, counted),) = lines
    assert counted and line.startswith("gemm on gpu0:compute: 500 TFLOPS = 0.51 x spec, threshold 0.55 (calibrated for gemm over compute")
    assert line.endswith("error: bandwidth_below_spec") and "bandwidth_below_spec" in {f.kind for f in findings}
