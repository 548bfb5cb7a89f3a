"""`nodecheck inspect` read at 80, 120 and 200 columns: real captures (an OCI node with 18 NICs, the HGX
H100 board with NVML, the H100 VM), every line within the width, every NIC name and CPU list whole, names
in natural order; piped output without a terminal is plain."""

import io
import os
import re
import subprocess
import sys

import pytest
from helpers import PUBLIC, hgx_nvml, make_snapshot, need
from rich.console import Console

from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.render.report import render
from nodecheck.render.table import PLAIN_WIDTH

WIDTHS = (80, 120, 200)


def oci(tmp_path):
    """OCI BM.GPU.A100-v2.8: 8 GPUs, 18 NICs (mlx5_0..mlx5_17), 8 NUMA nodes; topology only."""
    return build_report(SnapshotHost(make_snapshot(tmp_path / "oci", topo="oci-bm-gpu-a100-8gpu-18nic-numa-nps4.txt")))


def hgx(tmp_path):
    return build_report(SnapshotHost(make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                                                   nvml_gpus=hgx_nvml())))


def shown(report, width: int) -> str:
    out = io.StringIO()
    render(report, Console(width=width, file=out, force_terminal=False, color_system=None))
    return out.getvalue()


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("node", [oci, hgx])
def test_every_line_fits_and_every_name_is_whole(tmp_path, node, width):
    report = node(tmp_path)
    text = shown(report, width)
    too_long = [line for line in text.splitlines() if len(line) > width]
    assert not too_long, too_long[:3]
    words = set(re.findall(r"[\w.,-]+", text))
    for nic in report.nics:
        assert re.search(rf"(?<![\w]){re.escape(nic.name)}(?![\w])", text), f"{nic.name} is cut at {width} columns"
    for gpu in report.gpus:
        assert gpu.cpu_affinity in words or gpu.cpu_affinity in text, f"gpu{gpu.index}'s CPUs {gpu.cpu_affinity} cut"
    assert "…" not in text  # nothing cut with an ellipsis


def test_names_in_natural_order_and_the_topologys_nvlinks(tmp_path):
    text = shown(oci(tmp_path), 200)
    table = text[text.index("\nNICs"):]
    assert table.index("mlx5_9 ") < table.index("mlx5_10 ") < table.index("mlx5_17 ")
    assert "NCCL_IB_HCA=mlx5_9,mlx5_10,mlx5_11,mlx5_12" in text
    assert "NV12 (topo)" in text  # no NVML on that snapshot: what nvidia-smi topo -m says, not "-"


def test_a_narrow_terminal_says_what_it_left_out(tmp_path):
    text = shown(oci(tmp_path), 80)
    assert "not shown at 80 columns:" in text
    assert "GPU0 to NICs: PXB: mlx5_5, mlx5_6, mlx5_7, mlx5_8; SYS: mlx5_0," in text.replace("\n", " ")
    assert "NCCL_IB_HCA=mlx5_14,mlx5_15,mlx5_16,mlx5_17 \\" in text  # the advice, one command over several lines


def test_plain_output_has_no_boxes(tmp_path):
    text = shown(hgx(tmp_path), PLAIN_WIDTH)
    assert "┃" not in text and "━" not in text and "mlx5_7" in text


