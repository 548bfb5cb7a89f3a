"""On a node with one GPU (the lent H100): the figures issue 26 items 2 to 4 ask for, each beside what it is
checked against and a verdict, in one run whose output can be pasted whole.

    python benchmarks/one_gpu_node.py [--out DIR]     # run the steps (as root); each command's output is kept in DIR
    python benchmarks/one_gpu_node.py --replay DIR    # judge again, from what DIR holds

The steps, each under its own timeout (a tool that is missing or fails is a row saying so):
  nvml        NVML's raw answers (nodecheck.probes.nvml.dump_nvml): values, or NVML's own error ("Not Supported")
  inspect     `nodecheck inspect --json` as root; the AER files each device of a GPU's PCIe path has, listed here
              from sysfs beside what the Report read
  metrics     `nodecheck check --textfile-dir DIR`: what /metrics would export (an unsupported counter has no series,
              never a 0)
  unit        `nodecheck inspect --json` under the shipped unit's privileges, emulated: uid 65534, the systemd-journal
              group (SupplementaryGroups=), no capabilities, no new privileges, /dev/kmsg unreadable
              (ProtectKernelLogs=); the rest of systemd's sandbox is not applied
  copy-twice  one copy worker measuring GPU 0 twice, bound first to one half of this process's CPUs, then to the other:
              each pass's pinned blocks made (torch's host allocator), host buffer address and the buffer's NUMA node
  fewer       `nodecheck bench --tests h2d --json` with CUDA_VISIBLE_DEVICES= : NVML names a GPU torch cannot see
  data-check  benchmarks/bench_data_check.py at 64 MiB, 256 MiB and 1 GiB: each data check's time beside the
              measurement it follows
  quick       `nodecheck bench --quick --json` three times cold (page cache dropped first, unless --keep-page-cache)
              and warm (right after)

Exit status: 1 when a figure misses its goal, else 2 when a figure could not be made, else 0.
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import re
import sys
from pathlib import Path

from figures import Row, exit_status, judge_folder, measurements, read_json, read_text, render, run_step, wall_time_row

from nodecheck.core.units import parse_cpulist
from nodecheck.probes.nvml_fabric import FABRIC_STATES

REPO = Path(__file__).resolve().parent.parent
QUICK_GOAL_S = 10.0  # one GPU: measured 4.2-6.4 s warm on the H100 VM (docs/measured-on-gpu.md)
DATA_CHECK_SIZES = "64MiB,256MiB,1GiB"
UNIT_UID = 65534  # systemd's DynamicUser= is an unprivileged uid with no capabilities; nobody stands in
# ProtectKernelLogs= leaves /dev/kmsg unopenable: a mode-000 file bound over it does the same for an unprivileged uid
UNIT_SHELL = ('g=$1; shift; f=$(mktemp) && chmod 000 "$f" && mount --bind "$f" /dev/kmsg && rm -f "$f" || exit 97; '
              'if [ -n "$g" ]; then set -- --groups="$g" -- "$@"; else set -- --clear-groups -- "$@"; fi; '
              f'cd / && exec setpriv --reuid={UNIT_UID} --regid={UNIT_UID} --inh-caps=-all --bounding-set=-all --no-new-privs "$@"')


# -- item 2: the one-worker copy path
def halves(cpus: list[int]) -> tuple[str, str]:
    """Two CPU sets for GPU 0's two passes: the first and second half of `cpus` (one CPU: it, twice)."""
    cpus = sorted(cpus)
    middle = max(1, len(cpus) // 2)
    first, second = cpus[:middle], cpus[middle:] or cpus[:middle]
    return ",".join(map(str, first)), ",".join(map(str, second))


def cpu_nodes(cpulist: str, node_cpus: dict[int, list[int]]) -> list[int]:
    """The NUMA nodes holding any CPU of `cpulist` ([] when it or the nodes are unknown)."""
    try:
        wanted = set(parse_cpulist(cpulist))
    except ValueError:
        return []
    return sorted(node for node, cpus in node_cpus.items() if wanted & set(cpus))


def copy_twice_rows(result: dict, cpusets: dict) -> list[Row]:
    passes = [g for g in (result.get("gpus") or []) if isinstance(g, dict)]
    if len(passes) != 2 or any("error" in p for p in passes):
        errors = [e for e in [result.get("error")] + [p.get("error") for p in passes] if isinstance(e, dict)]
        why = errors[0].get("message", "") if errors else "not two passes"
        return [Row("copy: GPU 0 twice, two CPU sets", "-", "-", None, "two passes", f"FAILED ({str(why)[:60]})")]
    rows = []
    made = [p.get("pinned_blocks_created") for p in passes]
    if any(m is None for m in made):
        rows.append(Row("copy: pinned blocks made, pass 1 / 2", "-", "torch host_memory_stats", None, "> 0 each",
                        "n/a (this torch does not count them)"))
    else:
        rows.append(Row("copy: pinned blocks made, pass 1 / 2", f"{made[0]} / {made[1]}", "torch host_memory_stats", None,
                        "> 0 each", "ok" if all(m > 0 for m in made) else "FAILED (a pass reused cached blocks)"))
    pinned = [[r for r in p.get("rows") or [] if r.get("memory") == "pinned"] for p in passes]
    addresses = [" ".join(str(r.get("host_address")) for r in rows_) for rows_ in pinned]
    rows.append(Row("copy: host buffer address, pass 1 / 2", f"{addresses[0]} / {addresses[1]}", "-", None, "logged",
                    "ok" if all(a and "None" not in a for a in addresses) else "n/a (not logged)"))
    node_cpus = {int(k): v for k, v in (cpusets.get("nodes") or {}).items()}
    for number, (p, rows_) in enumerate(zip(passes, pinned, strict=True), 1):
        nodes = cpu_nodes(str(p.get("cpus") or ""), node_cpus)
        found = [r.get("host_numa_node") for r in rows_]
        verdict = ("n/a (the kernel did not say)" if not found or None in found
                   else "ok" if not nodes or all(n in nodes for n in found) else "FAILED (not the bound CPUs' node)")
        rows.append(Row(f"copy: buffer NUMA node, pass {number} (CPUs {p.get('cpus')})"[:48], ",".join(map(str, found)),
                        f"CPUs' node(s) {','.join(map(str, nodes)) or '?'}", None, "= CPUs' node", verdict))
    rates = [max((r.get("h2d") or 0 for r in rows_), default=0) / 1e9 for rows_ in pinned]
    rows.append(Row("copy: h2d, pass 2 vs pass 1", f"{rates[1]:.2f} GB/s", f"{rates[0]:.2f} GB/s",
                    rates[1] / rates[0] if rates[0] else None, "-", "measured"))
    return rows


def fewer_rows(report: dict, step: dict | None) -> list[Row]:
    figure = "torch sees fewer GPUs than NVML names"
    if step is None:
        return [Row(figure, "-", "-", None, "a named failure", "n/a (not run)")]
    h2d = [m for m in measurements(report) if m.get("test") == "h2d"]
    if step.get("rc") not in (0, 1) or not h2d:
        return [Row(figure, f"exit {step.get('rc')}", "-", None, "a named failure", f"FAILED ({step.get('stderr', '')[-60:]})")]
    error = str(h2d[0].get("error") or "")
    named = not h2d[0].get("ok") and "CUDA_VISIBLE_DEVICES" in error
    return [Row(figure, error[error.find("CUDA_VISIBLE"):] if named else "measured" if h2d[0].get("ok") else error,
                "CUDA_VISIBLE_DEVICES=''", None, "a named failure", "ok" if named else f"FAILED ({error[:60] or 'no failure'})")]


# -- item 3: the error sources live
def _metric_lines(metrics: str, name: str, gpu: int) -> list[str]:
    return [line for line in metrics.splitlines() if line.startswith(name + "{") and f'gpu="{gpu}"' in line]


def signal_rows(nvml: dict, report: dict, metrics: str | None) -> list[Row]:
    raw = {g.get("index"): g for g in nvml.get("gpus") or [] if isinstance(g, dict)} if isinstance(nvml, dict) else {}
    gpus = [g for g in report.get("gpus") or [] if isinstance(g, dict)] if isinstance(report, dict) else []
    if not gpus:
        return [Row("error signals", "-", "NVML", None, "as NVML says", "n/a (no GPU in the Report)")]
    rows = []
    for gpu in gpus:
        index, signals, said = gpu.get("index"), gpu.get("signals") or {}, raw.get(gpu.get("index"), {})
        for name, series in (("pcie_replays", "nodecheck_gpu_pcie_replays"), ("clock_event_reasons", "nodecheck_gpu_clock_event_active")):
            rows.append(_agrees(f"gpu{index} {name}", said.get(name), signals.get(name), metrics, series, index))
        rows.append(_nvlink_row(index, said.get("nvlinks"), signals.get("nvlink_errors"), metrics))
        rows.append(_fabric_row(index, said.get("fabric"), gpu.get("fabric"), metrics))
    return rows


def _fabric_row(gpu: int, said, reported, metrics: str | None) -> Row:
    """NVML's raw fabric answer beside the Report's state and nodecheck_gpu_fabric_registered: a GPU without an
    NVSwitch (this one) must say not_supported with no series; a registered one completed with a series."""
    figure, exported = f"gpu{gpu} NVLink fabric", _metric_lines(metrics or "", "nodecheck_gpu_fabric_registered", gpu)
    state = (reported or {}).get("state") if isinstance(reported, dict) else None
    if isinstance(said, dict) and "error" in said:
        shown = f"NVML: {said['error']}"
    elif isinstance(said, dict):
        shown = f"state {said.get('state')}, status {said.get('status')} ({said.get('status_text')})"
    else:
        return Row(figure, "-", "NVML", None, "as NVML says", "n/a (not in NVML's answers)")
    expected = FABRIC_STATES[said["state"]] if isinstance(said.get("state"), int) and said["state"] < len(FABRIC_STATES) \
        else "not_supported" if "Not Supported" in str(said.get("error")) else None
    ok = state == expected and bool(exported) == (expected not in ("not_supported", None))
    return Row(figure, shown, f"Report {state}", None, "as NVML says",
               "ok" if ok else f"FAILED (Report {state!r}, {len(exported)} series)")


def _agrees(figure: str, nvml_value, reported, metrics: str | None, series: str, gpu: int) -> Row:
    """What NVML said beside what the Report holds and /metrics exports: a number is carried through; an NVML error
    is said, with no series (never a 0)."""
    exported = _metric_lines(metrics or "", series, gpu)
    if isinstance(nvml_value, dict):
        return _unsupported_row(figure, nvml_value.get("error"), reported, exported)
    if not isinstance(nvml_value, int):
        return Row(figure, "-", "NVML", None, "as NVML says", "n/a (not in NVML's answers)")
    shown = f"0x{nvml_value:x}" if "clock" in figure else str(nvml_value)
    ok = reported == nvml_value and (metrics is None or exported)
    return Row(figure, shown, f"Report {reported}", None, "as NVML says", "ok" if ok else f"FAILED (Report {reported!r})")


def _unsupported_row(figure: str, error, reported, exported: list[str]) -> Row:
    """NVML gave no figure (its error is shown): ok only when the Report holds none and /metrics has no series."""
    ok = reported is None and not exported
    return Row(figure, f"NVML: {error}", "no figure, no series", None, "said, never 0",
               "ok" if ok else f"FAILED (reported {reported!r}, {len(exported)} series)")


def _nvlink_row(gpu: int, links, reported: dict | None, metrics: str | None) -> Row:
    figure = f"gpu{gpu} NVLink error counters"
    exported = _metric_lines(metrics or "", "nodecheck_gpu_nvlink_errors", gpu)
    states = [entry.get("state") for entry in links or [] if isinstance(entry, dict)]
    if states and all(isinstance(s, dict) for s in states):
        return _unsupported_row(figure, states[0].get("error"), reported, exported)
    if not states:
        return Row(figure, "-", "NVML", None, "as NVML says", "n/a (not in NVML's answers)")
    return Row(figure, json.dumps(reported, sort_keys=True) if reported else "-", f"{len(states)} link(s)", None,
               "as NVML says", "ok" if reported is not None and exported else "FAILED (counters not carried through)")


def aer_rows(report: dict, files: dict) -> list[Row]:
    paths = report.get("pcie_paths") if isinstance(report, dict) else None
    gpus = {str(g.get("pci_bus_id", "")).lower()[-12:] for g in report.get("gpus") or [] if isinstance(g, dict)}
    rows = []
    for device, hops in sorted((paths or {}).items()):
        if device.lower()[-12:] not in gpus:
            continue
        have = {hop.get("bdf"): hop.get("aer") is not None for hop in hops if isinstance(hop, dict)}
        listed = {bdf: bool(names) for bdf, names in (files.get(device) or {}).items()}
        agree = have == listed
        rows.append(Row(f"AER files, GPU {device} and its bridges"[:48], f"{sum(have.values())} of {len(have)} read",
                        f"{sum(listed.values())} of {len(listed)} in sysfs", None, "as sysfs has",
                        "ok" if agree and listed else "n/a (not listed)" if not listed else "FAILED (the Report differs from sysfs)"))
    return rows or [Row("AER files of the GPUs' paths", "-", "sysfs", None, "as sysfs has", "n/a (no GPU path in the Report)")]


def kernel_log_rows(root: dict, unit: dict, unit_step: dict | None) -> list[Row]:
    rows = []
    for label, report in (("as root", root), ("under the unit's privileges", unit)):
        log = report.get("kernel_log") if isinstance(report, dict) else None
        if not isinstance(log, dict):
            why = f"exit {unit_step.get('rc')}: {unit_step.get('stderr', '')[-40:]}" if label != "as root" and unit_step else "not read"
            rows.append(Row(f"kernel log {label}", "-", "-", None, "read, or a named unknown", f"n/a ({why})"))
            continue
        value = f"{log.get('source')}, {len(log.get('events') or [])} event(s)" if log.get("known") else str(log.get("why"))
        ok = log.get("known") or bool(log.get("why"))
        rows.append(Row(f"kernel log {label}", value, "-", None, "read, or a named unknown",
                        "ok" if ok else "FAILED (unknown without a reason)"))
    return rows


# -- item 4: the cost of the data checks, and bench --quick cold and warm
def data_check_rows(result: dict) -> list[Row]:
    rows = []
    for r in result.get("rows") or [] if isinstance(result, dict) else []:
        figure = f"data check {r.get('check')}, {int(r.get('size_bytes', 0)) >> 20} MiB"
        if "why" in r:
            rows.append(Row(figure, "-", "-", None, "-", f"n/a ({r['why']})"))
            continue
        verdict = f"FAILED ({r['wrong_elements']} wrong elements)" if r.get("wrong_elements") else "measured"
        rows.append(Row(figure, f"{r['check_s'] * 1e3:.1f} ms", f"measurement {r['measurement_s'] * 1e3:.1f} ms", r.get("ratio"),
                        "-", verdict))
    return rows or [Row("data checks", "-", "-", None, "-", "n/a (not run)")]


def quick_rows(steps: dict) -> list[Row]:
    rows = []
    for name, step in sorted(steps.items()):
        match = re.fullmatch(r"quick-(cold|warm)-(\d)", name)
        if not match:
            continue
        figure = f"bench --quick wall, {match[1]} run {match[2]}"
        if match[1] == "cold" and not (steps.get(f"drop-{match[2]}") or {}).get("ok"):
            figure += " (cache kept)"
        rows.append(wall_time_row(figure, step, QUICK_GOAL_S))
    return rows or [Row("bench --quick wall time", "-", "-", None, f"<= {QUICK_GOAL_S:g} s", "n/a (not run)")]


def compare(folder: Path) -> list[Row]:
    steps = read_json(folder / "steps.json")
    report = read_json(folder / "inspect.json")
    return (copy_twice_rows(read_json(folder / "copy-twice.json"), read_json(folder / "cpusets.json"))
            + fewer_rows(read_json(folder / "fewer.json"), steps.get("fewer"))
            + signal_rows(read_json(folder / "nvml.json"), report, read_text(folder / "nodecheck.prom"))
            + aer_rows(report, read_json(folder / "aer-files.json"))
            + kernel_log_rows(report, read_json(folder / "inspect-unit.json"), steps.get("unit"))
            + data_check_rows(read_json(folder / "data-check.json"))
            + quick_rows(steps))


# -- a run
def list_aer_files(report: dict, sysfs: Path = Path("/sys/bus/pci/devices")) -> dict:
    """{GPU address: {device on its path: [its aer_dev_* files]}}: what sysfs has, read here without nodecheck."""
    out = {}
    for device, hops in (report.get("pcie_paths") or {}).items():
        out[device] = {hop["bdf"]: sorted(p.name for p in (sysfs / hop["bdf"]).glob("aer_dev_*"))
                       for hop in hops if isinstance(hop, dict) and re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", hop.get("bdf", ""))}
    return out


def numa_cpus(root: Path = Path("/sys/devices/system/node")) -> dict[str, list[int]]:
    nodes = {}
    for node in sorted(root.glob("node[0-9]*")):
        try:
            nodes[node.name[4:]] = parse_cpulist(read_text(node / "cpulist") or "")
        except ValueError:
            continue
    return nodes


def drop_page_cache() -> dict:
    """Empty the page cache, as after a reboot, so that the next run reads torch and CUDA's libraries from disk."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as file:
            file.write("3\n")
    except OSError as error:
        return {"ok": False, "why": str(error)}
    return {"ok": True, "why": None}


def journal_group() -> str:
    try:
        return str(grp.getgrnam("systemd-journal").gr_gid)
    except KeyError:
        return ""


def run_all(folder: Path, data_check_sizes: str = DATA_CHECK_SIZES, drop_cache: bool = True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    steps: dict = {}
    nodecheck = [sys.executable, "-m", "nodecheck"]
    state = folder / "state"
    state.mkdir(exist_ok=True)
    run_step(folder, steps, "nvml", [sys.executable, "-c", "import json; from nodecheck.probes.nvml import dump_nvml; "
                                     "print(json.dumps(dump_nvml()))"], 60, "nvml.json")
    run_step(folder, steps, "inspect", [*nodecheck, "inspect", "--json"], 120, "inspect.json")
    report = read_json(folder / "inspect.json")
    (folder / "aer-files.json").write_text(json.dumps(list_aer_files(report), indent=1))
    run_step(folder, steps, "metrics", [*nodecheck, "check", "--textfile-dir", str(folder)], 120, env={"STATE_DIRECTORY": str(state)})
    run_step(folder, steps, "unit", ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", UNIT_SHELL, "sh",
                                     journal_group(), *nodecheck, "inspect", "--json"], 120, "inspect-unit.json")
    first, second = halves(sorted(os.sched_getaffinity(0)))
    (folder / "cpusets.json").write_text(json.dumps({"passes": [first, second], "nodes": numa_cpus()}, indent=1))
    gpu = next(iter(report.get("gpus") or []), {})
    listed = [{"index": 0, "uuid": gpu.get("uuid"), "pci": gpu.get("pci_bus_id"), "cpus": cpus} for cpus in (first, second)]
    run_step(folder, steps, "copy-twice", [sys.executable, "-m", "nodecheck.bench.gpu_worker", "copy", "--gpus", json.dumps(listed),
                                           "--sizes", str(256 << 20), "--out", str(folder / "copy-twice.json")], 300)
    run_step(folder, steps, "fewer", [*nodecheck, "bench", "--tests", "h2d", "--json"], 300, "fewer.json", env={"CUDA_VISIBLE_DEVICES": ""})
    run_step(folder, steps, "data-check", [sys.executable, str(REPO / "benchmarks/bench_data_check.py"), "--sizes", data_check_sizes,
                                           "--json", str(folder / "data-check.json")], 600, "data-check.txt")
    for number in (1, 2, 3):
        steps[f"drop-{number}"] = drop_page_cache() if drop_cache else {"ok": False, "why": "--keep-page-cache"}
        for kind in ("cold", "warm"):
            run_step(folder, steps, f"quick-{kind}-{number}", [*nodecheck, "bench", "--quick", "--json"], 300, f"quick-{kind}-{number}.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("one-gpu-run"), help="where each command's output is kept")
    parser.add_argument("--replay", type=Path, default=None, help="judge again, from a folder a run wrote")
    parser.add_argument("--data-check-sizes", default=DATA_CHECK_SIZES, help="payloads of the data-check step")
    parser.add_argument("--keep-page-cache", action="store_true", help="cold runs without dropping the page cache (a shared machine)")
    args = parser.parse_args(argv)
    folder = args.replay or args.out
    if args.replay is None:
        run_all(folder, args.data_check_sizes, not args.keep_page_cache)
    rows = judge_folder(compare, folder)
    if rows is None:
        return 2
    print(render(rows, value_width=30))
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
