"""Counter rates: the error counters of one run as a sample (what the state file keeps), each counter's rise since
the newest earlier sample at least [errors.limits] min_rate_interval_s old, and why a rate is unknown (a first
sample, a counter that went down). Every hop on a GPU's or NIC's PCIe path, once, with what is behind it. Pure:
reads the Report and the Config."""

from __future__ import annotations

from dataclasses import dataclass

from nodecheck.config import Config
from nodecheck.core.pci import Hop, normal_pci
from nodecheck.report.model import Report

AER_FAMILIES = ("correctable", "nonfatal", "fatal")
FIRST_SAMPLE = "unknown (first sample): a rate needs a previous run's counters"


@dataclass
class Change:
    """How much a counter rose since the previous sample, over how long; why not, when unknown."""

    delta: int | None
    seconds: float | None
    why: str | None = None

    def per(self, seconds: float) -> float:
        return self.delta / self.seconds * seconds


def device_hops(report: Report) -> dict[str, tuple[Hop, list[str]]]:
    """Every hop on a GPU's or NIC's path, once: its address -> (the hop, the GPUs and NICs behind it)."""
    names = {normal_pci(g.pci_bus_id): f"gpu{g.index}" for g in report.gpus}
    names.update({normal_pci(n.pci_address): n.name for n in report.nics if n.pci_address})
    out: dict[str, tuple[Hop, list[str]]] = {}
    for device, hops in report.hops().items():
        for hop in hops:
            behind = out.setdefault(normal_pci(hop.bdf) or hop.bdf, (hop, []))[1]
            if names.get(device) and names[device] not in behind:
                behind.append(names[device])
    return out


def counter_sample(report: Report) -> dict[str, int]:
    """This run's error counters by key (aer/ADDRESS/family, ib/DEVICE/PORT/name): what the state file keeps."""
    sample = {}
    for bdf, (hop, _) in device_hops(report).items():
        for family in AER_FAMILIES:
            if hop.aer and family in hop.aer:
                sample[f"aer/{bdf}/{family}"] = hop.aer[family]
    for nic in report.nics:
        for port in nic.ib_ports:
            sample.update({f"ib/{port.device}/{port.port}/{name}": v for name, v in port.counters.items() if v is not None})
        sample.update({f"net/{nic.name}/{name}": v for name, v in nic.counters.items() if v is not None})
    for gpu in report.gpus:
        signals, key = gpu.signals, f"gpu/{normal_pci(gpu.pci_bus_id)}"
        if signals is None:
            continue
        for name in ("pcie_replays", "clock_event_reasons"):
            if getattr(signals, name) is not None:
                sample[f"{key}/{name}"] = getattr(signals, name)
        sample.update({f"{key}/nvlink_{name}": value for name, value in (signals.nvlink_errors or {}).items()})
        sample.update({f"{key}/clock_{name}_ns": value for name, value in (signals.clock_event_ns or {}).items()})
    return sample


def previous_sample(report: Report, config: Config, key: str):
    """The newest earlier sample holding `key` at least [errors.limits] min_rate_interval_s old, or why none."""
    history = report.history
    if history is None or history.uptime_s is None:
        return None, "unknown: nodecheck's state (the previous sample) could not be read"
    least = max(config.errors.limit("min_rate_interval_s")[0], 1.0)  # never a rate over no time
    earlier = [s for s in history.samples if history.uptime_s - s.uptime_s >= least and key in s.counters]
    return (earlier[-1], None) if earlier else (None, FIRST_SAMPLE)


def change(report: Report, config: Config, key: str, now: int) -> Change:
    previous, why = previous_sample(report, config, key)
    if previous is None:
        return Change(None, None, why)
    delta = now - previous.counters[key]
    if delta < 0:
        return Change(None, None, "unknown: the counter went down since the previous sample (reset)")
    return Change(delta, report.history.uptime_s - previous.uptime_s)


def unknown_rates(report: Report, config: Config, prefixes) -> dict[str, str]:
    """Family prefix (aer/, ib/, gpu/) -> why the rates of those counters cannot be judged in this run; a family
    absent when they can (or when the node has none of them: nothing to judge)."""
    whys: dict[str, list] = {prefix: [] for prefix in prefixes}
    for key, value in counter_sample(report).items():
        family = whys.get(key.split("/", 1)[0] + "/")
        if family is not None:
            family.append(change(report, config, key, value).why)
    return {prefix: found[0] for prefix, found in whys.items() if found and None not in found}
