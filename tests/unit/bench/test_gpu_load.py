"""What a GPU did while its own tests ran (src/nodecheck/bench/gpu_load.py samples NVML, src/nodecheck/assemble/gpu_load.py
summarizes), and the clause a slow GPU's verdict gains from it. NVML cannot run here: the sampler is driven by a
stand-in pynvml that answers as the H100 capture's NVML does (SM clock up to 1980 MHz, a 700 W limit, `nvidia-smi -q`
in ../shared/captures/h100-pcie-vm), one GPU braking on its power: the HW power brake counter rising all the run
and its clocks at half."""

import dataclasses
import sys
import time
import types

import pytest

from nodecheck.assemble.gpu_load import summarize, why_slow
from nodecheck.bench.gpu_load import LoadSampler

NS = 1_000_000_000


class FakeNvml(types.ModuleType):
    """pynvml as far as the sampler asks it: two GPUs, gpu1 braked by its power supply."""

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN, NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN = 200, 201
    NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN = 202

    class NVMLError(Exception):
        pass

    def __init__(self, refuse_init: bool = False):
        super().__init__("pynvml")
        self.refuse_init, self.shut, self.asked = refuse_init, False, {}

    def nvmlInit(self):
        if self.refuse_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1980 if handle == 0 else 990

    def nvmlDeviceGetPowerUsage(self, handle):
        return 699_000 if handle == 0 else 455_000  # mW

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 71 if handle == 0 else 64

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        if handle == 0:
            return 0x4  # at its power cap: how a busy GPU runs, no fault
        raise self.NVMLError("Unknown Error")  # one refused reading: a gap, not a failure

    def nvmlDeviceGetFieldValues(self, handle, ids):
        self.asked[handle] = self.asked.get(handle, 0) + 1
        braked = 10 * NS if handle == 1 and self.asked[handle] > 1 else 0  # before: 0; after: 10 s of brake
        values = {200: 0, 201: braked, 202: 0}

        def value(field_id):
            return types.SimpleNamespace(nvmlReturn=0, valueType=3, value=types.SimpleNamespace(ullVal=values[field_id]))
        return [value(field_id) for field_id in ids]


def test_the_sampler_reads_each_gpu_while_the_tests_run(monkeypatch):
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with LoadSampler([0, 1], interval=0.05) as sampler:
        started, deadline = time.time(), time.monotonic() + 60
        while len(sampler.samples[0]) < 3 and time.monotonic() < deadline:  # three readings, however slow the machine
            time.sleep(0.05)
        ended = time.time()
    assert nvml.shut
    healthy, braked = sampler.summary(0, (started, ended)), sampler.summary(1, (started, ended))
    assert healthy["samples"] >= 3 and healthy["sm_clock_mhz"] == {"median": 1980, "min": 1980}
    assert healthy["power_w"] == {"median": 699.0, "max": 699.0} and healthy["temperature_c_max"] == 71
    assert healthy["reasons_active"] == {"SW power cap": 1.0} and healthy["braked_share"] == {}  # read: no brake
    assert braked["braked_share"]["hw_power_brake_slowdown"] == 1.0  # 10 s of brake in a shorter run: all of it
    assert "reasons_active" not in braked  # every bitmask reading refused
    assert why_slow(healthy) == "SM clock median 1980 MHz, lowest 1980; 699 W; 71 C at most"  # the power cap: not a cause
    assert why_slow(braked).startswith("HW power brake slowdown held 100% of the run; SM clock median 990 MHz")


@pytest.mark.parametrize(("nvml", "said"), [(FakeNvml(refuse_init=True), "NVML not sampled: Driver Not Loaded"),
                                            (None, "NVML not sampled: nvidia-ml-py (pynvml) is not installed")])
def test_without_nvml_the_summary_says_why_and_the_verdict_says_no_more(monkeypatch, nvml, said):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # None: an import that fails
    with LoadSampler([0]) as sampler:
        pass
    assert sampler.summary(0) == {"error": said} and why_slow(sampler.summary(0)) == ""


def test_a_run_braked_for_part_of_it_reads_as_that_share():
    """The counters' rise over the timed run, whatever the samples caught: 0.8 s of HW power brake in 2 s."""
    samples = [{"sm_mhz": 1980, "power_w": 700.0, "temperature_c": 80, "reasons": 0x0}] * 5 + \
              [{"sm_mhz": 990, "power_w": 460.0, "temperature_c": 81, "reasons": 0x80}] * 3
    load = summarize(samples, {"hw_power_brake_slowdown": 5 * NS, "hw_thermal_slowdown": 0},
                     {"hw_power_brake_slowdown": 5 * NS + 8 * NS // 10, "hw_thermal_slowdown": 0}, 2.0)
    assert load["braked_share"] == {"hw_power_brake_slowdown": 0.4}
    assert load["reasons_active"] == {"HW power brake slowdown": 0.375}
    assert load["sm_clock_mhz"] == {"median": 1980.0, "min": 990}
    assert why_slow(load) == "HW power brake slowdown held 40% of the run; SM clock median 1980 MHz, lowest 990; 700 W; 81 C at most"
    no_counters = summarize(samples, None, None, 2.0)
    assert why_slow(no_counters).startswith("HW power brake slowdown active in 38% of the samples")


@pytest.mark.parametrize("garbage", [None, "hot", {"braked_share": {"x": "y"}, "sm_clock_mhz": []}, {"power_w": {"median": None}}])
def test_a_summary_that_is_not_one_adds_nothing(garbage):
    assert why_slow(garbage) == ""


def test_a_slow_gpus_finding_says_what_braked_it(monkeypatch):
    from nodecheck.config import Config
    from nodecheck.report.model import Measurement
    from nodecheck.verdicts.bandwidth import measurement_findings

    load = summarize([{"sm_mhz": 990, "power_w": 460.0, "temperature_c": 81, "reasons": 0x80}] * 4,
                     {"hw_power_brake_slowdown": 0}, {"hw_power_brake_slowdown": 8 * NS // 10}, 2.0)
    slow = Measurement.computed("gpu3:compute", "gemm", 500e12, 989.4e12, 1, "BF16 matrix multiplies", "bf16 dense",
                                {"path_kind": "compute", "load": load})
    (finding,) = measurement_findings([slow], Config())
    assert "while it ran: HW power brake slowdown held 40% of the run; SM clock median 990 MHz" in finding.message
    unsampled = dataclasses.replace(slow, details={"path_kind": "compute", "load": {"error": "NVML not sampled: x"}})
    assert "nvidia-smi -q -d PERFORMANCE,CLOCK" in measurement_findings([unsampled], Config())[0].message
