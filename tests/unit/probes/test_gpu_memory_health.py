"""A GPU's memory and board health beyond its ECC counts (src/nodecheck/probes/nvml_memory.py), read by the real dump_nvml through
the pynvml stand-in. The captured H100 says all is well: "SRAM Threshold Exceeded: No", every SRAM uncorrectable
count 0, "Retired Pages: N/A" (an H100 remaps rows: NVML answers Not Supported), no InfoROM warning (its
`nvidia-smi -q`, driver 580.159.04). A V100 (NVML architecture 5, Volta) retires pages instead and has no SRAM
status (Not Supported); its values here are counts NVML returns as that many page addresses."""

import sys

import pytest
from fakes import fake_pynvml
from helpers import captured, report_of

from nodecheck.checks import unmade_checks
from nodecheck.checks.gpu_errors import gpu_findings
from nodecheck.config import Config, loads
from nodecheck.probes.nvml import dump_nvml
from nodecheck.probes.nvml_memory import parse_memory

KINDS = ("sram_threshold_exceeded", "retired_pages_limit", "retired_pages_pending", "inforom_corrupted")


def v100(**answers) -> dict:
    volta = dict(name="Tesla V100-SXM2-16GB", arch=5, gen=3, maxgen=3, gpumaxgen=3, sram="ERR",
                 retired_pages={"sbe": 0, "dbe": 0}, retired_pending=0)
    return {**captured(), **volta, **answers}


def found(report, config=None) -> list[tuple[str, str, str]]:
    return [(f.kind, f.severity, f.measured) for f in gpu_findings(report, config or Config()) if f.kind in KINDS]


def test_the_h100_is_healthy_and_every_check_it_has_is_known(tmp_path, monkeypatch):
    report = report_of(tmp_path, captured(), monkeypatch)
    signals = report.gpus[0].signals
    assert (signals.sram_threshold_exceeded, signals.inforom_valid, signals.retired_pages) == (False, True, None)
    assert found(report) == []
    unknown = unmade_checks(report)
    assert not set(KINDS) & set(unknown)  # retired pages are no question for an H100


def test_sram_past_the_rma_threshold_is_a_warning(tmp_path, monkeypatch):
    """NVIDIA's RMA policy for L2/SRAM: the flag is set after more than 4 unique uncorrectable events in a parity
    protected bank (2 for SEC-DED); DCGM's diagnostic warns on it."""
    answer = {"bThresholdExceeded": 1, "aggregateUncParity": 5, "aggregateUncSecDed": 0}
    report = report_of(tmp_path, dict(captured(), sram=answer), monkeypatch)
    (finding,) = [f for f in gpu_findings(report, Config()) if f.kind in KINDS]
    assert (finding.kind, finding.severity, finding.subject) == ("sram_threshold_exceeded", "warning", "gpu0")
    assert "RMA" in finding.message and "`nvidia-smi -q -d ECC -i 0`" in finding.message


def test_sram_status_without_root_is_unknown_not_healthy(tmp_path, monkeypatch):
    report = report_of(tmp_path, dict(captured(), sram=fake_pynvml.NVMLError_NoPermission("Insufficient Permissions")),
                       monkeypatch)
    assert report.gpus[0].signals.sram_threshold_exceeded is None and found(report) == []
    assert unmade_checks(report)["sram_threshold_exceeded"] == "gpu0: NVML did not report its SRAM error status (it needs root)"


@pytest.mark.parametrize(("sbe", "dbe", "expected"), [(40, 22, []), (40, 23, [("retired_pages_limit", "error", "63 retired")])])
def test_a_v100_at_dcgms_retired_page_limit_is_an_error(tmp_path, monkeypatch, sbe, dbe, expected):
    report = report_of(tmp_path, v100(retired_pages={"sbe": sbe, "dbe": dbe}), monkeypatch)
    assert report.gpus[0].signals.retired_pages == sbe + dbe
    assert found(report) == expected
    assert not {"retired_pages_limit", "retired_pages_pending"} & set(unmade_checks(report))
    assert "sram_threshold_exceeded" not in unmade_checks(report)  # no question for a V100


def test_the_config_sets_the_retired_page_limit(tmp_path, monkeypatch):
    report = report_of(tmp_path, v100(retired_pages={"sbe": 12, "dbe": 0}), monkeypatch)
    config = loads("[errors.limits]\nretired_pages = 10\n", "test")
    assert found(report, config) == [("retired_pages_limit", "error", "12 retired")]


def test_a_pending_retirement_is_a_warning_to_reset(tmp_path, monkeypatch):
    (finding,) = [f for f in gpu_findings(report_of(tmp_path, v100(retired_pending=1), monkeypatch), Config())
                  if f.kind in KINDS]
    assert (finding.kind, finding.severity) == ("retired_pages_pending", "warning")
    assert "`nvidia-smi -r -i 0`" in finding.message


def test_a_v100_whose_retired_pages_nvml_refuses_is_unknown(tmp_path, monkeypatch):
    report = report_of(tmp_path, v100(retired_pages="ERR", retired_pending="ERR"), monkeypatch)
    unknown = unmade_checks(report)
    assert unknown["retired_pages_limit"] == "gpu0: NVML did not report its retired pages"
    assert "retired_pages_pending" in unknown


def test_a_corrupted_inforom_is_a_warning(tmp_path, monkeypatch):
    report = report_of(tmp_path, dict(captured(), inforom="corrupted"), monkeypatch)
    assert report.gpus[0].signals.inforom_valid is False
    assert found(report) == [("inforom_corrupted", "warning", "corrupted")]


def test_the_dump_keeps_nvmls_answers_and_reasons(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying([v100(retired_pages={"sbe": 2, "dbe": 1})]))
    record = dump_nvml()["gpus"][0]
    assert record["retired_pages"] == {"sbe": 2, "dbe": 1} and record["retired_pages_pending"] == 0
    assert record["sram_ecc"] == {"error": "Not Supported"} and record["inforom_valid"] is True
    module = fake_pynvml.replaying([captured()])
    for name in ("nvmlDeviceGetSramEccErrorStatus", "nvmlDeviceValidateInforom", "nvmlDeviceGetRetiredPages"):
        delattr(module, name)  # an nvidia-ml-py older than the calls
    monkeypatch.setitem(sys.modules, "pynvml", module)
    record = dump_nvml()["gpus"][0]
    assert record["sram_ecc"] == record["inforom_valid"] == {"error": "not in this nvidia-ml-py"}


@pytest.mark.parametrize("raw", [
    {"sram_ecc": [1], "retired_pages": "many", "retired_pages_pending": 2, "inforom_valid": "yes"},
    {"sram_ecc": {"threshold_exceeded": True}, "retired_pages": {"sbe": -1, "dbe": 1 << 62}, "inforom_valid": {}},
    {},
])
def test_a_malformed_record_is_no_answer(raw):
    errors = {}
    assert set(parse_memory(raw, errors).values()) == {None}
