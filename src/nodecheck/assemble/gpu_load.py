"""What a GPU did while its own tests ran, made readable: the summary of NVML's samples and clock event counters
(bench/gpu_load.py takes them) and the clause a slow GPU's verdict gains from it ("HW power brake slowdown held 40% of
the run; SM clock median 1410 MHz ..."). Pure: samples in, a summary out."""

from __future__ import annotations

import statistics

from nodecheck.report.gpu import HW_REASONS, SW_REASONS

REASONS = {**HW_REASONS, **SW_REASONS}


def summarize(samples: list[dict], before: dict[str, int] | None, after: dict[str, int] | None, seconds: float) -> dict:
    """One GPU's samples of its timed run ({"sm_mhz", "power_w", "temperature_c", "reasons": bitmask}, each may be
    None) and its clock event counters (ns) before and after the test: the clocks' median and lowest, power's
    median and highest, the hottest temperature, the share of samples each reason was active in, and the share of
    the timed run (`seconds`) each counted brake held (the counters' rise: a worker starting up does not brake)."""
    def values(key):
        return [s[key] for s in samples if isinstance(s.get(key), (int, float)) and not isinstance(s.get(key), bool)]

    out: dict = {"samples": len(samples), "seconds": round(seconds, 2)}
    clocks, power, temperature = values("sm_mhz"), values("power_w"), values("temperature_c")
    if clocks:
        out["sm_clock_mhz"] = {"median": statistics.median(clocks), "min": min(clocks)}
    if power:
        out["power_w"] = {"median": round(statistics.median(power), 1), "max": round(max(power), 1)}
    if temperature:
        out["temperature_c_max"] = max(temperature)
    masks = values("reasons")
    if masks:
        out["reasons_active"] = {name: round(sum(1 for m in masks if int(m) & bit) / len(masks), 3)
                                 for bit, name in REASONS.items() if any(int(m) & bit for m in masks)}
    if before and after and seconds > 0:
        held = {name: (after[name] - before[name]) / 1e9 / seconds for name in after if name in before}
        out["braked_share"] = {name: round(min(1.0, share), 3) for name, share in held.items() if share > 0}
    return out


def why_slow(load: dict | None) -> str:
    """What the load summary says of a slow GPU, as a clause ("HW power brake slowdown held 40% of the run; SM clock
    median 1410 MHz, lowest 1095; 698 W; 84 C at most"); "" where it says nothing. The summary may come from a saved
    Report: anything not of its shape is left out."""
    if not isinstance(load, dict):
        return ""
    parts = [f"{_brake_name(name)} held {share:.0%} of the run" for name, share in _shares(load.get("braked_share")) if share >= 0.01]
    if not parts:  # no counters: the bitmask's samples (the power cap is how a busy GPU runs, not a cause)
        parts = [f"{name} active in {share:.0%} of the samples" for name, share in _shares(load.get("reasons_active"))
                 if share >= 0.05 and name != "SW power cap"]
    clocks, power, hot = load.get("sm_clock_mhz"), load.get("power_w"), load.get("temperature_c_max")
    if isinstance(clocks, dict) and _number(clocks.get("median")):
        lowest = clocks.get("min") if _number(clocks.get("min")) else clocks["median"]
        parts.append(f"SM clock median {clocks['median']:.0f} MHz, lowest {lowest:.0f}")
    if isinstance(power, dict) and _number(power.get("median")):
        parts.append(f"{power['median']:.0f} W")
    if _number(hot):
        parts.append(f"{hot:.0f} C at most")
    return "; ".join(parts)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) < 1e12


def _shares(raw) -> list[tuple[str, float]]:
    """A {name: share} of the summary, numbers only, largest first."""
    if not isinstance(raw, dict):
        return []
    return sorted(((str(name)[:60], float(v)) for name, v in raw.items() if _number(v)), key=lambda kv: -kv[1])


def _brake_name(counter: str) -> str:
    """hw_power_brake_slowdown -> "HW power brake slowdown"."""
    return counter.replace("_", " ").replace("hw ", "HW ", 1).replace("sw ", "SW ", 1)
