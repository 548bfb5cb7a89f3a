"""The recovery action the driver asks for after an uncorrectable fault (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
read by the real dump_nvml through the pynvml stand-in: the captured H100 says none ("GPU Recovery Action: None" in
its `nvidia-smi -q`, driver 580.159.04); other values are those of nvml.h's NVML_GPU_RECOVERY_ACTION_*, returned
in nvidia-ml-py's own c_nvmlFieldValue_t."""

import sys

import pytest
from fakes import fake_pynvml
from helpers import captured, h2d, judged, report_of, report_with

from nodecheck.checks import evaluate, headline, unmade_checks
from nodecheck.checks.gpu_errors import gpu_findings
from nodecheck.config import Config
from nodecheck.probes.nvml import dump_nvml
from nodecheck.report.findings import Finding


def test_the_h100_asks_for_nothing(tmp_path, monkeypatch):
    report = report_of(tmp_path, captured(), monkeypatch)
    assert report.gpus[0].signals.recovery_action == 0
    assert gpu_findings(report, Config()) == [] and "gpu_recovery_action" not in unmade_checks(report)


@pytest.mark.parametrize(("action", "named"), [
    (1, "GPU reset"), (2, "node reboot"), (3, "peer-to-peer drain"), (4, "peer-to-peer drain and GPU reset"),
    (5, "IMEX domain recovery"), (6, "PCIe bus reset"), (7, "system reboot")])
def test_each_action_is_an_error_that_names_it(tmp_path, monkeypatch, action, named):
    report = report_of(tmp_path, dict(captured(), recovery=action), monkeypatch)
    (finding,) = gpu_findings(report, Config())
    assert (finding.kind, finding.severity, finding.subject, finding.measured) == ("gpu_recovery_action", "error", "gpu0", named)
    assert f"NVML recovery action {action}" in finding.message
    assert headline(finding) == f"gpu0 needs {named}"  # the Slurm drain reason's figure


def test_a_reset_says_the_command_for_that_gpu(tmp_path, monkeypatch):
    (finding,) = gpu_findings(report_of(tmp_path, dict(captured(), recovery=1), monkeypatch), Config())
    assert "`nvidia-smi -r -i 0`" in finding.message


def test_an_action_this_nodecheck_does_not_know_is_a_warning(tmp_path, monkeypatch):
    (finding,) = gpu_findings(report_of(tmp_path, dict(captured(), recovery=9), monkeypatch), Config())
    assert (finding.severity, finding.measured) == ("warning", "action 9") and "nvidia-smi -q -i 0" in finding.message


def test_a_driver_without_the_field_is_unknown_not_none(tmp_path, monkeypatch):
    """NVML answers a field it does not know with that field's nvmlReturn Not Supported (the call succeeds)."""
    report = report_of(tmp_path, dict(captured(), recovery="ERR"), monkeypatch)
    assert report.gpus[0].signals.recovery_action is None and gpu_findings(report, Config()) == []
    assert unmade_checks(report)["gpu_recovery_action"].startswith("gpu0: NVML did not report its recovery action")


def test_the_dump_keeps_nvmls_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying([dict(captured(), recovery="ERR")]))
    assert dump_nvml()["gpus"][0]["recovery_action"] == {"error": "Not Supported"}
    module = fake_pynvml.replaying([captured()])
    del module.nvmlDeviceGetFieldValues  # an nvidia-ml-py older than the call
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert dump_nvml()["gpus"][0]["recovery_action"] == {"error": "not in this nvidia-ml-py"}


def test_a_fine_bandwidth_does_not_temper_it():
    """A GPU the driver wants reset is out of service even if its copies still run at speed; a slow copy on it names
    the action among the signals on its path."""

    reset = Finding("gpu_recovery_action", "error", "gpu3", "GPU reset", "none", "gpu3: the driver asks for a GPU reset")
    assert judged(report_with(reset), h2d(0.95))["gpu_recovery_action"].severity == "error"
    assert judged(report_with(reset), h2d(0.41))["bandwidth_below_spec"].message.endswith(
        "; error signals on this path: gpu3 GPU reset")


def test_published_and_raised_through_the_rules(tmp_path, monkeypatch):
    from nodecheck.prometheus.exposition import exposition

    def render_metrics(report):
        return exposition(report).decode()

    report = report_of(tmp_path, dict(captured(), recovery=4), monkeypatch)
    report.findings = evaluate(report, Config())
    text = render_metrics(report)
    assert 'nodecheck_gpu_recovery_action{gpu="0"} 4.0' in text
    assert 'nodecheck_finding{kind="gpu_recovery_action",severity="error",subject="gpu0"} 1.0' in text
    unsaid = report_of(tmp_path, dict(captured(), recovery="ERR"), monkeypatch)
    unsaid.findings = evaluate(unsaid, Config())
    assert "nodecheck_gpu_recovery_action{" not in render_metrics(unsaid)
    assert 'nodecheck_check_unknown{check="gpu_recovery_action"' in render_metrics(unsaid)
