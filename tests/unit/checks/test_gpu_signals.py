"""A GPU's own error signals (NVML): read by the real dump_nvml through the pynvml stand-in, which replays the
H100 node's captured values (PCIe replay counter 0, every clock event reason "Not Active", no uncorrectable
ECC) and, where a test gives them, others in the shapes NVML returns them; judged over two samples."""

import copy
import json
import sys

import pytest
from fakes import fake_pynvml
from helpers import captured, report_of

from nodecheck.assemble.counters import counter_sample
from nodecheck.checks import unmade_checks
from nodecheck.checks.gpu_errors import gpu_findings
from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.probes.nvml import dump_nvml
from nodecheck.report.events import CounterSample, History


def test_the_h100_captures_values_say_nothing_is_wrong(tmp_path, monkeypatch):
    report = report_of(tmp_path, captured(), monkeypatch)
    (gpu,) = report.gpus
    assert (gpu.signals.pcie_replays, gpu.signals.clock_event_reasons, gpu.signals.ecc_uncorrected_volatile) == (0, 0, 0)
    assert gpu.signals.nvlink_errors is None  # no NVLink on that VM (NVML: Not Supported): unknown, not 0
    assert gpu_findings(report, Config()) == []
    assert unmade_checks(report)["pcie_replays"].startswith("unknown (first sample)")


def test_replays_above_the_links_limit(tmp_path, monkeypatch):
    """gen5 x16: 31/min. +300 in 60 s is 300/min."""
    gpu = dict(captured(), replay=300)
    before = CounterSample(940.0, {"gpu/0000:00:06.0/pcie_replays": 0})
    (finding,) = gpu_findings(report_of(tmp_path, gpu, monkeypatch, [before]), Config())
    assert (finding.kind, finding.severity, finding.subject, finding.measured, finding.expected) == (
        "pcie_replays", "warning", "gpu0", "PCIe replays 300/min", "<= 31/min")  # DCGM's PCIe watch: WARN
    calm = dict(captured(), replay=20)
    assert gpu_findings(report_of(tmp_path, calm, monkeypatch, [before]), Config()) == []


def test_replays_are_an_error_when_the_links_bandwidth_test_failed_too(tmp_path, monkeypatch):
    """DCGM's PCIe health watch warns on a replay rate past its limit (DcgmHealthWatch: DCGM_HEALTH_RESULT_WARN); the
    prolog drains on it only where a test over that link measured it slow as well."""
    from helpers import make_measurement

    from nodecheck.verdicts.bandwidth import with_measurements

    before = CounterSample(940.0, {"gpu/0000:00:06.0/pcie_replays": 0})
    report = report_of(tmp_path, dict(captured(), replay=300), monkeypatch, [before])
    report.findings = gpu_findings(report, Config())
    for ratio, severity in ((0.41, "error"), (0.87, "warning")):
        h2d = make_measurement("gpu0:host", "h2d", ratio * 63e9, 63e9, direction="unidirectional", details={"path_kind": "pcie"})
        judged = with_measurements(report, [h2d], 1000.0, Config())
        (replays,) = [f for f in judged.findings if f.kind == "pcie_replays"]
        assert replays.severity == severity, replays.message
    assert "its path's bandwidth test failed: h2d on gpu0:host 0.41 of spec" in [
        f.message for f in with_measurements(report, [make_measurement("gpu0:host", "h2d", 0.41 * 63e9, 63e9, details={
            "path_kind": "pcie"})], 1000.0, Config()).findings if f.kind == "pcie_replays"][0]


def test_one_nvlink_replay_between_samples_fails_as_dcgm_fails_it(tmp_path, monkeypatch):
    """DcgmHealthWatch: `nvLinkError >= DCGM_LIMIT_MAX_NVLINK_ERROR` (1): one replay or recovery in a sample fails."""
    gpu = copy.deepcopy(captured())
    gpu["nvlink"] = [[0, 1, 4]]
    gpu["nvlink_errors"] = {0: [1, 0, 0, 0]}
    key = "gpu/0000:00:06.0/nvlink_"
    before = CounterSample(940.0, {key + "replay": 0, key + "recovery": 0, key + "crc_flit": 0, key + "crc_data": 0})
    (finding,) = gpu_findings(report_of(tmp_path, gpu, monkeypatch, [before]), Config())
    assert (finding.kind, finding.measured, finding.expected) == ("nvlink_errors", "NVLink replay +1", "< 1 per sample")


