"""The GPU itself: its memory bandwidth (`hbm`) and its dense BF16 matrix throughput (`gemm`) against its model's spec
(specs.toml [[gpu_models]]) and against its siblings of the same model in the node, and whether it computes the same
bits as they do (the silent-data-corruption check that rides on `gemm`). One worker per GPU
(nodecheck.bench.gpu_itself_worker), all GPUs at once: that is how a node is used, and it shows the power and cooling
limits a one-at-a-time test hides. Never imports torch.

A GPU another process holds (NVML's list: a job, a stray process) is not tested: its memory is that process's, and
a figure beside it would judge the sharing. It is said, never failed."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nodecheck.bench.gpu_load import LoadSampler
from nodecheck.bench.results import run_worker
from nodecheck.core.errors import NodecheckError
from nodecheck.report.model import Measurement, Report

TESTS = ("hbm", "gemm")  # in the order they run
LEVELS = {"quick": {"seconds": 2.0}, "full": {"seconds": 30.0}}  # timed samples per GPU; --full shows thermal braking
METHODS = {
    "hbm": ("device-to-device copy of a {size} buffer (torch copy_), bytes read + written over the time the copies took "
            "(CUDA events), median of {samples} samples over {seconds:g} s, all {gpus} GPU(s) at once"),
    "gemm": ("BF16 matrix multiplies of {size} (torch.matmul, cuBLAS), 2n^3 operations each over the time they took (CUDA "
             "events), median of {samples} samples over {seconds:g} s after a warm-up, all {gpus} GPU(s) at once"),
}
PATH_KIND = {"hbm": "memory", "gemm": "compute"}  # the threshold rows: specs.toml [thresholds."hbm.memory"], "gemm.compute"
DIRECTION = {"hbm": "read+write", "gemm": "bf16 dense"}
# cuBLAS gives the same bits for the same inputs only with a fixed workspace (NVIDIA's cuBLAS docs, "Results
# reproducibility"; torch.use_deterministic_algorithms refuses to run a CUDA matmul without it)
DETERMINISTIC_CUBLAS = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
PEERS_MIN = 3  # GPUs of one model before one of them is judged against the others (two cannot say which is slow)


def test_path(test: str, index: int) -> str:
    return f"gpu{index}:{PATH_KIND[test]}"


def holders(gpu) -> list[str]:
    """The processes other than nodecheck's own (and its job's) that hold the GPU, as "pid 4242 python (job 17)"."""
    return [f"pid {p.pid} {p.name or '?'}" + (f" (job {p.job})" if p.job is not None else "")
            for p in gpu.processes or [] if not p.ours and not p.gone]


def gpu_tests(report: Report, tests: set[str], level: str, timeout: float, device: str = "cuda") -> list[Measurement]:
    """One Measurement per GPU and test: measured, failed (saying why), or not tested (held by another process).
    Each test runs on all GPUs at once, `timeout` seconds each."""
    out = []
    for test in (t for t in TESTS if t in tests):
        out += _one_test(report, test, level, timeout, device)
    return out


def hbm_tests(report: Report, level: str, timeout: float, device: str = "cuda") -> list[Measurement]:
    return gpu_tests(report, {"hbm"}, level, timeout, device)


def _one_test(report: Report, test: str, level: str, timeout: float, device: str) -> list[Measurement]:
    plan = LEVELS[level]
    out, todo = [], []
    for gpu in report.gpus:
        held = holders(gpu)
        if held:
            skipped = Measurement.failed(test_path(test, gpu.index), test, "not run", DIRECTION[test],
                                         f"gpu{gpu.index} is held by {', '.join(held[:3])}: not tested (its memory is theirs)")
            skipped.details["skipped"] = "held by another process"
            out.append(skipped)
        else:
            todo.append(gpu)
    if not todo:
        return out
    with LoadSampler([g.index for g in todo] if device == "cuda" else []) as sampler, \
            ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix=f"nodecheck-{test}") as pool:
        answers = list(pool.map(lambda gpu: _run(gpu, test, plan, timeout, device), todo))
    for gpu, answer in zip(todo, answers, strict=True):
        measured = _measurement(test, gpu, answer, plan, len(todo))
        if device == "cuda" and measured.ok:  # what the GPU did meanwhile: why a slow one is slow
            measured.details["load"] = sampler.summary(gpu.index, _window(answer.get(test)))
        out.append(measured)
    _against_siblings(report, out)
    if test == "gemm":
        _compare_results(report, out)
    return out


def _run(gpu, test: str, plan: dict, timeout: float, device: str) -> dict:
    """The worker's answer for one GPU, or {"error": why}."""
    listed = json.dumps({"index": gpu.index, "uuid": gpu.uuid, "pci": gpu.pci_bus_id})
    try:
        with tempfile.TemporaryDirectory(prefix=f"nodecheck-{test}-") as tmp:
            out = Path(tmp) / "result.json"
            return run_worker([sys.executable, "-m", "nodecheck.bench.gpu_itself_worker", test, "--gpu", listed,
                               "--seconds", str(plan["seconds"]), "--device", device, "--out", str(out)], out, timeout,
                              env=dict(os.environ, **DETERMINISTIC_CUBLAS), what=f"the {test} worker of gpu{gpu.index}")
    except (NodecheckError, OSError) as error:
        return {"error": str(error)}


