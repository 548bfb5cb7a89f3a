"""Host<->device, GPU p2p and the all-reduce inside one node, each in worker processes with a hard
time limit (nodecheck.bench.gpu_worker, nodecheck.bench.worker with NCCL). Never imports torch."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from nodecheck.bench.gpu_worker import VERIFY_ELEMENTS
from nodecheck.bench.results import run_worker
from nodecheck.core.errors import NodecheckError
from nodecheck.report.model import Measurement, Report

MiB = 1 << 20
COPY_LEVELS = {
    "quick": {"sizes": [256 * MiB], "warmup": 2, "repeats": 5, "pageable": False},
    "full": {"sizes": [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB], "warmup": 3, "repeats": 10, "pageable": True},
}
COPY_METHOD = ("torch copy_ with {memory} host memory, copies queued behind a GPU sleep and timed by CUDA events, "
               "median of {repeats} samples after {warmup} warm-ups")
PAIR_TIMEOUT_MIN = 10.0  # seconds a GPU pair may take before it counts as hung (a healthy pair takes well under 1 s)
P2P_METHOD = ("torch copy_ between devices, copies queued behind a GPU sleep and timed by CUDA events on the source's "
              "stream, median of {repeats} samples")


# A pair without peer access copies through host memory: on PCIe that is a path of its own, calibrated
# (pcie-staged); between GPUs that NVLink links it is a fault of its own (nvlink-no-peer), with its advice.
NO_PEER_KIND = {"pcie": "pcie-staged", "nvlink": "nvlink-no-peer"}


def _spec(report: Report, path: str) -> float | None:
    found = report.path_spec(path)
    return found.bytes_per_second if found else None


def path_kind(report: Report, path: str) -> str | None:
    found = report.path_spec(path)
    return found.kind if found else None


def _worker(argv: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="nodecheck-gpu-") as tmp:
        out = Path(tmp) / "result.json"
        return run_worker([sys.executable, "-m", "nodecheck.bench.gpu_worker", *argv, "--out", str(out)], out, timeout,
                          what="the GPU worker")


# A slow copy is measured again, in a fresh process, before it is believed: on an H100 VM, runs of the
# same healthy link ranged 29..55 GB/s (benchmarks/bench_h2d_spread.py) while a narrower or slower
# link caps every run. So the best run is the verdict, and each run is kept in details["runs"].
RETRIES = 2


def _largest_pinned(result: dict) -> dict:
    return max((r for r in result["rows"] if r["memory"] == "pinned"), key=lambda r: r["size_bytes"])


def _copy_argv(gpus, plan: dict) -> list[str]:
    """One worker for these GPUs (torch imported once), each found by UUID, else PCI bus id, else index."""
    listed = [{"index": g.index, "uuid": g.uuid, "pci": g.pci_bus_id, "cpus": g.cpu_affinity} for g in gpus]
    return ["copy", "--gpus", json.dumps(listed), "--sizes", ",".join(map(str, plan["sizes"])), "--warmup", str(plan["warmup"]),
            "--repeats", str(plan["repeats"])] + (["--pageable"] if plan["pageable"] else [])


def copy_runs(gpus, plan: dict, wanted: list[str], floors: dict[int, dict[str, float]], timeout: float):
    """({gpu index: [each run's result]}, {gpu index: error}): every GPU in one worker; then the GPUs whose
    best run of a wanted direction is below its floor (bytes/s) again, RETRIES times at most, while a run
    as long as the last still fits in `timeout`."""
    deadline = time.monotonic() + timeout
    runs: dict[int, list[dict]] = {g.index: [] for g in gpus}
    errors: dict[int, str] = {}
    todo = list(gpus)
    for _ in range(RETRIES + 1):
        started = time.monotonic()
        try:
            result = _worker(_copy_argv(todo, plan), max(1.0, deadline - started))
            by_index = {r.get("index"): r for r in result["gpus"]}
        except (NodecheckError, OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            errors.update({g.index: str(error) for g in todo if not runs[g.index]})
            break
        for g in todo:
            got = by_index.get(g.index) or {"error": {"type": "LookupError", "message": "the worker did not measure it"}}
            if "error" in got:
                errors.setdefault(g.index, f"{got['error'].get('type')}: {got['error'].get('message')}")
            else:
                runs[g.index].append(got)
        todo = [g for g in todo if runs[g.index] and any(
            max(_largest_pinned(r)[t] for r in runs[g.index]) < floors[g.index].get(t, 0) for t in wanted)]
        if not todo or time.monotonic() + (time.monotonic() - started) > deadline:
            break
    return runs, errors


def copy_tests(report: Report, config, tests: set[str], level: str, timeout: float) -> list[Measurement]:
    plan = COPY_LEVELS[level]
    wanted = [t for t in ("h2d", "d2h") if t in tests]
    method = COPY_METHOD.format(memory="pinned", **plan)
    kinds = {g.index: path_kind(report, f"gpu{g.index}:host") for g in report.gpus}
    specs = {g.index: _spec(report, f"gpu{g.index}:host") for g in report.gpus}
    floors = {i: {t: config.ratio_for(t, kinds[i]) * specs[i] for t in wanted} if specs[i] else {} for i in specs}
    runs, errors = copy_runs(report.gpus, plan, wanted, floors, timeout)
    out = []
    for gpu in report.gpus:
        path = f"gpu{gpu.index}:host"
        if not runs[gpu.index]:
            error = errors.get(gpu.index, "no result")
            out += [Measurement.failed(path, t, method, "unidirectional", f"{t} on gpu{gpu.index} failed: {error}") for t in wanted]
            continue
        for test in wanted:
            mine = runs[gpu.index]
            best = max(mine, key=lambda r: _largest_pinned(r)[test])
            largest = _largest_pinned(best)
            details = {"rows": best["rows"], "cpus": best["cpus"], "numa_node": gpu.numa_node, "binding": best.get("binding"),
                       "path_kind": kinds[gpu.index], "measured_device": best.get("measured"),
                       "host_buffer_numa_node": largest.get("host_numa_node"),
                       "pinned_blocks_created": best.get("pinned_blocks_created")}
            placed = largest.get("host_numa_node")
            if placed is not None and gpu.numa_node is not None and placed != gpu.numa_node:
                details["note"] = (f"the pinned host buffer sat on NUMA node {placed}, not the GPU's node {gpu.numa_node}: "
                                   "the figure is a cross-socket copy (the binding could not place it; see binding)")
            if len(mine) > 1:
                details["runs"] = [_largest_pinned(r)[test] for r in mine]
            out.append(Measurement.measured(path, test, largest[test], specs[gpu.index], largest["size_bytes"],
                                            method + (f", best of {len(mine)} runs" if len(mine) > 1 else ""),
                                            "unidirectional", details))
    return out


def p2p_tests(report: Report, level: str, timeout: float) -> list[Measurement]:
    plan = COPY_LEVELS[level]
    method = P2P_METHOD.format(**plan)
    try:
        listed = [{"index": g.index, "uuid": g.uuid, "pci": g.pci_bus_id} for g in report.gpus]
        pairs = max(1, len(listed) * (len(listed) - 1))
        result = _worker(["p2p", "--gpus", json.dumps(listed), "--sizes", str(max(plan["sizes"])), "--warmup", str(plan["warmup"]),
                          "--repeats", str(plan["repeats"]), "--pair-timeout", str(max(PAIR_TIMEOUT_MIN, timeout / 2 / pairs))], timeout)
    except (NodecheckError, OSError, ValueError) as error:
        return [Measurement.failed("gpus:p2p", "p2p", method, "unidirectional", f"GPU p2p copies failed: {error}")]
    out = []
    missing = result.get("missing") or []
    if missing:  # torch sees fewer GPUs than NVML: the pairs it cannot reach are a failure, named, not left out
        shown = ", ".join(f"gpu{m.get('index')}" for m in missing)
        out.append(Measurement.failed("gpus:p2p", "p2p", method, "unidirectional",
                                      f"torch sees {result.get('cuda_count')} CUDA device(s), NVML lists {len(report.gpus)} GPU(s): "
                                      f"{shown} not visible to CUDA, their pairs unmeasured ({missing[0].get('why')})"))
    hung = result.get("hung")
    if isinstance(hung, dict):  # the pairs that finished are kept; the hung one and those after it are named
        measured = {(p["src"], p["dst"]) for p in result["pairs"]}
        left = [f"gpu{a}->gpu{b}" for a in (g.index for g in report.gpus) for b in (g.index for g in report.gpus)
                if a != b and (a, b) not in measured and (a, b) != (hung.get("src"), hung.get("dst"))]
        out.append(Measurement.failed(f"gpu{hung.get('src')}->gpu{hung.get('dst')}", "p2p", method, "unidirectional",
                                      f"the copy gpu{hung.get('src')}->gpu{hung.get('dst')} did not finish within {hung.get('limit_s'):g} s "
                                      f"(a hung peer copy: check `nvidia-smi nvlink -s`, Xid errors, the fabric manager); "
                                      f"{len(left)} pair(s) after it not measured"))
    for pair in result["pairs"]:
        a, b = pair["src"], pair["dst"]
        spec = _spec(report, f"gpu{min(a, b)}:gpu{max(a, b)}")
        kind = path_kind(report, f"gpu{min(a, b)}:gpu{max(a, b)}")
        if not pair["p2p_access"]:  # the copy goes through host memory: judged as such, advised as such
            kind = NO_PEER_KIND.get(kind, kind)
        details = {"p2p_access": pair["p2p_access"], "path_kind": kind}
        if isinstance(pair.get("wrong_elements"), int):
            details["data_check"] = {"expected": "each int32 its own index", "elements": VERIFY_ELEMENTS,
                                     "wrong_elements": pair["wrong_elements"]}
        out.append(Measurement.measured(f"gpu{a}->gpu{b}", "p2p", pair["unidirectional"], spec, result["size_bytes"], method,
                            "unidirectional", details))
        if "bidirectional" not in pair:
            continue  # measured once per unordered pair
        # both directions at once: compared with twice the one-way spec (duplex), labelled as such
        both = {k: v for k, v in details.items() if k != "data_check"}  # checked once, on the one-way copy
        out.append(Measurement.measured(f"gpu{a}<->gpu{b}", "p2p", pair["bidirectional"], 2 * spec if spec else None,
                            result["size_bytes"], method, "bidirectional", both))
    return out