def test_nvlink_crc_replay_and_recovery(tmp_path, monkeypatch):
    """NVML's counters per link (replay, recovery, CRC flit, CRC data), summed per GPU: CRC 200/s over DCGM's
    100/s, 3 replays in one sample interval (more than 1); recoveries unchanged."""
    gpu = copy.deepcopy(captured())
    gpu["nvlink"] = [[0, 1, 4], [1, 1, 4]]
    gpu["nvlink_errors"] = {0: [3, 1, 6000, 0], 1: [0, 0, 6000, 0]}
    key = "gpu/0000:00:06.0/nvlink_"
    before = CounterSample(940.0, {key + "replay": 0, key + "recovery": 1, key + "crc_flit": 0, key + "crc_data": 0})
    report = report_of(tmp_path, gpu, monkeypatch, [before])
    assert report.gpus[0].signals.nvlink_errors == {"replay": 3, "recovery": 1, "crc_flit": 12000, "crc_data": 0}
    assert {f.measured for f in gpu_findings(report, Config())} == {"NVLink CRC 200/s", "NVLink replay +3"}
    assert counter_sample(report)[key + "crc_flit"] == 12000


@pytest.mark.parametrize(("now", "before", "severity"), [
    (0x48, 0x40, "error"),  # HW thermal slowdown held since the previous sample
    (0x48, 0, "warning"),  # seen now only
    (0x20, 0x20, "warning"),  # the driver's thermal slowdown
    (0x4, 0x4, None),  # the driver's power cap: a busy GPU at its power limit, not a fault
    (0x24, 0, "warning"),  # thermal slowdown at the power limit: the slowdown is named
    (0x1, 0x1, None),  # idle: not a slowdown
])
def test_clock_event_reasons(tmp_path, monkeypatch, now, before, severity):
    previous = CounterSample(940.0, {"gpu/0000:00:06.0/clock_event_reasons": before})
    findings = gpu_findings(report_of(tmp_path, dict(captured(), clock_reasons=now), monkeypatch, [previous]), Config())
    assert [f.severity for f in findings] == ([severity] if severity else [])


def test_volatile_uncorrectable_ecc_is_an_error(tmp_path, monkeypatch):
    (finding,) = gpu_findings(report_of(tmp_path, dict(captured(), ecc_volatile_uncorrected=2), monkeypatch), Config())
    assert (finding.kind, finding.severity, finding.measured) == ("ecc_uncorrected", "error", "2 uncorrectable")


def test_an_nvml_refusal_is_unknown_not_zero(tmp_path, monkeypatch):
    report = report_of(tmp_path, dict(captured(), replay="ERR NVMLError_NotSupported"), monkeypatch)
    assert report.gpus[0].signals.pcie_replays is None and "gpu/0000:00:06.0/pcie_replays" not in counter_sample(report)


def test_an_nvlink_node_whose_error_counters_nvml_refuses_is_unknown_not_healthy(tmp_path, monkeypatch):
    """Eight H100s with 18 active NVLinks each whose per-link error counters NVML answers Not Supported (the stand-in
    without "nvlink_errors"), and a previous sample of their other counters: the PCIe replays were judged, so the
    GPU family read as judged and the NVLink error check passed over 144 links it never read."""
    from helpers import hgx_nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(hgx_nvml()))
    snap = tmp_path / "hgx"
    snap.mkdir()
    (snap / "nvml.json").write_text(json.dumps(dump_nvml()))
    report = build_report(SnapshotHost(snap))
    report.history = History("boot", [], [CounterSample(940.0, counter_sample(report))], 1000.0)
    unmade = unmade_checks(report)
    assert unmade["nvlink_errors"] == "gpu0: NVML did not report the error counters of its active NVLinks"
    assert "pcie_replays" not in unmade and "gpu_clock_slowdown" not in unmade  # those were read and judged

    counted = hgx_nvml()
    for gpu in counted:
        gpu["nvlink_errors"] = {link: [0, 0, 0, 0] for link in range(18)}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(counted))
    (snap / "nvml.json").write_text(json.dumps(dump_nvml()))
    report = build_report(SnapshotHost(snap))
    report.history = History("boot", [], [CounterSample(940.0, counter_sample(report))], 1000.0)
    assert "nvlink_errors" not in unmade_checks(report)


