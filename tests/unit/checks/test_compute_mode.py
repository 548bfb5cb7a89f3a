"""A GPU's compute mode (src/nodecheck/checks/compute_mode.py), read by the real dump_nvml through the pynvml stand-in: the
captured H100 says "Compute Mode: Default" (NVML_COMPUTEMODE_DEFAULT, 0); NVML numbers the others 2 (prohibited)
and 3 (exclusive process), as nvml.h and nvidia-ml-py's NVML_COMPUTEMODE_* do."""

import json

from helpers import captured, hgx_nvml, make_snapshot, run_nodecheck

from nodecheck.checks import unmade_checks
from nodecheck.checks.compute_mode import compute_mode_findings
from nodecheck.config import Config, loads
from nodecheck.config.init import generate
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report

PROHIBITED, EXCLUSIVE_PROCESS = 2, 3


def hgx(tmp_path, modes: dict[int, object]):
    gpus = hgx_nvml()
    for index, mode in modes.items():
        gpus[index] = dict(gpus[index], compute_mode=mode)
    return build_report(SnapshotHost(make_snapshot(tmp_path / f"n{len(list(tmp_path.iterdir()))}", nvml_gpus=gpus)))


def found(report, config=None) -> list[tuple[str, str, str]]:
    return [(f.subject, f.severity, f.measured) for f in compute_mode_findings(report, config or Config())]


def test_the_captured_h100_is_in_default_mode_and_the_check_is_made(tmp_path):
    report = build_report(SnapshotHost(make_snapshot(tmp_path / "h100", nvml_gpus=[captured()])))
    assert report.gpus[0].compute_mode == "default"
    assert found(report) == [] and "gpu_compute_mode" not in unmade_checks(report)


def test_a_prohibited_gpu_is_an_error_and_drains_in_the_prolog(tmp_path):
    report = hgx(tmp_path, {3: PROHIBITED})
    assert found(report) == [("gpu3", "error", "prohibited")]
    snap = make_snapshot(tmp_path / "p", nvml_gpus=[dict(g, compute_mode=PROHIBITED) if i == 3 else g
                                                    for i, g in enumerate(hgx_nvml())])
    outcome = json.loads(run_nodecheck("prolog", "--dry-run", "--json", "--from", str(snap)).stdout)
    assert outcome["detail"] == "nodecheck: gpu3 compute mode prohibited, default expected", outcome


def test_one_gpu_left_exclusive_is_a_warning_and_a_node_set_so_on_purpose_is_not(tmp_path):
    assert found(hgx(tmp_path, {5: EXCLUSIVE_PROCESS})) == [("gpu5", "warning", "exclusive_process")]
    assert found(hgx(tmp_path, dict.fromkeys(range(8), EXCLUSIVE_PROCESS))) == []


def test_the_config_says_which_mode_every_gpu_must_be_in(tmp_path):
    config = loads('[gpus]\ncompute_mode = "exclusive_process"\n', "t.toml")
    report = hgx(tmp_path, dict.fromkeys(range(7), EXCLUSIVE_PROCESS))
    assert found(report, config) == [("gpu7", "error", "default")]
    golden = hgx(tmp_path, dict.fromkeys(range(8), EXCLUSIVE_PROCESS))
    generated = loads(generate(golden), "generated.toml")  # config init keeps the golden node's mode
    assert generated.compute_mode == "exclusive_process" and found(golden, generated) == []


def test_a_mode_nvml_does_not_say_is_unknown_not_healthy(tmp_path):
    report = hgx(tmp_path, {2: "ERR"})
    assert report.gpus[2].compute_mode is None and found(report) == []
    assert unmade_checks(report)["gpu_compute_mode"] == "gpu2: NVML did not report its compute mode"


def test_the_mode_is_published(tmp_path):
    from helpers import metrics_of, samples

    published = samples(metrics_of(hgx(tmp_path, {1: PROHIBITED}), tmp_path))
    assert published[("nodecheck_gpu_compute_mode_info", (("gpu", "1"), ("mode", "prohibited")))] == 1
    assert published[("nodecheck_gpu_compute_mode_info", (("gpu", "0"), ("mode", "default")))] == 1


def test_a_mode_the_config_cannot_mean_is_refused():
    import pytest

    from nodecheck.core.errors import ConfigError

    with pytest.raises(ConfigError, match="'gpus.compute_mode': expected one of default, exclusive_process, prohibited"):
        loads('[gpus]\ncompute_mode = "exclusive"\n', "t.toml")


def test_inspect_says_a_mode_that_is_not_default(tmp_path):
    from nodecheck.render.report import process_lines

    assert process_lines(hgx(tmp_path, {})) == []
    assert process_lines(hgx(tmp_path, dict.fromkeys(range(8), EXCLUSIVE_PROCESS))) == [
        "GPU compute mode: exclusive_process on every GPU"]
    assert process_lines(hgx(tmp_path, {3: PROHIBITED})) == ["GPU compute mode: gpu3 prohibited"]
