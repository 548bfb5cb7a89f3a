"""Each GPU's NVLink fabric registration (NVML's nvmlGpuFabricInfo): the Fabric sections others published
(tests/fixtures/gpu-fabric/published.txt) turned back into NVML's numbers, replayed through the real NVML probe
on eight HGX GPUs, built into a Report and judged; the captured H100 node's answer (nvidia-smi: N/A) says there
is no fabric."""

import json
import re
import sys

import pytest
from fakes import fake_pynvml
from gpu_fabric_cases import published
from helpers import H100, HGX_FABRIC_REGISTERED, h100_nvml_records, hgx_nvml, make_snapshot, need, nodecheck

from nodecheck.checks import headline, unmade_checks
from nodecheck.checks.fabric import fabric_findings
from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.probes.nvml import dump_nvml, parse_nvml
from nodecheck.prometheus.exposition import ReportCollector


def hgx_report(tmp_path, fabric_of: dict, **gpu):
    """The Report of an 8-GPU HGX H100 node whose GPUs answer NVML's fabric call as fabric_of = {gpu: answer}
    says (the rest registered, as a healthy HGX H100 says it)."""
    gpus = hgx_nvml(**gpu)
    for index, answer in fabric_of.items():
        gpus[index] = dict(gpus[index], fabric=answer)
    return build_report(SnapshotHost(make_snapshot(tmp_path / "snap", nvml_gpus=gpus)))


