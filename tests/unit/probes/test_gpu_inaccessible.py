"""A GPU NVML counts but cannot open (nvmlDeviceGetHandleByIndex refused), as on an HGX node where one GPU fell off
the bus (NVML: "GPU is lost") or failed to initialise (RmInitAdapter failed: "Unknown Error"). Before, the refusal
ended the whole NVML probe: a probe_failed warning that drained nothing, and every NVML check of the seven healthy
GPUs unknown. Replayed through the real dump_nvml and the stand-in (hgx_nvml: the captured H100's values)."""

import json

import pytest
from fakes import fake_pynvml
from helpers import cli, hgx_nvml, make_snapshot

from nodecheck.assemble.advice import binding_advice
from nodecheck.checks import evaluate, headline
from nodecheck.config import Config, loads
from nodecheck.core.errors import ParseError
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.probes.nvml import parse_nvml
from nodecheck.report.model import Report


def judged(tmp_path, gpus: list, config: Config | None = None, topo: str | None = "hgx-h100-8gpu-8nic-sglang30401.txt") -> Report:
    report = build_report(SnapshotHost(make_snapshot(tmp_path / "snap", topo=topo, nvml_gpus=gpus)))
    report.findings = evaluate(report, config or Config())
    return report


def with_gpu(index: int, error: Exception) -> list:
    gpus = hgx_nvml()
    gpus[index] = error
    return gpus


def test_a_gpu_fallen_off_the_bus_fails_the_node_and_the_others_are_still_read(tmp_path):
    report = judged(tmp_path, with_gpu(3, fake_pynvml.NVMLError_GpuIsLost("GPU is lost")))
    (finding,) = [f for f in report.findings if f.kind == "gpu_inaccessible"]
    assert (finding.severity, finding.subject, headline(finding)) == ("error", "gpu3", "gpu3 GPU is lost")
    assert "fell off the bus or failed to initialise" in finding.message and report.fails("error")
    nvml = next(p for p in report.probes if p.name == "nvml")
    assert nvml.ok and not any(f.kind == "probe_failed" and f.subject == "probe:nvml" for f in report.findings)
    read = {g.index: g for g in report.gpus if g.signals is not None}  # NVML's facts of the seven it opened
    assert sorted(read) == [0, 1, 2, 4, 5, 6, 7] and sum(l["active"] for l in read[4].nvlinks) == 18
    assert [(g.index, g.code) for g in report.gpus_inaccessible] == [(3, 15)]


def test_with_a_gpu_count_expected_the_count_is_short_too(tmp_path):
    """nvidia-smi topo -m failing too (it opens the GPUs through NVML), seven GPUs are visible of the eight expected."""
    config = loads("[gpus]\ncount = 8\n", "test")
    report = judged(tmp_path, with_gpu(5, fake_pynvml.NVMLError("Unknown Error")), config, topo=None)
    kinds = {f.kind: f for f in report.findings}
    assert kinds["gpu_inaccessible"].measured == "Unknown Error" and kinds["gpu_inaccessible"].severity == "error"
    assert (kinds["gpu_count_low"].measured, kinds["gpu_count_low"].expected) == (7, 8)


def test_a_gpu_this_user_may_not_open_is_a_warning(tmp_path):
    report = judged(tmp_path, with_gpu(0, fake_pynvml.NVMLError_NoPermission("Insufficient Permissions")))
    (finding,) = [f for f in report.findings if f.kind == "gpu_inaccessible"]
    assert (finding.severity, finding.measured) == ("warning", "Insufficient Permissions")


def test_no_gpu_opened_says_why_there_are_none(tmp_path):
    lost = [fake_pynvml.NVMLError_GpuIsLost("GPU is lost")] * 2
    report = build_report(SnapshotHost(make_snapshot(tmp_path / "snap", nvml_gpus=lost)))
    assert report.gpus == [] and report.gpus_absent_reason.startswith("NVML counts 2 GPU(s) and could open none (GPU is lost)")
    assert [f.subject for f in evaluate(report, Config()) if f.kind == "gpu_inaccessible"] == ["gpu0", "gpu1"]


def test_the_report_keeps_them_through_json(tmp_path):
    report = judged(tmp_path, with_gpu(3, fake_pynvml.NVMLError_GpuIsLost("GPU is lost")))
    again = Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.gpus_inaccessible == report.gpus_inaccessible


@pytest.mark.parametrize("raw", [
    {"index": "3", "handle_error": "GPU is lost"}, {"index": 3, "handle_error": 15},
    {"index": 3, "handle_error": "GPU is lost", "handle_error_code": "15"},
])
def test_a_malformed_refusal_is_a_parse_error(raw):
    with pytest.raises(ParseError, match="NVML's reason"):
        parse_nvml({"gpus": [raw]})


def test_inspect_says_the_gpu_and_advises_no_process_onto_it(tmp_path):
    """nvidia-smi topo -m still lists gpu3 (its row comes from there): the GPU table says NVML's reason in its model
    column, and the binding advice leaves it out."""
    report = judged(tmp_path, with_gpu(3, fake_pynvml.NVMLError_GpuIsLost("GPU is lost")))
    assert [a["gpu"] for a in binding_advice(report)] == [0, 1, 2, 4, 5, 6, 7]
    out = cli("inspect", "--from", str(tmp_path / "snap")).stdout
    assert "NVML: GPU is lost" in out and "gpu3: CUDA_VISIBLE_DEVICES" not in out
