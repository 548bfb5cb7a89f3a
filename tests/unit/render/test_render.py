"""The human output never takes text from a source as markup or terminal control: a host name, a CPU
model, nvidia-smi's first line or an nccl-tests log holding `[/]`, `[bold]` or escape sequences prints
as written (or with '?' for control characters), and nodecheck's own bracketed text survives too."""

import json
import re

from helpers import PUBLIC, REPO, h100_node_snapshot, need, nodecheck
from rich.console import Console

from nodecheck.core.errors import install_extra
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.render.bench import render_measurements
from nodecheck.render.report import render
from nodecheck.report.model import Measurement

HOSTILE = "evil[/]node[bold red]X\x1b[2J\x1b]0;owned\x07"


def printed(fn, *args) -> str:
    console = Console(record=True, width=200, force_terminal=True)
    fn(*args, console=console)
    return console.export_text(styles=False)


def test_untrusted_text_prints_as_written_and_never_controls_the_terminal(tmp_path):
    snap = h100_node_snapshot(tmp_path / "h")
    (snap / "identity.json").write_text(json.dumps({"hostname": HOSTILE, "kernel": "6.1[/]"}))
    xml = (snap / "lstopo.xml").read_text()
    (snap / "lstopo.xml").write_text(xml.replace('name="CPUModel" value="', 'name="CPUModel" value="[/][red]', 1))
    (snap / "nvidia-smi-topo-m.txt").write_text("[/]nvidia-smi [bold]broke\x1b[31m\n")
    text = printed(render, build_report(SnapshotHost(snap)))
    assert "evil[/]node[bold red]X?[2J?]0;owned?" in text  # control characters shown as '?', brackets as written
    assert "\x1b" not in text and "\x07" not in text
    assert "6.1[/]" in text and "[/][red]" in text
    assert "(first line: '[/]nvidia-smi [bold]broke')" in text  # the topo probe's error quotes the first line


def test_measurement_errors_keep_their_brackets(tmp_path):
    report = build_report(SnapshotHost(tmp_path))
    report.measurements = [Measurement.failed("gpu0:host", "h2d", "torch", "h2d",
                                              f"torch is not installed: {install_extra('bench')}")]
    assert "sh deploy/install.sh bench" in printed(render_measurements, report)
    assert "-m pip install '.[bench]' (this Python)" in printed(render_measurements, report)


def test_help_keeps_bracketed_names():
    help_text = nodecheck("serve", "--help", env={"COLUMNS": "200"}).stdout
    assert "sh deploy/install.sh web" in help_text and "[serve] listen" in help_text


def test_no_hint_names_the_unpublished_package():
    """nodecheck is not on PyPI: `pip install 'nodecheck[bench]'` fails with "No matching distribution"."""
    shipped = [p for d in ("src", "deploy", "systemd", "docs") for p in (REPO / d).rglob("*")
               if p.is_file() and p.suffix in (".py", ".md", ".sh", ".yaml", ".toml", "")] + [REPO / "README.md"]
    said = [str(p.relative_to(REPO)) for p in shipped if re.search(r"pip install \S*nodecheck\[", p.read_text(errors="replace"))]
    assert not said


def test_nccl_log_with_markup_prints_it(tmp_path):
    text = need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-all_reduce_perf.txt").read_text()
    log = tmp_path / "log[bold].txt"
    log.write_text("# Collective test starting: [/][b]\x1b[2Jall_reduce_perf\n" + text)
    result = nodecheck("bench", "--nccl-log", str(log), env={"COLUMNS": "250"})
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr[-1500:]
    assert "log[bold].txt" in result.stdout and "[/][b]?[2Jall_reduce_perf" in result.stdout and "\x1b[2J" not in result.stdout


def test_config_check_folds_rows_that_expect_and_find_the_same():
    """28 `links."gpuA-gpuB" expects NV18 has no such pair` lines, one per pair, read as one line."""
    from nodecheck.render.slurm import folded

    rows = [(f'links."gpu{a}-gpu{b}"', "NV18", "has no such pair") for a in range(8) for b in range(a + 1, 8)]
    rows += [('links."gpu0-gpu9"', "NV18", "PIX"), ("thresholds.bandwidth_ratio", "0.8", "(bandwidth tests)")]
    assert folded(rows) == [('links."gpu0-gpu1" ... "gpu6-gpu7" (28 keys)', "NV18", "has no such pair"),
                            ('links."gpu0-gpu9"', "NV18", "PIX"), ("thresholds.bandwidth_ratio", "0.8", "(bandwidth tests)")]


def test_inspect_says_what_each_gpu_model_is_rated_at_and_which_has_no_spec(tmp_path):
    """The GPU table is followed by each model's spec, its GPUs together; a GPU whose model specs.toml does not know is
    said to have none (its own tests are judged against its siblings only), with its name made plain."""
    import dataclasses

    from nodecheck.assemble.gpu_specs import gpu_spec
    from nodecheck.render.report import gpu_ranges, spec_lines

    report = build_report(SnapshotHost(h100_node_snapshot(tmp_path / "h")))
    (gpu,) = report.gpus
    assert gpu.spec == gpu_spec("NVIDIA H100 80GB HBM3", None) and gpu.spec.model == "H100 SXM"
    assert "GPU spec: gpu0 H100 SXM: memory 3.35 TB/s, dense BF16 989 / FP16 989 / TF32 495 / FP8 1979 TFLOPS" in printed(render, report)
    unknown = dataclasses.replace(gpu, index=5, name=HOSTILE, spec=None)
    a100 = dataclasses.replace(gpu, index=1, name="NVIDIA A100-SXM4-40GB", spec=gpu_spec("NVIDIA A100-SXM4-40GB", 40 << 30))
    report.gpus = [gpu, a100, dataclasses.replace(a100, index=2), unknown, dataclasses.replace(gpu, index=4)]
    assert spec_lines(report) == [
        "GPU spec: gpu0, gpu4 H100 SXM: memory 3.35 TB/s, dense BF16 989 / FP16 989 / TF32 495 / FP8 1979 TFLOPS",
        "GPU spec: gpu1-2 A100 40GB: memory 1.555 TB/s, dense BF16 312 / FP16 312 / TF32 156 TFLOPS",
        f"GPU spec: gpu5 {HOSTILE}: a model with no spec in specs.toml"]
    assert "\x1b" not in printed(render, report)
    assert gpu_ranges([3, 0, 1, 2, 7, 5, 6]) == "gpu0-3, gpu5-7"
