"""benchmarks/multi_gpu_node.py (issue 26, item 5): the script for the first multi-GPU node, proved here on what
such a node's tools print. nvbandwidth's and nccl-tests' outputs are real published ones (../shared/captures/public,
with their answer keys); nodecheck's side is a bench Report built from nodecheck's own Measurement at figures
set against those, so that a pass, a low pair, an unmeasured pair and a failed tool each get their verdict."""

import dataclasses
import json
import sys

import pytest
from helpers import REPO, SHARED, answer_key

from nodecheck.report.model import Measurement

sys.path.insert(0, str(REPO / "benchmarks"))
import multi_gpu_node as script  # noqa: E402

NVB = SHARED / "captures/public/nvbandwidth"
NCCL = SHARED / "captures/public/nccl"


@pytest.fixture(autouse=True)
def captures():
    if not NVB.is_dir() or not NCCL.is_dir():
        pytest.skip("../shared/captures/public is absent")


def bench(*measured: Measurement) -> dict:
    return {"measurements": [dataclasses.asdict(m) for m in measured]}


def p2p(a: int, b: int, gbps: float) -> Measurement:
    return Measurement.measured(f"gpu{a}->gpu{b}", "p2p", gbps * 1e9, 450e9, 256 << 20, "torch copy_", "unidirectional")


def test_nvbandwidth_outputs_read_as_their_answer_key_says():
    key = answer_key("nvbandwidth")
    for name, expected in key.items():
        if name.startswith("_"):
            continue
        parsed = script.parse_nvbandwidth((NVB / name).read_text())
        case = parsed[expected["testcase"]]
        assert case["sum"] == expected["sum_GBps"], name
        assert bool(case["failed"]) == bool(expected.get("failed")), name
        if "cell_0_1_GBps" in expected:
            assert case["cells"][(0, 1)] == expected["cell_0_1_GBps"] and (0, 0) not in case["cells"]
            assert len(case["cells"]) == expected["gpus"] * (expected["gpus"] - 1)
        if "cell_0_0_GBps" in expected:
            assert case["cells"][(0, 0)] == expected["cell_0_0_GBps"]  # a CPU row: (0, 0) is host -> GPU 0
        for testcase, also in expected.get("also", {}).items():
            assert parsed[testcase]["sum"] == also["sum_GBps"] and parsed[testcase]["cells"][(0, 0)] == also["cell_0_0_GBps"]


def test_p2p_beside_nvbandwidth_pair_by_pair():
    matrix = script.parse_nvbandwidth((NVB / "nvbandwidth-readme-8gpu-d2d-write-ce-fragment.txt").read_text())
    cells = matrix["device_to_device_memcpy_write_ce"]["cells"]
    ours = [p2p(a, b, cells[(a, b)] * 1.004) for (a, b) in cells if (a, b) not in ((2, 5), (6, 0))]
    ours.append(p2p(2, 5, cells[(2, 5)] * 0.9))  # one slow pair; 6->0 not measured
    rows = {r.figure: r for r in script.p2p_rows(bench(*ours), matrix)}
    assert len(rows) == 56
    assert rows["p2p gpu2->gpu5"].verdict == "LOW" and rows["p2p gpu2->gpu5"].ratio == pytest.approx(0.9)
    assert rows["p2p gpu6->gpu0"].verdict.startswith("n/a (nodecheck measured no such pair")
    assert sum(r.verdict == "ok" for r in rows.values()) == 54
    failed = script.parse_nvbandwidth((NVB / "nvbandwidth-8x-a100-sxm4-80gb-d2d-read-ce-assert-failure.txt").read_text()
                                      .replace("device_to_device_memcpy_read_ce", "device_to_device_memcpy_write_ce"))
    (row,) = script.p2p_rows(bench(*ours), failed)
    assert row.verdict == "FAILED (nvbandwidth: Invalid value when checking the pattern at 0x70a640000000)"
    (row,) = script.p2p_rows(bench(*ours), {})
    assert row.verdict == "n/a (no nvbandwidth device_to_device_memcpy_write_ce)"


