"""What each GPU did while its own tests ran: NVML sampled beside the workers (SM clock, power, temperature, the clock
event reasons bitmask), and its clock event counters read before and after, so a verdict can say why a GPU is slow
("HW power brake 40% of the run"). The counters keep every nanosecond a brake held; the samples say what the clocks
and the power were. Nothing here is a verdict: verdicts/bandwidth.py joins the summary to them.

LoadSampler(indices): a thread asking NVML every SAMPLE_S while the tests run; summary(index, window): what
summarize() (assemble/gpu_load.py) makes of that GPU's samples inside its worker's timed run. NVML absent or
refusing: the summary says why, and the verdicts say nothing more."""

from __future__ import annotations

import contextlib
import threading
import time

from nodecheck.assemble.gpu_load import summarize
from nodecheck.probes.nvml_clock_events import dump_clock_events, parse_clock_events

SAMPLE_S = 0.25
MAX_SAMPLES = 20_000  # a 30 s burn is 120 samples a GPU; a sampler left running stops keeping them here


class LoadSampler:
    """with LoadSampler([0, 1, ...]) as sampler: ... ; sampler.summary(index, window) -> summarize(...) or {"error"}."""

    def __init__(self, indices: list[int], interval: float = SAMPLE_S):
        self.indices, self.interval = list(indices), interval
        self.samples: dict[int, list[dict]] = {i: [] for i in self.indices}
        self.before: dict[int, dict | None] = {}
        self.after: dict[int, dict | None] = {}
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: dict = {}
        self._pynvml = None
        self._started = self._ended = 0.0

    def __enter__(self) -> LoadSampler:
        if not self.indices:
            self.error = "no GPU to sample"
            return self
        try:
            import pynvml
        except ImportError:
            self.error = "NVML not sampled: nvidia-ml-py (pynvml) is not installed"
            return self
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:  # no driver here: the tests run, the summary says why
            self.error = f"NVML not sampled: {str(error)[:200] or type(error).__name__}"
            return self
        try:
            self._handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices}
        except pynvml.NVMLError as error:  # a GPU NVML cannot open: its own probe says more
            self.error = f"NVML not sampled: {str(error)[:200] or type(error).__name__}"
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            return self
        self._pynvml = pynvml
        self.before = {i: self._counters(i) for i in self.indices}
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="nodecheck-gpu-load", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._ended = time.monotonic()
        if self._pynvml is not None:
            self.after = {i: self._counters(i) for i in self.indices}
            with contextlib.suppress(self._pynvml.NVMLError):  # shutting down says nothing the samples need
                self._pynvml.nvmlShutdown()

    def summary(self, index: int, window: tuple[float, float] | None = None) -> dict:
        """What GPU `index` did; `window` (wall-clock seconds, the worker's timed run): only the samples inside it,
        and the brakes' share of it. Without one, the whole time sampled."""
        if self.error is not None:
            return {"error": self.error}
        samples = self.samples.get(index, [])
        if window is not None and window[1] > window[0]:
            samples = [s for s in samples if window[0] <= s["at"] <= window[1]]
            seconds = window[1] - window[0]
        else:
            seconds = self._ended - self._started
        return summarize(samples, self.before.get(index), self.after.get(index), seconds)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for index, handle in self._handles.items():
                if len(self.samples[index]) < MAX_SAMPLES:
                    self.samples[index].append(self._sample(handle))

    def _sample(self, handle) -> dict:
        pynvml = self._pynvml

        def ask(fn, *args):
            try:
                return fn(handle, *args)
            except pynvml.NVMLError:  # one refused reading is a gap in the samples, not a failed test
                return None
        power = ask(pynvml.nvmlDeviceGetPowerUsage)
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return {"at": time.time(), "sm_mhz": ask(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM),
                "power_w": power / 1000 if isinstance(power, (int, float)) else None,
                "temperature_c": ask(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
                "reasons": ask(reasons)}

    def _counters(self, index: int) -> dict[str, int] | None:
        raw = dump_clock_events(self._pynvml, self._handles[index], lambda code: f"NVML error {code}")
        return parse_clock_events(raw, {})
