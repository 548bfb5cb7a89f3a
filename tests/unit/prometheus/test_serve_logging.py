"""What `nodecheck serve` says while it runs: a probe failure once when it starts (again only every
`repeat` seconds while it lasts), its recovery, a line per round at debug level, and bench runs."""

import logging
import subprocess
import sys

from helpers import free_port, h100_node_snapshot, start_serve, stop, wait_metrics, wait_until

from nodecheck.prometheus.serve import RoundLog
from nodecheck.report.model import Report


def report(topo_ok: bool) -> Report:
    return Report.from_dict({"probes": [
        {"name": "nvidia_smi_topo", "ok": topo_ok, "no_data": False, "duration_seconds": 0.1,
         "error": None if topo_ok else "nvidia-smi did not finish within 10 s and was killed"},
        {"name": "nvml", "ok": False, "no_data": True, "duration_seconds": 0.0, "error": "no NVIDIA driver"}],
        "findings": [{"kind": "probe_failed", "severity": "error", "subject": "probe:nvidia_smi_topo", "measured": "timed out",
                      "expected": "ok", "message": "..."}] if not topo_ok else []})


def test_failures_are_said_once_then_rate_limited_and_recoveries_said(caplog):
    now = [0.0]
    rounds = RoundLog(repeat=600, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="nodecheck.serve")
    for second in (0, 60, 120, 660):
        now[0] = second
        rounds.round(report(topo_ok=False), 0.5)
    now[0] = 720
    rounds.round(report(topo_ok=True), 0.2)
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert said == [
        ("WARNING", "probe nvidia_smi_topo failed: nvidia-smi did not finish within 10 s and was killed"),
        ("WARNING", "probe nvidia_smi_topo still failing (4 rounds in a row): nvidia-smi did not finish within 10 s and was killed"),
        ("INFO", "probe nvidia_smi_topo recovered after 4 failed round(s)")]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug[0] == "round 1 in 0.50 s: probes 0 ok, 1 no data, 1 failed; findings 1 error"
    assert debug[-1] == "round 5 in 0.20 s: probes 1 ok, 1 no data, 0 failed; findings none"  # nvml without a driver is no failure


def test_the_daemon_logs_a_failing_probe_and_its_rounds(tmp_path):
    snap = h100_node_snapshot(tmp_path / "h100")
    (snap / "nvidia-smi-topo-m.txt").write_text("garbled beyond recognition\n")
    port = free_port()
    proc = start_serve("--from", str(snap), "--listen", f"127.0.0.1:{port}", "--interval", "1", "--log-level", "debug")
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        first = report_time(wait_metrics(url))
        wait_until(lambda: report_time(wait_metrics(url)) != first, 60, "a second probe round")
    finally:
        out = stop(proc)
    assert out.count("WARNING probe nvidia_smi_topo failed:") == 1, out
    assert "DEBUG round 1 in " in out and "DEBUG round 2 in " in out, out


def report_time(metrics: str) -> str:
    return next(line for line in metrics.splitlines() if line.startswith("nodecheck_report_timestamp_seconds"))


def test_a_wrong_log_level_is_refused():
    result = subprocess.run([sys.executable, "-m", "nodecheck", "serve", "--log-level", "loud"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "'loud': one of debug, info, warning, error" in result.stderr