def test_the_in_node_all_reduce_beside_all_reduce_perf_s_1_gib_row():
    text = (NCCL / "aws-batch-p5-all_reduce_perf-mpirun-tagged.txt").read_text()
    assert script.nccl_row_busbw(text) == 441.81  # its 1 GiB row, out of place (the capture's line 31)
    mine = Measurement.measured("allreduce:node-8-gpus", "allreduce", 433.0e9, 450e9, 1 << 30, "torch.distributed nccl", "busbw")
    on, off = script.allreduce_rows({"on": (bench(mine), text), "off": (bench(mine), None)})
    assert (on.verdict, round(on.ratio, 3)) == ("ok", 0.98) and off.verdict.startswith("n/a")
    assert on.figure == "all-reduce 1 GiB, NVLS on: vs nccl-tests"
    low = Measurement.measured("allreduce:node-8-gpus", "allreduce", 400.0e9, 450e9, 1 << 30, "torch.distributed nccl", "busbw")
    assert script.allreduce_rows({"off": (bench(low), text)})[0].verdict == "LOW"
    # symmetric: nodecheck 3% above its reference passes, a figure far above says the two ran differently
    high = Measurement.measured("allreduce:node-8-gpus", "allreduce", 452.0e9, 450e9, 1 << 30, "torch.distributed nccl", "busbw")
    assert script.allreduce_rows({"on": (bench(high), text)})[0].verdict == "ok"
    nvls_beside_ring = Measurement.measured("allreduce:node-8-gpus", "allreduce", 480.0e9, 450e9, 1 << 30, "t", "busbw")
    assert script.allreduce_rows({"off": (bench(nvls_beside_ring), text)})[0].verdict == "HIGH"
    no_gib_row = (NCCL / "tinybox-6x-rtx4090-p2p-patched-all_reduce_perf-single-size.txt").read_text()
    assert script.nccl_row_busbw(no_gib_row) is None
    assert script.allreduce_rows({"on": (bench(mine), no_gib_row)})[0].verdict == "n/a (no 1 GiB row in all_reduce_perf's output)"
    failed = "gpu-node-7: Test NCCL failure common.cu:1279 'unhandled cuda error'\n"  # all_reduce_perf that failed at start
    assert script.nccl_row_busbw(failed) is None  # once a ParseError out of the script
    assert script.allreduce_rows({"on": (bench(mine), failed)})[0].verdict.startswith("n/a")


def test_h2d_one_worker_beside_a_process_per_gpu_and_the_wall_times():
    one = bench(*(Measurement.measured(f"gpu{i}:host", "h2d", 55.0e9, 63.0e9, 256 << 20, "torch copy_", "unidirectional")
                  for i in range(2)))
    own = {0: {"gpus": [{"index": 0, "rows": [{"memory": "pinned", "h2d": 55.1e9, "size_bytes": 256 << 20}]}]},
           1: {"gpus": [{"index": 1, "rows": [{"memory": "pinned", "h2d": 58.0e9, "size_bytes": 256 << 20}]}]},
           2: {"gpus": [{"index": 2, "error": {"type": "RuntimeError", "message": "CUDA error"}}]}}
    rows = script.h2d_rows(one, own)
    assert [r.verdict.split()[0] for r in rows] == ["ok", "LOW", "n/a"]
    steps = {"quick-1": {"rc": 0, "wall_s": 41.0}, "quick-2": {"rc": 0, "wall_s": 63.5}, "quick-3": {"rc": 1, "wall_s": 2.0}}
    assert [r.verdict.split()[0] for r in script.quick_rows(steps)] == ["ok", "HIGH", "FAILED"]


