"""Alerting rules: promtool checks and unit-tests them (firing and not firing), and every metric a
rule queries is one the exporter publishes."""

import re
import shutil
import subprocess

import pytest
from helpers import REPO, hgx_nvml, make_measurement, make_snapshot
from prometheus_client.parser import text_string_to_metric_families

from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.prometheus.exposition import write_textfile
from nodecheck.report.events import KernelLog

RULES = REPO / "deploy" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (apt install prometheus)")
    return subprocess.run(["promtool", *args], cwd=RULES, capture_output=True, text=True, timeout=60)


def test_rules_are_valid_and_their_unit_tests_pass():
    checked = promtool("check", "rules", "nodecheck-rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "nodecheck-rules.test.yml", "nodecheck-rules-days.test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_nccl_inspectors_rules_name_a_node_below_its_peers():
    """The recording rules and alert over NCCL Inspector's own exposition (deploy/prometheus/nccl-inspector-rules.yml):
    one tray at half its peers' bus bandwidth fires, a job of two nodes (too few peers) does not; a changed
    expectation fails."""
    checked = promtool("check", "rules", "nccl-inspector-rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "nccl-inspector-rules.test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_a_broken_expectation_fails_the_unit_tests(tmp_path):
    """The unit tests can fail: the same file with one expected value changed must not pass."""
    broken = (RULES / "nodecheck-rules.test.yml").read_text().replace("has only 16 active NVLinks", "has only 15 active NVLinks")
    (tmp_path / "nodecheck-rules.yml").write_text((RULES / "nodecheck-rules.yml").read_text())
    (tmp_path / "t.yml").write_text(broken)
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (apt install prometheus)")
    result = subprocess.run(["promtool", "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_every_metric_in_the_rules_is_exported(tmp_path):
    snap = make_snapshot(tmp_path / "s", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    report = build_report(SnapshotHost(snap))
    report.measurements.append(make_measurement())
    report.kernel_log = KernelLog(True, None, "/dev/kmsg", [])
    from nodecheck.kubernetes.node_health import NodeHealth

    publisher = NodeHealth(None, "node-1")  # what serve --kubernetes-conditions adds to /metrics
    publisher.record_round(True)
    text = write_textfile(report, tmp_path).read_text() + publisher.exposition().decode()
    exported = {f.name for f in text_string_to_metric_families(text)}
    queried = set(re.findall(r"\bnodecheck_[a-z_]+", (RULES / "nodecheck-rules.yml").read_text()))
    assert queried and queried <= exported, queried - exported


# kinds whose alert is on the metric they come from, not on the finding (the alert that covers each)
METRIC_ALERTED = {"bandwidth_below_spec": "NodecheckBandwidthBelowSpec", "bench_failed": "NodecheckBandwidthTestFailing",
                  "probe_failed": "NodecheckProbeFailing", "nvlink_inactive": "NodecheckNvlinkDown",
                  "pcie_downtrained": "NodecheckPcieLinkDowntrained"}


def test_every_error_finding_reaches_an_alert():
    """An error finding drains the node in the prolog; through Prometheus it pages: by an alert of its own or by
    NodecheckFindingError, which leaves out only the kinds another alert covers (a kind left out that no alert
    names would be silent). A new kind is caught by it until it has an alert of its own."""
    import yaml

    from nodecheck.checks import FINDING_KINDS

    rules = [r for g in yaml.safe_load((RULES / "nodecheck-rules.yml").read_text())["groups"] for r in g["rules"]]
    (catch_all,) = [r for r in rules if r.get("alert") == "NodecheckFindingError"]
    left_out = re.search(r'kind!~"([^"]+)"', catch_all["expr"])[1].split("|")
    others = {r["alert"]: r["expr"] for r in rules if "alert" in r and r["alert"] != "NodecheckFindingError"}
    for kind in left_out:
        assert kind in FINDING_KINDS, kind
        named = [a for a, expr in others.items()
                 if any(re.fullmatch(pattern, kind) for pattern in re.findall(r'(?:kind|check)=~?"([^"]+)"', expr))]
        assert named or METRIC_ALERTED.get(kind) in others, f"{kind}: left out of NodecheckFindingError, in no other alert"
    assert "gpu_count_low" not in left_out and "row_remap_failed" not in left_out
