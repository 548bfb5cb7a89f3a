"""IMEX on a node of a multi-node NVLink domain (GB200 NVL72): nvidia-imex-ctl's answers as DCGM reads them (its
tests' sample of `-N -j`, tests/fixtures/imex), judged so that the node at fault is the one drained."""


import pytest
from gpu_fabric_cases import published
from helpers import DEGRADED, NODE_3, tray

from nodecheck.checks import unmade_checks
from nodecheck.core.errors import NoData, ParseError
from nodecheck.host.live import LiveHost
from nodecheck.probes import imex


def imex_findings(report):
    return [(f.severity, f.measured) for f in report.findings if f.kind == "imex_unhealthy"]


def test_the_dcgm_sample_parses_as_a_degraded_domain_of_two_ready_nodes():
    status, nodes = imex.parse_domain(DEGRADED)
    assert status == "DEGRADED"
    assert [(n["index"], n["host"], n["status"], n["unconnected"]) for n in nodes] == [
        ("3", NODE_3, "READY", []), ("1", "10.76.183.30", "READY", [])]
    assert imex.parse_daemon("READY\n") == "READY"
    for garbage in ("", "{", '{"status": "SIDEWAYS"}', "[]", '{"status": 5}'):
        with pytest.raises(ParseError):
            imex.parse_domain(garbage)
    with pytest.raises(ParseError):
        imex.parse_daemon("Connection refused")


def test_a_degraded_domain_is_a_warning_on_a_ready_node_and_an_error_on_the_node_at_fault(tmp_path):
    report = tray(tmp_path)
    assert report.imex.daemon == "READY" and report.imex.domain == "DEGRADED"
    from nodecheck.prometheus.exposition import exposition

    metrics = exposition(report).decode()
    assert "nodecheck_imex_daemon_ready 1.0" in metrics and "nodecheck_imex_domain_up 0.0" in metrics
    from nodecheck.render.report import platform_lines

    assert "IMEX: daemon READY, domain DEGRADED (2 of 2 listed nodes READY)" in platform_lines(report)
    (finding,) = [f for f in report.findings if f.kind == "imex_unhealthy"]
    assert (finding.severity, finding.measured) == ("warning", "domain DEGRADED") and "this node is READY" in finding.message
    at_fault = DEGRADED.replace('"3": {"status":"READY"', '"3": {"status":"UNAVAILABLE"')
    assert imex_findings(tray(tmp_path / "f", domain=at_fault)) == [("error", "this node UNAVAILABLE")]
    elsewhere = tray(tmp_path / "e", address="10.76.190.99")  # not among the domain's nodes by address
    assert imex_findings(elsewhere) == [("warning", "domain DEGRADED")]
    down = DEGRADED.replace('"status":"DEGRADED"', '"status":"DOWN"')
    assert imex_findings(tray(tmp_path / "d", domain=down)) == [("error", "domain DOWN")]
    unconnected = DEGRADED.replace('"status":"DEGRADED"', '"status":"UP"').replace(
        '"host":"10.76.190.23","status":"CONNECTED"', '"host":"10.76.190.23","status":"DISCONNECTED"')
    (finding,) = [f for f in tray(tmp_path / "u", domain=unconnected).findings if f.kind == "imex_unhealthy"]
    assert finding.severity == "warning" and "unconnected: 10.76.190.23" in finding.message
    healthy = DEGRADED.replace('"status":"DEGRADED"', '"status":"UP"')
    assert imex_findings(tray(tmp_path / "h", domain=healthy)) == []


def test_a_daemon_not_ready_or_not_answering_is_an_error_and_one_waiting_for_peers_a_warning(tmp_path):
    assert imex_findings(tray(tmp_path / "i", daemon="INITIALIZING\n")) == [("error", "daemon INITIALIZING")]
    peer_down = DEGRADED.replace('"1":{"status":"READY"', '"1":{"status":"UNAVAILABLE"')
    (waiting,) = [f for f in tray(tmp_path / "w", daemon="WAITING_FOR_PEERS\n", domain=peer_down).findings
                  if f.kind == "imex_unhealthy"]
    assert (waiting.severity, waiting.measured) == ("warning", "daemon WAITING_FOR_PEERS")
    assert "not READY: 10.76.183.30 UNAVAILABLE" in waiting.message  # the node it waits on, not this one
    failed = {imex.DAEMON_SOURCE: {"argv": imex.DAEMON_ARGV, "outcome": "failed",
                                   "error": "nvidia-imex-ctl -q exited with 1: connect: Connection refused"}}
    report = tray(tmp_path / "r", daemon=None, domain=None, failed=failed)
    ((severity, measured),) = imex_findings(report)
    assert severity == "error" and "Connection refused" in measured
    unconfigured = tray(tmp_path / "c", daemon="Failed to read node configuration file /etc/nvidia-imex/nodes_config.cfg\n",
                        domain=None)
    assert imex_findings(unconfigured) == [("warning", "not configured (no /etc/nvidia-imex/nodes_config.cfg)")]


def test_outside_a_domain_imex_is_not_judged_and_without_it_unknown(tmp_path):
    hgx = {**published()["gb200-healthy"], "clusterUuid": bytes(16)}  # an HGX board's NVSwitch: no cluster
    assert imex_findings(tray(tmp_path / "x", domain=DEGRADED.replace("DEGRADED", "DOWN"), fabric=hgx)) == []
    with pytest.raises(NoData, match="not installed"):
        imex.collect(LiveHost(), 5.0)  # this machine has no nvidia-imex-ctl: the real subprocess says so
    absent = {imex.DAEMON_SOURCE: {"argv": imex.DAEMON_ARGV, "outcome": "no_data", "error": "nvidia-imex-ctl not found on PATH"}}
    report = tray(tmp_path / "n", daemon=None, domain=None, failed=absent)
    assert report.imex is None and imex_findings(report) == []  # a container's image lacks it as often as a node
    assert "not installed" in unmade_checks(report)["imex_unhealthy"]
    assert "imex_unhealthy" not in unmade_checks(tray(tmp_path / "o", daemon=None, domain=None, failed=absent, fabric=hgx))