def test_replay_of_a_run_folder_prints_every_figure_and_exits_on_its_verdicts(tmp_path, capsys):
    matrix_text = (NVB / "nvbandwidth-readme-8gpu-d2d-write-ce-fragment.txt").read_text()
    cells = script.parse_nvbandwidth(matrix_text)["device_to_device_memcpy_write_ce"]["cells"]
    (tmp_path / "nvbandwidth.txt").write_text(matrix_text)
    (tmp_path / "p2p.json").write_text(json.dumps(bench(*(p2p(a, b, v) for (a, b), v in cells.items()))))
    nccl = (NCCL / "aws-batch-p5-all_reduce_perf-mpirun-tagged.txt").read_text()
    (tmp_path / "nccl-nvls-on.txt").write_text(nccl)
    (tmp_path / "nccl-nvls-off.txt").write_text(nccl)
    for label in ("on", "off"):
        (tmp_path / f"allreduce-nvls-{label}.json").write_text(json.dumps(bench(Measurement.measured(
            "allreduce:node-8-gpus", "allreduce", 437.0e9, 450e9, 1 << 30, "torch.distributed nccl", "busbw"))))
    (tmp_path / "nvml.txt").write_text("gpu  name ...\n  0  NVIDIA H100 80GB HBM3  Hopper  4  18/18  25.0  25.0  NVLink 4\n")
    (tmp_path / "steps.json").write_text(json.dumps({"nvml": {"rc": 0, "wall_s": 1.2}, "quick-1": {"rc": 0, "wall_s": 38.0}}))
    code = script.main(["--replay", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 2  # every made figure passed; h2d was not run here: said, and no pass
    assert "p2p ratios: min 1.000, median 1.000, max 1.000 over 56 pairs" in out
    assert "all-reduce 1 GiB, NVLS on: vs nccl-tests" in out and "0.989" in out
    (tmp_path / "nvml.txt").write_text("  3  NVIDIA H100 80GB HBM3  Hopper  4  18/18  25.0  50.0  NVLink 4  MISMATCH\n")
    (tmp_path / "steps.json").write_text(json.dumps({"nvml": {"rc": 1, "wall_s": 1.2}}))
    assert script.main(["--replay", str(tmp_path)]) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert script.main(["--replay", str(empty)]) == 2  # nothing there: every row says n/a, nothing crashes


def test_a_step_that_is_missing_or_hangs_is_recorded_not_raised(tmp_path):
    steps: dict = {}
    script.run_step(tmp_path, steps, "nvbandwidth", ["/nonexistent/nvbandwidth", "-t", "x"], 5, "nvbandwidth.txt")
    script.run_step(tmp_path, steps, "hung", ["sleep", "30"], 0.5, "hung.txt")
    assert (steps["nvbandwidth"]["rc"], steps["hung"]["rc"]) == (127, 124)
    assert json.loads((tmp_path / "steps.json").read_text())["hung"]["stderr"] == "timed out after 0.5 s"


def test_the_nvlink_remote_ends_are_counted_or_said_unread():
    """nvidia-smi's per-link remote device: links and distinct devices counted; a text of another form is said
    unread, never a guess. The line's shape here ("Link 3: Remote Device 00000000:07:00.0: Link 12") is assumed:
    `-R` is documented only as printing each link's remote PCI bus id and NVLink id, and no capture of it is in
    ../shared; the first HGX run's nvlink-remote.txt settles it."""
    text = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)\n" + "".join(
        f"\t Link {k}: Remote Device 00000000:{0x05 + k % 4:02X}:00.0: Link {30 + k}\n" for k in range(18))
    (row,) = script.remote_rows(text)
    assert (row.value, row.verdict) == ("18 links to 4 devices", "ok")
    assert script.remote_rows("NVLink is not supported\n")[0].verdict.startswith("n/a (format not read")
    assert script.remote_rows(None)[0].verdict == "n/a (not run)"


def test_an_nvbandwidth_matrix_pasted_without_its_running_line_is_read():
    """The README's write-CE matrix with its "Running ..." line cut off (as pastes lose it): its title names the
    testcase; a matrix without even the title is kept as "unnamed"."""
    text = (NVB / "nvbandwidth-readme-8gpu-d2d-write-ce-fragment.txt").read_text()
    whole = script.parse_nvbandwidth(text)["device_to_device_memcpy_write_ce"]["cells"]
    titled = text.split("\n", 1)[1]
    assert script.parse_nvbandwidth(titled)["device_to_device_memcpy_write_ce"]["cells"] == whole and len(whole) == 56
    bare = titled.split("\n", 1)[1]
    assert script.parse_nvbandwidth(bare)["unnamed"]["cells"] == whole