def hgx_b200(**counters):
    """Eight Blackwell GPUs (NVML architecture 10) with 18 active NVLink 5 links each, whose per-link error counters
    NVML answers Not Supported (Blackwell's driver keeps none of them: knvlinkGetSupportedCounters_GB100) and whose
    NVLink 5 counters, summed over the links, are `counters` (none given: Not Supported, as before Blackwell)."""
    from helpers import hgx_nvml

    return hgx_nvml(18, version=7, arch=10, name="NVIDIA B200", **({"nvlink5": counters} if counters else {}))


def hgx_report(tmp_path, monkeypatch, gpus, samples=()):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(gpus))
    snap = tmp_path / f"hgx-{len(list(tmp_path.iterdir()))}"
    snap.mkdir()
    (snap / "nvml.json").write_text(json.dumps(dump_nvml()))
    report = build_report(SnapshotHost(snap))
    report.history = History("boot", [], list(samples), 1000.0)
    return report


def test_blackwell_nvlink5_counters_are_read_and_any_rise_is_an_error(tmp_path, monkeypatch):
    """An HGX B200 had no readable NVLink error counter: the check was unknown on every Blackwell node. Its NVLink 5
    counters (scope UINT_MAX: summed over the links, as DCGM asks) are read, and any rise of one between two
    samples is an error, as DCGM 4.6's NVLink health watch fails on Blackwell."""
    quiet = {"symbol_errors": 0, "malformed_packets": 0, "buffer_overruns": 0, "rx_errors": 0, "rx_remote_errors": 0,
             "rx_general_errors": 0, "integrity_errors": 0, "recovery_events": 2}
    first = hgx_report(tmp_path, monkeypatch, hgx_b200(**quiet))
    assert first.gpus[3].signals.nvlink_errors == quiet
    assert "nvlink_errors" not in unmade_checks(hgx_report(tmp_path, monkeypatch, hgx_b200(**quiet),
                                                           [CounterSample(940.0, counter_sample(first))]))
    unread = hgx_report(tmp_path, monkeypatch, hgx_b200(), [CounterSample(940.0, counter_sample(first))])
    assert unmade_checks(unread)["nvlink_errors"] == "gpu0: NVML did not report the error counters of its active NVLinks"

    rising = hgx_report(tmp_path, monkeypatch, hgx_b200(**quiet | {"symbol_errors": 40, "recovery_events": 3}),
                        [CounterSample(940.0, counter_sample(first))])
    findings = [f for f in gpu_findings(rising, Config()) if f.subject == "gpu0"]
    assert [(f.kind, f.severity, f.measured, f.expected) for f in findings] == [
        ("nvlink_errors", "error", "NVLink symbol errors +40, recovery events +1", "<= 0 per sample")]
    assert "DCGM 4.6" in findings[0].message


def test_nvlink5_counters_of_a_gpu_before_blackwell_are_not_judged(tmp_path, monkeypatch):
    """DCGM judges the NVLink 5 counters on Blackwell only; an H100 that answered them is judged on its own counters."""
    from helpers import hgx_nvml

    report = hgx_report(tmp_path, monkeypatch, hgx_nvml(nvlink5={"symbol_errors": 7}))
    assert report.gpus[0].signals is None or report.gpus[0].signals.nvlink_errors is None


def test_a_gpu_without_nvlink_has_no_nvlink_counters_to_read(tmp_path, monkeypatch):
    report = report_of(tmp_path, captured(), monkeypatch, [CounterSample(940.0, {"gpu/0000:00:06.0/pcie_replays": 0})])
    assert "nvlink_errors" not in unmade_checks(report)  # the PCIe H100: no NVLink, nothing unread


@pytest.mark.parametrize(("field", "kind"), [("replay", "pcie_replays"), ("clock_reasons", "gpu_clock_slowdown"),
                                             ("ecc_volatile_uncorrected", "ecc_uncorrected")])
def test_a_signal_nvml_refuses_is_unknown(tmp_path, monkeypatch, field, kind):
    report = report_of(tmp_path, dict(captured(), **{field: "ERR"}), monkeypatch,
                       [CounterSample(940.0, {"gpu/0000:00:06.0/pcie_replays": 0})])
    assert unmade_checks(report)[kind].startswith("gpu0: NVML did not report")