def run_piped(args, env):
    return subprocess.run([sys.executable, "-m", "nodecheck", *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60, env=env)


def test_piped_without_a_terminal_is_plain_and_columns_is_honoured(tmp_path):
    snap = make_snapshot(tmp_path / "oci", topo="oci-bm-gpu-a100-8gpu-18nic-numa-nps4.txt")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    plain = run_piped(["inspect", "--from", str(snap)], env)
    assert plain.returncode == 0 and "┃" not in plain.stdout
    # the whole matrix, every NIC column on the GPU's own line: nothing squeezed into a width nobody asked for
    assert [line for line in plain.stdout.splitlines() if line.startswith("GPU0 ") and line.count("NV12") == 7 and "PXB" in line]
    narrow = run_piped(["inspect", "--from", str(snap)], dict(env, COLUMNS="100"))
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 100


def test_the_header_of_a_snapshot_without_identity(tmp_path):
    need(PUBLIC)
    assert "nodecheck (host name not recorded)" in shown(oci(tmp_path), 120)


@pytest.mark.parametrize("width", WIDTHS)
def test_findings_keep_their_subject_and_advice_whole(tmp_path, width):
    """An HGX board with one NVLink down on gpu3 and a PCIe switch port redirecting peer traffic (ACS): the
    subjects and the advice are never cut, at any width."""
    from helpers import acs_findings, lspci_for_switch

    report, _ = acs_findings(tmp_path, lspci_for_switch(redirect=True))
    text = shown(report, width)
    assert not [line for line in text.splitlines() if len(line) > width]
    assert "pci:0000:17:00.0" in text and "pci:0000:17:01.0" in text and "…" not in text
    assert "ECAP_ACS+6.w=0000" in text and "pci=disable_acs_redir=0000:17:00.0" in text  # long words whole too


@pytest.mark.parametrize("width", (60, 80, 100, 120, 200))
def test_nccl_log_rows_drop_whole_columns_and_say_so(width):
    """`bench --nccl-log` follows inspect's rule: no number is cut ('2097…', '129.…'); whole columns go,
    named under the table; the size and the out-of-place busbw, which the verdict reads, always stay."""
    from nodecheck.bench.nccl_tests import parse_nccl_log
    from nodecheck.render.bench import render_nccl_log

    log = parse_nccl_log(need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-all_reduce_perf.txt").read_text())
    out = io.StringIO()
    render_nccl_log(log, "log.txt", Console(width=width, file=out, force_terminal=False, color_system=None))
    text = out.getvalue()
    assert "…" not in text and not [line for line in text.splitlines() if len(line) > width]
    lines = [re.sub("[│┃]", " ", line) for line in text.splitlines()]
    header = next(line for line in lines if "size (B)" in line)
    rows = [line.split() for line in lines if re.match(r"\s*\d+\s", line)]
    assert [int(r[0]) for r in rows] == [r.size_bytes for r in log.rows]
    busbw_at = [h.strip() for h in re.split(r"\s{2,}", header.strip())].index("oop busbw (GB/s)")
    assert [float(r[busbw_at]) for r in rows] == [round(r.out_of_place.busbw_gbytes, 2) for r in log.rows]
    columns = ("count", "type", "redop", "oop time (us)", "oop algbw (GB/s)", "ip time (us)", "ip algbw (GB/s)", "ip busbw (GB/s)")
    missing = [c for c in columns if c not in header]
    said = re.search(r"not shown at \d+ columns: (.+?) \(widen", " ".join(text.split()))
    assert set(said[1].split(", ") if said else []) == set(missing)
    assert (width == 200) == (not missing)


@pytest.mark.parametrize("width", (80, 100, 120))
def test_the_bandwidth_table_drops_columns_not_words(tmp_path, width):
    """`bench` at 80 and 100 columns cut 'allreduc…', 'allreduce:64-ra…' and a command to paste
    ('/opt/nodecheck/bin/py…'): every path, test and word of an error stays whole; columns go instead, named."""
    import dataclasses

    from helpers import make_measurement

    from nodecheck.bench.plan import _failed
    from nodecheck.core.errors import install_extra
    from nodecheck.render.bench import render_measurements

    failed = _failed("bench", "h2d", f"torch is not installed: {install_extra('bench')}")
    measured = [make_measurement("allreduce:64-ranks-8-nodes", "allreduce", rate=300e9, spec=400e9),
                make_measurement("gpu0:gpu1", "p2p_bidirectional", rate=700e9, spec=900e9), failed]
    report = dataclasses.replace(hgx(tmp_path), measurements=measured, findings=[])
    out = io.StringIO()
    render_measurements(report, Console(width=width, file=out, force_terminal=False, color_system=None))
    text = out.getvalue()
    assert "…" not in text and not [line for line in text.splitlines() if len(line) > width], text
    words = set(text.split())
    assert {"allreduce:64-ranks-8-nodes", "allreduce", "p2p_bidirectional", "gpu0:gpu1", "FAILED"} <= words
    assert set(failed.error.split()) <= words, text  # the command, word by word, whole
