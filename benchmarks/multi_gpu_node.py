"""On the first multi-GPU node (an HGX with 8 GPUs): every figure issue 26 (5) asks for, each beside its reference
and a verdict, in one run whose output can be pasted whole.

    python benchmarks/multi_gpu_node.py [--out DIR]     # run the steps; each command's output is kept in DIR
    python benchmarks/multi_gpu_node.py --replay DIR    # compare only, from what DIR holds (a run, or a paste)

The steps, in order, each under its own timeout (a tool that is missing or fails is a row saying so):
  nvml       benchmarks/nvml_nvlink_check.py, first and within 10 s: NVML's architecture and NVLink version per
             GPU and link, and the per-link rate nodecheck derives from them beside nvidia-smi's
  p2p        `nodecheck bench --tests p2p --json` beside `nvbandwidth -t device_to_device_memcpy_write_ce`, whose
             cell (row, column) is a copy engine writing from the row GPU into the column GPU in the source's
             context, as nodecheck's p2p copy runs (nvbandwidth's testcases_ce.cpp): goal 0.98-1.02 per pair
  allreduce  nodecheck's in-node all-reduce (`bench --tests allreduce --json`, 1 GiB) beside
             `all_reduce_perf -b 1G -e 1G -g N`, each run with NVLS on and with NVLS off (NCCL_NVLS_ENABLE=1, =0) and
             judged against the reference with the same setting: goal 0.97-1.03 of its 1 GiB row's out-of-place busbw
  h2d        h2d per GPU from nodecheck's one worker (which rebinds itself for each GPU) beside one fresh worker
             process per GPU bound to that GPU's CPUs (its socket): goal 0.98-1.02
  quick      `nodecheck bench --quick --json` wall time, three runs: goal <= 60 s on 8 GPUs
  remote     `nvidia-smi nvlink -R`, each GPU link's remote device and its link number, recorded: on an NVSwitch
             board, the map from a switch port an SXid names ("Link 30") to the GPU behind it, which nodecheck
             does not have yet (an SXid is joined to every GPU pair)

DIR holds: steps.json (each command, exit status, wall time), inspect.json, nvml.txt, p2p.json, nvbandwidth.txt,
allreduce-nvls-on.json, allreduce-nvls-off.json, nccl-nvls-on.txt, nccl-nvls-off.txt, h2d.json, h2d-gpuN.json, quick-N.json, nvlink-remote.txt. Exit status: 1 when a
figure misses its goal, else 2 when a figure could not be made (said in its row: no pass), else 0.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
from pathlib import Path

from figures import (
    Row,
    exit_status,
    gbps,
    judge,
    judge_folder,
    measurements,
    read_json,
    read_text,
    render,
    run_step,
    wall_time_row,
)

REPO = Path(__file__).resolve().parent.parent
GOALS = {"p2p": (0.98, 1.02), "allreduce": (0.97, 1.03), "h2d": (0.98, 1.02)}
NVLS = (("on", "1"), ("off", "0"))  # NCCL_NVLS_ENABLE for each pair of runs: NVLS reduces inside the NVSwitch
QUICK_GOAL_S = 60.0
NVML_GOAL_S = 10.0


# -- reading what the tools printed
def parse_nvbandwidth(text: str) -> dict[str, dict]:
    """{testcase: {"cells": {(row, col): GB/s}, "sum": GB/s or None, "failed": why or None}} from nvbandwidth's
    plain output: each "Running TESTCASE." followed by its matrix (a header of column numbers, then one row per
    GPU or CPU; N/A and the diagonal are no figure), and its "SUM TESTCASE VALUE" line when the version prints one. A
    matrix pasted without its "Running" line is kept under the name its title implies ("memcpy CE GPU(row) <-
    GPU(column)": device_to_device_memcpy_write_ce; "... -> ...": _read_ce; SM copies _sm), else "unnamed"."""
    out: dict[str, dict] = {}
    current, columns = None, []
    for line in text.splitlines():
        started = re.match(r"\s*Running (\w+)\.", line)
        if started:
            current = out.setdefault(started[1], {"cells": {}, "sum": None, "failed": None})
            columns = []
            continue
        if current is None and (title := re.match(r"\s*memcpy (CE|SM) GPU\(row\) (<-|->) GPU\(column\)", line)):
            name = f"device_to_device_memcpy_{'write' if title[2] == '<-' else 'read'}_{title[1].lower()}"
            current, columns = out.setdefault(name, {"cells": {}, "sum": None, "failed": None}), []
            continue
        if current is None and re.fullmatch(r"\s*(?:\d{1,3}\s+){1,255}\d{1,3}\s*", line):  # a matrix with no title at all
            current, columns = out.setdefault("unnamed", {"cells": {}, "sum": None, "failed": None}), []
        if current is None:
            continue
        total = re.match(r"\s*SUM (\w+) ([0-9.]+)\s*$", line)
        if total:
            out.setdefault(total[1], {"cells": {}, "sum": None, "failed": None})["sum"] = float(total[2])
            continue
        if line.lstrip().startswith(("ASSERT", "Invalid value")):  # a pattern check failed: the run aborts
            current["failed"] = current["failed"] or " ".join(line.split())[:200]
            continue
        cells = line.split()
        if cells and all(c.isdigit() for c in cells) and not columns:
            columns = [int(c) for c in cells]
            continue
        if columns and len(cells) == len(columns) + 1 and cells[0].isdigit():
            row = int(cells[0])
            for col, cell in zip(columns, cells[1:], strict=True):
                if re.fullmatch(r"[0-9]+\.[0-9]+", cell) and not (row == col and float(cell) == 0.0):
                    current["cells"][(row, col)] = float(cell)
    return out


def nccl_row_busbw(text: str, size: int = 1 << 30) -> float | None:
    """The out-of-place busbw (GB/s) of the row of `size` bytes, read by nodecheck's own nccl-tests parser."""
    from nodecheck.bench.nccl_tests import parse_nccl_log
    from nodecheck.core.errors import ParseError

    try:
        log = parse_nccl_log(text)
    except ParseError:  # all_reduce_perf failed and printed only its error: no row, said in the verdict
        return None
    for row in log.rows:
        if row.size_bytes == size and row.out_of_place is not None:
            return row.out_of_place.busbw_gbytes
    return None


def p2p_rows(bench: dict, nvbandwidth: dict[str, dict]) -> list[Row]:
    write = nvbandwidth.get("device_to_device_memcpy_write_ce")
    ours = {m["path"]: m for m in measurements(bench) if m.get("test") == "p2p" and m.get("direction") == "unidirectional"}
    if write is None:
        return [Row("p2p (all pairs)", "-", "-", None, "0.98-1.02", "n/a (no nvbandwidth device_to_device_memcpy_write_ce)")]
    if write["failed"]:
        return [Row("p2p (all pairs)", "-", "-", None, "0.98-1.02", f"FAILED (nvbandwidth: {write['failed']})")]
    rows = []
    for (a, b), reference in sorted(write["cells"].items()):
        mine = ours.get(f"gpu{a}->gpu{b}")
        value = gbps(mine)
        why = (mine or {}).get("error") or "nodecheck measured no such pair"
        rows.append(judge(f"p2p gpu{a}->gpu{b}", value, reference, GOALS["p2p"], missing=str(why)[:60]))
    return rows or [Row("p2p (all pairs)", "-", "-", None, "0.98-1.02", "n/a (nvbandwidth printed no pair)")]


def allreduce_rows(runs: dict[str, tuple[dict, str | None]]) -> list[Row]:
    """runs: NVLS "on"/"off" -> (nodecheck's bench JSON, all_reduce_perf's output) with that NCCL_NVLS_ENABLE: each
    figure beside the reference run with the same setting (NVLS lifts busbw above the links' rate: a figure with NVLS
    beside one without it compares the algorithm, not nodecheck)."""
    rows = []
    for label, (bench, text) in runs.items():
        mine = next((m for m in measurements(bench) if m.get("test") == "allreduce"
                     and str(m.get("path", "")).startswith("allreduce:node-")), None)
        value = gbps(mine)
        why = (mine or {}).get("error") or "nodecheck measured no in-node all-reduce"
        reference = nccl_row_busbw(text) if text else None
        rows.append(judge(f"all-reduce 1 GiB, NVLS {label}: vs nccl-tests", value, reference, GOALS["allreduce"],
                          missing=str(why)[:60] if value is None else "no 1 GiB row in all_reduce_perf's output"))
    return rows


def h2d_rows(one_worker: dict, per_gpu: dict[int, dict]) -> list[Row]:
    ours = {m["path"]: m for m in measurements(one_worker) if m.get("test") == "h2d"}
    if not per_gpu:
        return [Row("h2d: one worker vs a process per GPU", "-", "-", None, "0.98-1.02", "n/a (no per-GPU run)")]
    rows = []
    for index, result in sorted(per_gpu.items()):
        gpus = result.get("gpus") if isinstance(result, dict) else None
        pinned = [r for g in gpus or [] for r in g.get("rows", []) if r.get("memory") == "pinned"]
        reference = max((r["h2d"] for r in pinned), default=None)
        mine = ours.get(f"gpu{index}:host")
        value = gbps(mine)
        rows.append(judge(f"h2d gpu{index}: one worker vs its own process", value, reference / 1e9 if reference else None,
                          GOALS["h2d"], missing=str((mine or {}).get("error") or "no figure")[:60]))
    return rows


def quick_rows(steps: dict) -> list[Row]:
    runs = [s for name, s in sorted(steps.items()) if name.startswith("quick-")]
    rows = []
    for number, step in enumerate(runs, 1):
        rows.append(wall_time_row(f"bench --quick wall time, run {number}{' (cold)' if number == 1 else ''}", step, QUICK_GOAL_S))
    return rows or [Row("bench --quick wall time", "-", "-", None, f"<= {QUICK_GOAL_S:g} s", "n/a (not run)")]


def nvml_rows(text: str | None, step: dict | None) -> list[Row]:
    if text is None or step is None:
        return [Row("NVML architecture and NVLink version", "-", "nvidia-smi nvlink -s", None, "no MISMATCH", "n/a (not run)")]
    mismatches = text.count("MISMATCH")
    gpus = sum(1 for line in text.splitlines() if re.match(r"\s*\d+\s", line))
    verdict = "ok" if step.get("rc") == 0 else "MISMATCH" if mismatches else f"FAILED (exit {step.get('rc')})"
    time_verdict = "ok" if step["wall_s"] <= NVML_GOAL_S else "HIGH"
    return [Row("NVML link rate vs nvidia-smi", f"{gpus} GPU(s), {mismatches} mismatch(es)", "nvidia-smi nvlink -s", None,
                "no MISMATCH", verdict),
            Row("NVML check wall time", f"{step['wall_s']:.1f} s", "-", None, f"<= {NVML_GOAL_S:g} s", time_verdict)]


_REMOTE_END = re.compile(r"Link (\d+):[^\n]*?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])")


def remote_rows(text: str | None) -> list[Row]:
    """How many GPU links nvidia-smi named a remote end for, and how many devices those ends are (on an HGX H100:
    8 x 18 links to 4 NVSwitches)."""
    figure, reference = "NVLink remote ends (for the SXid port map)", "nvidia-smi nvlink -R"
    if text is None:
        return [Row(figure, "-", reference, None, "recorded", "n/a (not run)")]
    ends = _REMOTE_END.findall(text)
    if not ends:
        return [Row(figure, "0 links read", reference, None, "recorded", "n/a (format not read: see nvlink-remote.txt)")]
    return [Row(figure, f"{len(ends)} links to {len({address.upper() for _, address in ends})} devices", reference, None,
                "recorded", "ok")]


def compare(folder: Path) -> list[Row]:
    steps = read_json(folder / "steps.json")
    per_gpu = {int(m[1]): read_json(p) for p in sorted(folder.glob("h2d-gpu*.json")) if (m := re.search(r"h2d-gpu(\d+)\.json$", p.name))}
    return (nvml_rows(read_text(folder / "nvml.txt"), steps.get("nvml"))
            + p2p_rows(read_json(folder / "p2p.json"), parse_nvbandwidth(read_text(folder / "nvbandwidth.txt") or ""))
            + allreduce_rows({label: (read_json(folder / f"allreduce-nvls-{label}.json"), read_text(folder / f"nccl-nvls-{label}.txt"))
                              for label, _ in NVLS})
            + h2d_rows(read_json(folder / "h2d.json"), per_gpu)
            + quick_rows(steps)
            + remote_rows(read_text(folder / "nvlink-remote.txt")))


def run_all(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    steps: dict = {}
    nodecheck = [sys.executable, "-m", "nodecheck"]
    run_step(folder, steps, "nvml", [sys.executable, str(REPO / "benchmarks/nvml_nvlink_check.py")], NVML_GOAL_S * 3, "nvml.txt")
    run_step(folder, steps, "inspect", [*nodecheck, "inspect", "--json"], 120, "inspect.json")
    gpus = [g for g in read_json(folder / "inspect.json").get("gpus") or [] if isinstance(g, dict)]
    run_step(folder, steps, "p2p", [*nodecheck, "bench", "--tests", "p2p", "--json"], 600, "p2p.json")
    nvbandwidth = shutil.which("nvbandwidth") or "nvbandwidth"
    run_step(folder, steps, "nvbandwidth", [nvbandwidth, "-t", "device_to_device_memcpy_write_ce"], 600, "nvbandwidth.txt")
    perf = shutil.which("all_reduce_perf") or "all_reduce_perf"
    for label, nvls in NVLS:
        run_step(folder, steps, f"allreduce-nvls-{label}", [*nodecheck, "bench", "--tests", "allreduce", "--json"], 600,
                 f"allreduce-nvls-{label}.json", env={"NCCL_NVLS_ENABLE": nvls})
        run_step(folder, steps, f"nccl-nvls-{label}", [perf, "-b", "1G", "-e", "1G", "-g", str(len(gpus) or 8)], 600,
                 f"nccl-nvls-{label}.txt", env={"NCCL_NVLS_ENABLE": nvls})
    run_step(folder, steps, "h2d", [*nodecheck, "bench", "--tests", "h2d", "--json"], 600, "h2d.json")
    for gpu in gpus:
        index = gpu.get("index")
        run_step(folder, steps, f"h2d-gpu{index}",
                 [sys.executable, "-m", "nodecheck.bench.gpu_worker", "copy", "--device", str(index), "--uuid", str(gpu.get("uuid") or ""),
                  "--cpus", str(gpu.get("cpu_affinity") or ""), "--sizes", str(256 << 20), "--out", str(folder / f"h2d-gpu{index}.json")],
                 300)
    for number in (1, 2, 3):
        run_step(folder, steps, f"quick-{number}", [*nodecheck, "bench", "--quick", "--json"], 300, f"quick-{number}.json")
    run_step(folder, steps, "remote", ["nvidia-smi", "nvlink", "-R"], 60, "nvlink-remote.txt")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("multi-gpu-run"), help="where each command's output is kept")
    parser.add_argument("--replay", type=Path, default=None, help="compare only, from a folder a run wrote")
    args = parser.parse_args(argv)
    folder = args.replay or args.out
    if args.replay is None:
        run_all(folder)
    rows = judge_folder(compare, folder)
    if rows is None:
        return 2
    nvml = read_text(folder / "nvml.txt")
    if nvml:  # the per-GPU table itself: what NVML returned is the figure item 5 asks for first
        print("NVML, as benchmarks/nvml_nvlink_check.py printed it:\n" + nvml.rstrip()[:20000] + "\n")
    print(render(rows))
    ratios = [r.ratio for r in rows if r.ratio is not None and r.figure.startswith("p2p")]
    if ratios:
        print(f"p2p ratios: min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, max {max(ratios):.3f} over {len(ratios)} pairs")
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