EXPECTED = {  # case -> (kind, severity, what the finding measured), None: no finding
    "in-progress": ("gpu_fabric_not_ready", "error", "NVLink fabric in progress"),
    "insufficient-resources": ("gpu_fabric_not_ready", "error", "NVLink fabric Insufficient Resources"),
    "unhealthy-summary": ("gpu_fabric_unhealthy", "error", "NVLink fabric unhealthy"),
    "unknown-error": ("gpu_fabric_not_ready", "error", "NVLink fabric Unknown Error"),
    "gb200-healthy": None,
    "state-not-supported": None,
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_each_published_fabric_section_is_judged(tmp_path, case):
    report = hgx_report(tmp_path, {3: published()[case]})
    found = [(f.kind, f.severity, f.measured) for f in fabric_findings(report, Config()) if f.subject == "gpu3"]
    assert found == ([EXPECTED[case]] if EXPECTED[case] else [])
    assert [f.subject for f in fabric_findings(report, Config())] == (["gpu3"] if EXPECTED[case] else [])
    assert "gpu_fabric_not_ready" not in unmade_checks(report)  # every GPU said its state


def test_what_the_report_keeps_of_a_registration(tmp_path):
    report = hgx_report(tmp_path, {1: published()["gb200-healthy"], 2: published()["in-progress"],
                                   5: published()["insufficient-resources"]})
    healthy, waiting, failed, hgx = report.gpus[1].fabric, report.gpus[2].fabric, report.gpus[5].fabric, report.gpus[0].fabric
    assert (healthy.state, healthy.status, healthy.clique_id, healthy.cluster_uuid, healthy.health_summary, healthy.health) == (
        "completed", "Success", 4026, "9c6f5af3-53bf-49b5-a436-b66766c413c3", None, [])
    assert (waiting.state, waiting.status) == ("in_progress", None)  # NVML: the status means something once completed
    assert (failed.state, failed.status, failed.cluster_uuid) == ("completed", "Insufficient Resources", None)
    assert (hgx.state, hgx.status, hgx.clique_id, hgx.cluster_uuid) == ("completed", "Success", 0, None)
    text = ReportCollector(lambda: report)
    registered = {s.labels["gpu"]: s.value for m in text.collect() if m.name == "nodecheck_gpu_fabric_registered"
                  for s in m.samples}
    assert registered == {"0": 1, "1": 1, "2": 0, "3": 1, "4": 1, "5": 0, "6": 1, "7": 1}


def test_a_fabric_not_ready_drains_with_a_reason_that_names_it(tmp_path):
    report = hgx_report(tmp_path, {i: published()["in-progress"] for i in range(8)})
    findings = fabric_findings(report, Config())
    assert [f.subject for f in findings] == [f"gpu{i}" for i in range(8)]
    assert headline(findings[0]) == "gpu0 NVLink fabric in progress"
    assert "error 802" in findings[0].message and "nvidia-fabricmanager" in findings[0].message


@pytest.mark.parametrize(("mask", "summary", "severity", "measured"), [
    (1 << 0, 0, "warning", "bandwidth degraded"),
    (1 << 2, 0, "warning", "route recovery in progress"),
    (1 << 4, 0, "error", "route unhealthy"),
    (5 << 8, 0, "error", "incorrect configuration: insufficient NVLinks"),
    (2 << 14, 0, "error", "global fabric manager disconnected"),
    (2 << 0 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8 | 1 << 14, 1, None, None),  # every condition false, configuration none
    (0, 3, "warning", "limited capacity"),
])
def test_the_health_mask_and_summary(tmp_path, mask, summary, severity, measured):
    answer = dict(HGX_FABRIC_REGISTERED, healthMask=mask, healthSummary=summary)
    findings = fabric_findings(hgx_report(tmp_path, {4: answer}), Config())
    assert [(f.subject, f.severity, f.measured) for f in findings] == (
        [("gpu4", severity, f"NVLink fabric {measured}")] if severity else [])


def test_the_h100_nodes_answer_means_no_fabric(tmp_path):
    """nvidia-smi -q on the captured H100 node prints N/A for every Fabric field: NVML's Not Supported. Its one GPU
    has no NVLink, so nothing is unknown either."""
    said = need(H100 / "nvidia-smi-q.txt").read_text()
    assert re.search(r"Fabric\n\s+State\s+: N/A\n\s+Status\s+: N/A", said)
    records = h100_nvml_records()
    report = build_report(SnapshotHost(make_snapshot(tmp_path / "snap", nvml_gpus=records)))
    assert report.gpus[0].fabric.state == "not_supported" and fabric_findings(report, Config()) == []
    assert "gpu_fabric_not_ready" not in unmade_checks(report)


def test_an_older_driver_is_asked_with_the_older_call(tmp_path):
    """A driver before nvmlDeviceGetGpuFabricInfoV answers nvmlDeviceGetGpuFabricInfo (no health)."""
    gpus = hgx_nvml(fabric_api="v1", fabric=published()["in-progress"])
    report = build_report(SnapshotHost(make_snapshot(tmp_path / "snap", nvml_gpus=gpus)))
    assert {g.fabric.state for g in report.gpus} == {"in_progress"}
    assert len(fabric_findings(report, Config())) == 8


def test_a_refusal_or_a_driver_without_the_call_is_unknown_not_healthy(tmp_path, monkeypatch):
    report = hgx_report(tmp_path, {6: fake_pynvml.NVMLError_GpuIsLost("GPU is lost")})
    assert (report.gpus[6].fabric.state, report.gpus[6].fabric.status) == ("unreadable", "GPU is lost")
    assert fabric_findings(report, Config()) == []
    assert unmade_checks(report)["gpu_fabric_not_ready"] == "gpu6: NVML did not say its fabric state (GPU is lost)"
    gpus = hgx_nvml()
    module = fake_pynvml.replaying(gpus)
    for name in ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"):
        setattr(module, name, lambda h, info: (_ for _ in ()).throw(fake_pynvml.NVMLError_FunctionNotFound("Function Not Found")))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    facts = parse_nvml(dump_nvml())
    assert facts.gpus[0].fabric is None and facts.gpus[0].errors["fabric"].startswith("not in this driver")


@pytest.mark.parametrize("raw", [
    {"state": "3"}, {"state": -1}, {"state": 3, "status": 1 << 40}, {"state": 3, "cluster_uuid": "zz" * 16},
    {"state": 3, "cluster_uuid": 7}, {"status": 0},
])
def test_a_malformed_fabric_answer_is_a_parse_error(raw):
    from nodecheck.core.errors import ParseError

    with pytest.raises(ParseError, match="fabric"):
        parse_nvml({"gpus": [{"index": 0, "fabric": raw}]})


def test_inspect_shows_the_registration_and_fails_on_it(tmp_path):
    gpus = hgx_nvml()
    gpus[2] = dict(gpus[2], fabric=published()["in-progress"])
    snap = make_snapshot(tmp_path / "snap", nvml_gpus=gpus)
    shown = nodecheck("inspect", "--from", str(snap))
    assert shown.returncode == 1, shown.stderr
    rows = {line.split()[0]: line for line in shown.stdout.splitlines() if re.match(r"\s*\d\s+NVIDIA", line)}
    assert "18/18 up, fabric in progress" in rows["2"] and "18/18 up, fabric registered" in rows["0"]
    assert "gpu2 NVLink fabric registration in progress: CUDA refuses work" in " ".join(shown.stdout.split())


def test_the_prolog_drains_naming_the_unregistered_gpu(tmp_path):
    """Fabric Manager never started (every GPU not started): the prolog's drain reason names the fabric."""
    not_started = dict(published()["in-progress"], state=1)
    snap = make_snapshot(tmp_path / "snap", nvml_gpus=hgx_nvml(fabric=not_started))
    done = nodecheck("prolog", "--from", str(snap), "--dry-run", "--json", env={"SLURMD_NODENAME": "hgx1"})
    outcome = json.loads(done.stdout)
    assert done.returncode == 1, done.stderr
    assert (outcome["action"], outcome["detail"]) == ("drain", "nodecheck: gpu0 NVLink fabric not started (+7 more)")
