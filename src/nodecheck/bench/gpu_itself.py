"""The GPU itself: its memory bandwidth (`hbm`) against its model's spec (specs.toml [[gpu_models]]) and against its
siblings of the same model in the node. One worker per GPU (nodecheck.bench.gpu_itself_worker), all GPUs at once:
that is how a node is used, and it shows the power and cooling limits a one-at-a-time test hides. Never imports torch.

A GPU another process holds (NVML's list: a job, a stray process) is not tested: its memory is that process's, and
a figure beside it would judge the sharing. It is said, never failed."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nodecheck.bench.results import run_worker
from nodecheck.core.errors import NodecheckError
from nodecheck.report.model import Measurement, Report

LEVELS = {"quick": {"seconds": 2.0}, "full": {"seconds": 30.0}}  # timed samples per GPU; --full shows thermal braking
HBM_METHOD = ("device-to-device copy of a {size} buffer (torch copy_), bytes read + written over the time the copies took "
              "(CUDA events), median of {samples} samples over {seconds:g} s, all {gpus} GPU(s) at once")
PATH_KIND = "memory"  # the threshold row: specs.toml [thresholds."hbm.memory"]
PEERS_MIN = 3  # GPUs of one model before one of them is judged against the others (two cannot say which is slow)


def hbm_path(index: int) -> str:
    return f"gpu{index}:memory"


def holders(gpu) -> list[str]:
    """The processes other than nodecheck's own (and its job's) that hold the GPU, as "pid 4242 python (job 17)"."""
    return [f"pid {p.pid} {p.name or '?'}" + (f" (job {p.job})" if p.job is not None else "")
            for p in gpu.processes or [] if not p.ours and not p.gone]


def hbm_tests(report: Report, level: str, timeout: float, device: str = "cuda") -> list[Measurement]:
    """One hbm Measurement per GPU: measured, failed (saying why), or not tested (held by another process)."""
    plan = LEVELS[level]
    out, todo = [], []
    for gpu in report.gpus:
        held = holders(gpu)
        if held:
            skipped = Measurement.failed(hbm_path(gpu.index), "hbm", "not run", "read+write",
                                         f"gpu{gpu.index} is held by {', '.join(held[:3])}: not tested (its memory is theirs)")
            skipped.details["skipped"] = "held by another process"
            out.append(skipped)
        else:
            todo.append(gpu)
    if not todo:
        return out
    with ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="nodecheck-hbm") as pool:
        answers = list(pool.map(lambda gpu: _run(gpu, plan, timeout, device), todo))
    for gpu, answer in zip(todo, answers, strict=True):
        out.append(_measurement(gpu, answer, plan, len(todo)))
    return _against_siblings(report, out)


def _run(gpu, plan: dict, timeout: float, device: str) -> dict:
    """The worker's answer for one GPU, or {"error": why}."""
    listed = json.dumps({"index": gpu.index, "uuid": gpu.uuid, "pci": gpu.pci_bus_id})
    try:
        with tempfile.TemporaryDirectory(prefix="nodecheck-hbm-") as tmp:
            out = Path(tmp) / "result.json"
            return run_worker([sys.executable, "-m", "nodecheck.bench.gpu_itself_worker", "hbm", "--gpu", listed,
                               "--seconds", str(plan["seconds"]), "--device", device, "--out", str(out)], out, timeout,
                              what=f"the hbm worker of gpu{gpu.index}")
    except (NodecheckError, OSError) as error:
        return {"error": str(error)}


def _measurement(gpu, answer: dict, plan: dict, gpus: int) -> Measurement:
    path = hbm_path(gpu.index)
    figures = answer.get("hbm") if isinstance(answer, dict) else None
    method = HBM_METHOD.format(size="?", samples="?", seconds=plan["seconds"], gpus=gpus)
    if "error" in answer or not isinstance(figures, dict):
        return Measurement.failed(path, "hbm", method, "read+write", f"hbm on gpu{gpu.index} failed: {answer.get('error', 'no result')}")
    try:
        rate, size, wrong = float(figures["bytes_per_second"]), int(figures["size_bytes"]), int(figures["wrong_bytes"])
        method = HBM_METHOD.format(size=f"{size >> 20} MiB", samples=int(figures["samples"]), seconds=plan["seconds"], gpus=gpus)
    except (KeyError, TypeError, ValueError) as error:
        return Measurement.failed(path, "hbm", method, "read+write", f"hbm on gpu{gpu.index}: the worker's answer is not one ({error})")
    spec = gpu.spec.memory_bytes_per_second if gpu.spec else None
    details = {"path_kind": PATH_KIND, "model": gpu.spec.model if gpu.spec else gpu.name, "device": answer.get("device"),
               "measured_device": answer.get("measured"), "best_bytes_per_second": figures.get("best_bytes_per_second"),
               "free_bytes": figures.get("free_bytes"),
               "data_check": {"expected": "every byte copied as written (0x5A)", "elements": size, "wrong_elements": wrong}}
    if spec is None:
        details["spec_basis"] = f"no spec for {gpu.name!r} in specs.toml [[gpu_models]]: judged against its siblings only"
    else:
        details["spec_basis"] = f"{gpu.spec.model}: {gpu.spec.source}"
    return Measurement.measured(path, "hbm", rate, spec, size, method, "read+write", details)


def _against_siblings(report: Report, measurements: list[Measurement]) -> list[Measurement]:
    """Each measured GPU's ratio to the median of the GPUs of its model in the node (details.sibling_ratio, with the
    median and how many), where PEERS_MIN or more of that model were measured."""
    name_of = {hbm_path(g.index): g.name for g in report.gpus}
    by_model: dict[str, list[Measurement]] = {}
    for m in measurements:
        if m.ok and m.bytes_per_second:
            by_model.setdefault(name_of.get(m.path) or "", []).append(m)
    for siblings in by_model.values():
        if len(siblings) < PEERS_MIN:
            continue
        median = statistics.median(m.bytes_per_second for m in siblings)
        for m in siblings:
            m.details.update(sibling_ratio=round(m.bytes_per_second / median, 4), sibling_median=median, siblings=len(siblings))
    return measurements
