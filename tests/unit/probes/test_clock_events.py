"""How long a GPU's clocks were slowed between two samples: NVML's clock event counters (ns since the driver loaded),
read by the real dump_nvml through the pynvml stand-in (which replays the H100 node's captured "Clocks Event Reasons
Counters": 0 each) and judged by the real rules. The reasons bitmask alone sees what slows the clocks at the instant
it is read: a GPU that braked for half a minute between two samples, and not at either, passed."""

import sys

import pytest
from fakes import fake_pynvml
from helpers import captured, report_of

from nodecheck.assemble.counters import counter_sample
from nodecheck.checks import unmade_checks
from nodecheck.checks.gpu_errors import gpu_findings
from nodecheck.config import Config, ErrorSettings
from nodecheck.probes.nvml import dump_nvml
from nodecheck.probes.nvml_clock_events import CLOCK_EVENT_COUNTERS
from nodecheck.report.events import CounterSample

KEY = "gpu/0000:00:06.0/clock_"
QUIET = dict.fromkeys(CLOCK_EVENT_COUNTERS, 0)
S = 1_000_000_000  # ns


def earlier(counters: dict, reasons: int = 0, at: float = 940.0) -> CounterSample:
    """A sample 60 s before the report's (uptime 1000 s) holding these clock event counters (ns) and reasons."""
    return CounterSample(at, {f"{KEY}{name}_ns": value for name, value in counters.items()}
                         | {"gpu/0000:00:06.0/clock_event_reasons": reasons})


def judged(tmp_path, monkeypatch, now: dict, before: dict | None = None, reasons: int = 0, config=None):
    gpu = dict(captured(), clock_event_ns=now, clock_reasons=reasons)
    report = report_of(tmp_path, gpu, monkeypatch, [earlier(before if before is not None else QUIET)])
    return report, gpu_findings(report, config or Config())


def test_the_h100_capture_reads_three_quiet_counters_and_keeps_them(tmp_path, monkeypatch):
    report, findings = judged(tmp_path, monkeypatch, QUIET)
    assert report.gpus[0].signals.clock_event_ns == QUIET and findings == []
    assert {k: v for k, v in counter_sample(report).items() if k.endswith("_ns")} == {
        f"{KEY}{name}_ns": 0 for name in CLOCK_EVENT_COUNTERS}
    assert "gpu_clock_slowdown" not in unmade_checks(report)


def test_a_brake_between_two_samples_is_seen_though_neither_sample_caught_it(tmp_path, monkeypatch):
    """30 s of HW thermal slowdown in 60 s, the bitmask clear at both samples: an error (50% >= 5%)."""
    _, (finding,) = judged(tmp_path, monkeypatch, QUIET | {"hw_thermal_slowdown": 30 * S})
    assert (finding.kind, finding.severity, finding.subject, finding.measured) == (
        "gpu_clock_slowdown", "error", "gpu0", "HW thermal slowdown")
    assert "HW thermal slowdown 30.0 s of the last 60 s (50%)" in finding.message
    assert "hardware brakes" in finding.message


@pytest.mark.parametrize(("now", "severity"), [
    ({"hw_power_brake_slowdown": S}, "warning"),  # 1 s of 60: under 5%
    ({"hw_power_brake_slowdown": 3 * S}, "error"),  # 3 s of 60: 5%
    ({"sw_thermal_slowdown": 40 * S}, "warning"),  # the driver's own slowdown: never more than a warning
    ({}, None),
])
def test_brake_time_against_the_share_of_the_interval(tmp_path, monkeypatch, now, severity):
    _, findings = judged(tmp_path, monkeypatch, QUIET | now)
    assert [f.severity for f in findings] == ([severity] if severity else [])


def test_the_limit_is_the_configs(tmp_path, monkeypatch):
    config = Config(errors=ErrorSettings(limits={"clock_hw_brake_fraction": 0.01}))
    _, (finding,) = judged(tmp_path, monkeypatch, QUIET | {"hw_power_brake_slowdown": S}, config=config)
    assert finding.severity == "error" and "an error from 1% of the time" in finding.message