def _measurement(test: str, gpu, answer: dict, plan: dict, gpus: int) -> Measurement:
    path = test_path(test, gpu.index)
    figures = answer.get(test) if isinstance(answer, dict) else None
    method = METHODS[test].format(size="?", samples="?", seconds=plan["seconds"], gpus=gpus)
    if "error" in answer or not isinstance(figures, dict):
        return Measurement.failed(path, test, method, DIRECTION[test], f"{test} on gpu{gpu.index} failed: {answer.get('error', 'no result')}")
    try:
        read = _hbm(figures) if test == "hbm" else _gemm(figures)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return Measurement.failed(path, test, method, DIRECTION[test], f"{test} on gpu{gpu.index}: the worker's answer is not one ({error})")
    rate, payload, size, details = read
    method = METHODS[test].format(size=size, samples=int(figures["samples"]), seconds=plan["seconds"], gpus=gpus)
    details.update(path_kind=PATH_KIND[test], model=gpu.spec.model if gpu.spec else gpu.name, device=answer.get("device"),
                   measured_device=answer.get("measured"))
    spec = _spec(test, gpu)
    details["spec_basis"] = (f"{gpu.spec.model}: {gpu.spec.source}" if spec is not None else
                             f"no spec for {gpu.name!r} in specs.toml [[gpu_models]]: judged against its siblings only")
    make = Measurement.measured if test == "hbm" else Measurement.computed
    return make(path, test, rate, spec, payload, method, DIRECTION[test], details)


def _hbm(figures: dict) -> tuple[float, int, str, dict]:
    size, wrong, words = int(figures["size_bytes"]), int(figures["wrong_words"]), int(figures["words_checked"])
    return float(figures["bytes_per_second"]), size, f"{size >> 20} MiB", {
        "best_bytes_per_second": figures.get("best_bytes_per_second"), "free_bytes": figures.get("free_bytes"),
        "data_check": {"expected": "each 32-bit word its own index, then its complement", "elements": words, "wrong_elements": wrong,
                       "seconds": _seconds(figures.get("check_seconds"))}}


def _gemm(figures: dict) -> tuple[float, int, str, dict]:
    n, check = int(figures["n"]), figures["check"]
    digests = [str(d)[:64] for d in check["digests"]][:2]
    if len(digests) != 2:
        raise ValueError("the check holds no two digests")
    return float(figures["flops_per_second"]), 3 * n * n * 2, f"{n} x {n}", {
        "precision": "bf16", "best_flops_per_second": figures.get("best_flops_per_second"),
        "result_check": {"inputs": f"{int(check['n'])} x {int(check['n'])} BF16 from seed {int(check['seed'])}",
                         "digests": digests, "seconds": _seconds(check.get("seconds"))}}


def _seconds(value) -> float | None:
    """What a check cost, as the worker timed it; None where its answer holds no plain duration."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 86400 else None


def _window(figures) -> tuple[float, float] | None:
    """The worker's timed run, wall-clock seconds, where its answer says it plainly."""
    window = figures.get("window") if isinstance(figures, dict) else None
    if isinstance(window, list) and len(window) == 2 and all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in window):
        return float(window[0]), float(window[1])
    return None


def _spec(test: str, gpu) -> float | None:
    if gpu.spec is None:
        return None
    if test == "hbm":
        return gpu.spec.memory_bytes_per_second
    tflops = gpu.spec.dense_tflops.get("bf16")
    return tflops * 1e12 if tflops else None


def _against_siblings(report: Report, measurements: list[Measurement]) -> None:
    """Each measured GPU's ratio to the median of the GPUs of its model in the node (details.sibling_ratio, with the
    median and how many), where PEERS_MIN or more of that model were measured."""
    for siblings in _by_model(report, [m for m in measurements if m.ok and m.figure]).values():
        if len(siblings) < PEERS_MIN:
            continue
        median = statistics.median(m.figure for m in siblings)
        for m in siblings:
            m.details.update(sibling_ratio=round(m.figure / median, 4), sibling_median=median, siblings=len(siblings))


def _compare_results(report: Report, measurements: list[Measurement]) -> None:
    """Each GPU's check result against its own repeat and against the GPUs of its model: details.result_check gains
    `repeat_agrees`, and where two or more of the model answered, `usual` (the digest most of them gave: none when
    no digest has a majority), `agreeing` and `of`."""
    checked = [m for m in measurements if m.ok and isinstance(m.details.get("result_check"), dict)]
    for m in checked:
        digests = m.details["result_check"]["digests"]
        m.details["result_check"]["repeat_agrees"] = digests[0] == digests[1]
    for siblings in _by_model(report, checked).values():
        if len(siblings) < 2:
            continue
        counts = Counter(m.details["result_check"]["digests"][0] for m in siblings)
        usual, most = counts.most_common(1)[0]
        majority = usual if most * 2 > len(siblings) else None
        for m in siblings:
            m.details["result_check"].update(usual=majority, agreeing=most, of=len(siblings))


def _by_model(report: Report, measurements: list[Measurement]) -> dict[str, list[Measurement]]:
    name_of = {g.index: g.name for g in report.gpus}
    grouped: dict[str, list[Measurement]] = {}
    for m in measurements:
        index = int(m.path.split(":")[0].removeprefix("gpu"))
        grouped.setdefault(name_of.get(index) or "", []).append(m)
    return grouped
