"""The Prometheus face: metrics from real Reports, checked by the real promtool, and the textfile form."""


import pytest
from helpers import (
    h100_node_snapshot,
    h100_nvml_records,
    hgx_nvml,
    live_gpu_count,
    make_measurement,
    make_nic,
    make_report,
    make_snapshot,
    metrics_of,
    nodecheck,
    promtool_check,
    samples,
)

from nodecheck.checks import FINDING_KINDS
from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.prometheus.exposition import write_textfile


def test_hgx_report_metrics_are_lint_clean_and_joinable(tmp_path):
    snap = make_snapshot(tmp_path / "s", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml(inactive={3: [7]}))
    report = build_report(SnapshotHost(snap), Config(nvlinks_per_gpu=18))
    report.measurements.append(make_measurement())
    text = metrics_of(report, tmp_path)
    checked = promtool_check(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    got = samples(text)
    info = [k for k in got if k[0] == "nodecheck_gpu_info" and ("gpu", "3") in k[1]]
    assert len(info) == 1 and dict(info[0][1])["UUID"] == "GPU-hgx-3" and dict(info[0][1])["model_name"] == "NVIDIA H100 80GB HBM3"
    assert got[("nodecheck_gpu_nvlink_active_links", (("gpu", "3"),))] == 17
    assert got[("nodecheck_gpu_pcie_link_width", (("gpu", "0"),))] == 16
    assert got[("nodecheck_check_healthy", (("check", "nvlink_inactive"),))] == 0
    assert got[("nodecheck_check_healthy", (("check", "pcie_downtrained"),))] == 1
    assert got[("nodecheck_finding", (("kind", "nvlink_inactive"), ("severity", "error"), ("subject", "gpu3")))] == 1
    assert got[("nodecheck_bandwidth_ratio", (("direction", "busbw"), ("path", "allreduce:2-ranks"), ("test", "allreduce")))] == 0.8
    assert got[("nodecheck_path_spec_bytes_per_second", (("kind", "nvlink"), ("path", "gpu0:gpu1")))] == 450e9
    healthy = {k[1][0][1] for k in got if k[0] == "nodecheck_check_healthy"}
    unknown = {k[1][0][1] for k in got if k[0] == "nodecheck_check_unknown"}
    assert healthy | unknown == set(FINDING_KINDS) and not healthy & unknown  # each check once: known or unknown
    assert "bandwidth_below_spec" in healthy and "pcie_acs_redirect" in unknown  # measured; ACS never read here
    assert not any(name in ("hostname", "host", "node") for _, labels in got for name, _ in labels)


def test_degraded_and_failed_probe(tmp_path):
    snap = h100_node_snapshot(tmp_path / "h100")
    (snap / "lstopo.xml").write_text("<html>502 Bad Gateway</html>")
    (snap / "nvml.json").unlink()
    make_snapshot(tmp_path / "tmp-nvml", nvml_gpus=[dict(h100_nvml_records()[0], width=8)])
    (snap / "nvml.json").write_text((tmp_path / "tmp-nvml" / "nvml.json").read_text())
    got = samples(metrics_of(build_report(SnapshotHost(snap)), tmp_path))
    assert got[("nodecheck_probe_success", (("probe", "lstopo"),))] == 0
    assert got[("nodecheck_probe_success", (("probe", "nvml"),))] == 1
    assert got[("nodecheck_gpu_pcie_link_width", (("gpu", "0"),))] == 8
    assert got[("nodecheck_check_healthy", (("check", "pcie_downtrained"),))] == 0
    assert got[("nodecheck_findings", (("severity", "error"),))] == 1


def test_node_without_gpu_and_unknown_speed_publishes_no_placeholder(tmp_path):
    text = metrics_of(build_report(SnapshotHost(h100_node_snapshot(tmp_path / "h"))), tmp_path)
    got = samples(text)
    assert ("nodecheck_nic_speed_bytes_per_second", (("nic", "eth0"),)) not in got  # sysfs said -1: absent, not -1
    assert got[("nodecheck_nic_up", (("nic", "eth0"),))] == 1
    assert promtool_check(text).returncode == 0


def test_check_writes_the_textfile_atomically(tmp_path):
    result = nodecheck("check", "--textfile-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["nodecheck.prom"]  # no temporary file left behind
    got = samples((tmp_path / "nodecheck.prom").read_text())
    assert got[("nodecheck_probe_success", (("probe", "nics"),))] == 1 and got[("nodecheck_gpus", ())] == live_gpu_count()
    missing = nodecheck("check", "--textfile-dir", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "is not a directory" in missing.stderr


def test_check_exits_0_with_findings_once_the_metrics_are_written(tmp_path):
    """`check` runs from a timer for node_exporter: its job is the file. Findings travel as metrics (and
    alerts); exit 0, or the textfile service would be a failed unit on every degraded node."""
    snap = make_snapshot(tmp_path / "s", nvml_gpus=hgx_nvml(inactive={0: [3]}))
    out_dir = tmp_path / "textfile"
    out_dir.mkdir()
    result = nodecheck("check", "--textfile-dir", str(out_dir), "--from", str(snap))
    assert result.returncode == 0, result.stderr
    text = (out_dir / "nodecheck.prom").read_text()
    assert 'nodecheck_finding{kind="nvlink_inactive"' in text and "findings)" in result.stdout
    assert [p.name for p in out_dir.iterdir()] == ["nodecheck.prom"]


def test_textfile_write_leaves_nothing_when_interrupted(tmp_path, monkeypatch):
    import os
    import time

    from nodecheck.prometheus import exposition as prometheus

    report = build_report(SnapshotHost(make_snapshot(tmp_path / "s", nvml_gpus=hgx_nvml())))
    stale = tmp_path / ".nodecheck.prom.killed.tmp"  # what a SIGKILLed run leaves
    stale.write_text("half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    monkeypatch.setattr(prometheus, "generate_latest", lambda registry: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        write_textfile(report, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # neither the interrupted nor the stale temporary
    monkeypatch.undo()
    write_textfile(report, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nodecheck.prom", "s"]


def test_ecc_and_row_remapping_are_published(tmp_path):
    records = [dict(r, ecc_mode=[0, 0], retired=[0, 1, 1, 0]) for r in h100_nvml_records()]
    report = build_report(SnapshotHost(make_snapshot(tmp_path / "s", nvml_gpus=records)))
    got = samples(metrics_of(report, tmp_path))
    assert got[("nodecheck_gpu_ecc_enabled", (("gpu", "0"),))] == 0
    assert got[("nodecheck_gpu_row_remap_pending", (("gpu", "0"),))] == 1
    assert got[("nodecheck_gpu_row_remap_failed", (("gpu", "0"),))] == 0
    assert got[("nodecheck_check_healthy", (("check", "row_remap_pending"),))] == 0


def test_a_check_never_made_is_unknown_never_healthy(tmp_path):
    """Issue 20 (13): ACS unread (not root: the shipped unit and DaemonSet), no bandwidth test, no NCCL run, a
    failed NVML probe: each such check is absent from nodecheck_check_healthy and 1 in nodecheck_check_unknown,
    in the exporter and in `check --textfile-dir` alike."""
    snap = make_snapshot(tmp_path / "s", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    (snap / "lspci-vvv.txt").write_text("00:01.0 PCI bridge: Intel\n\tCapabilities: <access denied>\n")
    report = build_report(SnapshotHost(snap))
    assert report.acs_redirects() is None
    got = samples(metrics_of(report, tmp_path))
    for check in ("pcie_acs_redirect", "bandwidth_below_spec", "bench_failed", "nccl_no_gdr", "peer_unreachable"):
        assert ("nodecheck_check_healthy", (("check", check),)) not in got, check
        assert got[("nodecheck_check_unknown", (("check", check),))] == 1, check
    assert got[("nodecheck_check_healthy", (("check", "nvlink_inactive"),))] == 1  # read, and healthy

    (snap / "nvml.json").write_text('{"gpus": "garbled"}')
    (tmp_path / "tf").mkdir()
    run = nodecheck("check", "--from", str(snap), "--textfile-dir", str(tmp_path / "tf"))
    assert run.returncode == 0, run.stderr
    textfile = samples((tmp_path / "tf" / "nodecheck.prom").read_text())
    assert textfile[("nodecheck_check_unknown", (("check", "pcie_downtrained"),))] == 1  # NVML failed: not known
    assert ("nodecheck_check_healthy", (("check", "pcie_downtrained"),)) not in textfile
    assert textfile[("nodecheck_check_healthy", (("check", "probe_failed"),))] == 0


def test_two_findings_of_one_kind_on_one_subject_are_one_series(tmp_path):
    """Two rates of one InfiniBand port above their limits (symbol errors and receive errors on mlx5_0/1) are two
    findings of one kind, severity and subject: one series, as Prometheus and node_exporter's textfile collector
    require (a second with the same labels is dropped, or the whole file refused)."""
    from nodecheck.checks import evaluate
    from nodecheck.report.events import CounterSample, History
    from nodecheck.report.model import IbPort

    port = IbPort("mlx5_0", 1, "ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand",
                  {"symbol_error": 1200, "port_rcv_errors": 1200})
    before = CounterSample(940.0, {"ib/mlx5_0/1/symbol_error": 0, "ib/mlx5_0/1/port_rcv_errors": 0})
    report = make_report(nics=[make_nic("ibp12s0", kind="infiniband", rdma_device="mlx5_0", ib_ports=[port])],
                         history=History("boot", [], [before], 1000.0))
    report.findings = evaluate(report, Config())
    assert [f.measured for f in report.findings if f.kind == "ib_port_errors"] == ["port_rcv_errors 20.0/s",
                                                                                   "symbol_error 20.0/s"]
    text = metrics_of(report, tmp_path)
    series = [line.split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) == len(set(series)), [s for s in series if series.count(s) > 1]
    assert series.count('nodecheck_finding{kind="ib_port_errors",severity="error",subject="mlx5_0/1"}') == 1
    assert promtool_check(text).returncode == 0