def test_the_counters_overrule_two_lucky_samples(tmp_path, monkeypatch):
    """HW thermal slowdown set at both samples (the bitmask's "sustained": an error), yet the counter says it held 1 s
    of the 60: a warning, the one finding; HW slowdown (0x8), which goes with it, is not named twice."""
    _, (finding,) = judged(tmp_path, monkeypatch, QUIET | {"hw_thermal_slowdown": S}, reasons=0x48)
    assert finding.severity == "warning" and finding.measured == "HW thermal slowdown"


def test_a_hw_slowdown_the_counters_do_not_time_is_judged_by_the_bitmask(tmp_path, monkeypatch):
    """0x8 alone (a power supply's fast trigger, no thermal or brake counter rising): seen now, a warning."""
    _, (finding,) = judged(tmp_path, monkeypatch, QUIET, reasons=0x8)
    assert (finding.severity, finding.measured) == ("warning", "HW slowdown")


@pytest.mark.parametrize("now", [
    QUIET | {"hw_thermal_slowdown": 600 * S},  # 600 s of brake in 60 s: not this nodecheck's unit, or a reset
    QUIET,  # below the earlier sample's 5 s: the driver reloaded
])
def test_counters_that_cannot_be_right_fall_back_to_the_bitmask(tmp_path, monkeypatch, now):
    _, findings = judged(tmp_path, monkeypatch, now, before=QUIET | {"hw_thermal_slowdown": 5 * S}, reasons=0x48)
    assert [(f.severity, f.measured) for f in findings] == [("warning", "HW slowdown, HW thermal slowdown")]


def test_a_driver_without_the_counters_is_judged_by_the_bitmask_as_before(tmp_path, monkeypatch):
    gpu = dict(captured(), clock_event_ns="ERR", clock_reasons=0x48)
    report = report_of(tmp_path, gpu, monkeypatch, [earlier({}, reasons=0x40)])
    (finding,) = gpu_findings(report, Config())
    assert report.gpus[0].signals.clock_event_ns is None and finding.severity == "error"  # held at both samples
    assert "clock_events" in dump_and_parse_errors(monkeypatch, gpu)


def dump_and_parse_errors(monkeypatch, gpu) -> dict:
    from nodecheck.probes.nvml import parse_nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying([gpu]))
    return parse_nvml(dump_nvml()).gpus[0].errors


def test_inspect_says_how_long_each_gpu_was_slowed_since_the_driver_loaded(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from nodecheck.render.report import render

    report, _ = judged(tmp_path, monkeypatch, QUIET | {"hw_power_brake_slowdown": 90 * S, "sw_thermal_slowdown": 2 * S})
    out = io.StringIO()
    render(report, Console(width=200, file=out, force_terminal=False, color_system=None))
    assert ("Clocks slowed since the driver loaded: gpu0 HW power brake slowdown 1.5 min (9.0% of the 16.7 min since boot); "
            "gpu0 SW thermal slowdown 2.0 s (0.2% of the 16.7 min since boot)") in out.getvalue()
    quiet, _ = judged(tmp_path, monkeypatch, QUIET)
    out = io.StringIO()
    render(quiet, Console(width=200, file=out, force_terminal=False, color_system=None))
    assert "Clocks slowed" not in out.getvalue()


def test_a_counter_of_another_name_is_not_judged(tmp_path, monkeypatch):
    """A Report read from a file may carry any names: one nodecheck does not time is passed over, never a KeyError."""
    import dataclasses

    report, _ = judged(tmp_path, monkeypatch, QUIET)
    (gpu,) = report.gpus
    odd = dataclasses.replace(gpu, signals=dataclasses.replace(gpu.signals, clock_event_ns={"bogus": 10**12}))
    report = dataclasses.replace(report, gpus=[odd])
    report.history.samples.append(CounterSample(950.0, {f"{KEY}bogus_ns": 0}))
    assert gpu_findings(report, Config()) == []
