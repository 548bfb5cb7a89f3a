"""Error counters judged: PCIe AER on every GPU's and NIC's path (the pcie_paths hops), InfiniBand port
counters, an Ethernet NIC's link flaps and checksum errors. Pure: reads the Report and the Config.

A counter's rate needs two samples: this run's (counter_sample) and the newest earlier one at least
[errors.limits] min_rate_interval_s old (report.history, kept in the state file). Without one the check is
"unknown (first sample)", never healthy; a counter that went down (a reset) is unknown for that run. Every
limit comes from src/nodecheck/core/data/specs.toml [error_limits] (the PCIe one derived from the link: BER x lane rate x
60 s x width, as DCGM derives its replay watch) or the config's [errors.limits].
"""

from __future__ import annotations

from dataclasses import dataclass

from nodecheck.config import Config
from nodecheck.core.pci import Hop, normal_pci
from nodecheck.core.specs import pcie_errors_per_minute, pcie_generation
from nodecheck.probes.ib_counters import TRANSPORT_COUNTERS, saturated
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

AER_FAMILIES = ("correctable", "nonfatal", "fatal")
IB_ANY_INCREASE = ("excessive_buffer_overrun_errors", "local_link_integrity_errors")
IB_RATES = {"symbol_error": ("ib_symbol_error_per_s", 1), "link_error_recovery": ("ib_link_error_recovery_per_min", 60),
            "port_rcv_errors": ("ib_port_rcv_errors_per_s", 1), "port_xmit_discards": ("ib_port_xmit_discards_per_s", 1)}
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


def aer_findings(report: Report, config: Config) -> list[Finding]:
    """Fatal AER on a path is an error (drain now); nonfatal AER rising, or correctable AER faster than the
    link's derived limit, is pcie_link_errors (an error, a warning where the path measured fine: verdicts)."""
    acks = report.history.acknowledgements if report.history else []
    findings = []
    for bdf, (hop, behind) in sorted(device_hops(report).items()):
        aer = hop.aer or {}
        subject, where = f"pci:{bdf}", _behind(bdf, behind)
        fatal = aer.get("fatal") or 0
        cleared = max([a.count for a in acks if a.kind == "pcie_aer_fatal" and a.subject in (None, subject)], default=0)
        if fatal > cleared:
            kinds = ", ".join(k.split(".", 1)[1] for k in aer if k.startswith("fatal.")) or "see aer_dev_fatal"
            findings.append(Finding("pcie_aer_fatal", "error", subject, f"AER fatal {fatal}", "none",
                                    f"{subject}{where} logged {fatal} fatal PCIe error(s) since boot ({kinds}): the link or device "
                                    f"failed; reseat or replace it, then `nodecheck clear pcie_aer_fatal --gpu {bdf}`"))
        findings += _aer_rates(report, config, bdf, hop, subject, where)
    return findings


def _aer_rates(report: Report, config: Config, bdf: str, hop: Hop, subject: str, where: str) -> list[Finding]:
    aer, findings = hop.aer or {}, []
    if "nonfatal" in aer:
        rise = change(report, config, f"aer/{bdf}/nonfatal", aer["nonfatal"])
        if rise.delta:
            findings.append(Finding("pcie_link_errors", "error", subject, f"AER nonfatal +{rise.delta}", "no increase",
                                    f"{subject}{where}: AER nonfatal +{rise.delta} in {rise.seconds:.0f} s: uncorrectable "
                                    "errors the link recovered from; check the card's seating and the riser"))
    gen = pcie_generation(hop.speed_max or hop.speed)
    limit = pcie_errors_per_minute(gen, hop.width)
    if "correctable" in aer and limit:
        rise = change(report, config, f"aer/{bdf}/correctable", aer["correctable"])
        if rise.delta is not None and rise.per(60) > limit[0]:
            link = f"gen{gen} x{hop.width}"
            findings.append(Finding("pcie_link_errors", "error", subject, f"AER correctable {rise.per(60):.0f}/min",
                                    f"<= {limit[0]:g}/min",
                                    f"{subject}{where}: AER correctable +{rise.delta} in {rise.seconds:.0f} s "
                                    f"({rise.per(60):.0f}/min, limit {limit[0]:g}/min for {link}: {limit[1]}); a marginal "
                                    "link retrying its packets: reseat, check the riser and the slot"))
    return findings


def _behind(bdf: str, behind: list[str]) -> str:
    return f" ({', '.join(behind)})" if behind and behind != [bdf] else ""


def ib_findings(report: Report, config: Config) -> list[Finding]:
    """Per InfiniBand port: link_downed rising (drain now), buffer overruns or link integrity errors rising,
    a rate above its limit; a counter saturated at its width is named (it can no longer show increases)."""
    findings, seen = [], set()
    for nic in report.nics:
        for port in nic.ib_ports:
            subject = f"{port.device}/{port.port}"
            if subject in seen or not port.counters:
                continue
            seen.add(subject)
            findings += _ib_port(report, config, subject, nic.name, port.counters)
    return findings


def _ib_port(report: Report, config: Config, subject: str, netdev: str, counters: dict) -> list[Finding]:
    findings, resent = [], []
    stuck = sorted(name for name, value in counters.items() if saturated(name, value))
    if stuck:
        findings.append(Finding("ib_counter_saturated", "warning", subject, ", ".join(stuck), "below its maximum",
                                f"{subject} ({netdev}): {', '.join(f'{n}={counters[n]}' for n in stuck)} at the counter's maximum: "
                                "it can no longer show increases; reset the port counters (`perfquery -x -R`) so errors show again"))
    for name, value in sorted(counters.items()):
        if value is None or name in stuck:
            continue
        rise = change(report, config, f"ib/{subject}/{name}", value)
        if rise.delta is None or not rise.delta:
            continue
        if name in TRANSPORT_COUNTERS:
            resent.append((name, rise))
        elif name == "link_downed":
            findings.append(Finding("ib_link_downed", "error", subject, f"link_downed +{rise.delta}", "no increase",
                                    f"{subject} ({netdev}): the link went down {rise.delta} time(s) in {rise.seconds:.0f} s: "
                                    "check the cable, the transceiver and the switch port"))
        elif name in IB_ANY_INCREASE:
            findings.append(Finding("ib_port_errors", "error", subject, f"{name} +{rise.delta}", "no increase",
                                    f"{subject} ({netdev}): {name} +{rise.delta} in {rise.seconds:.0f} s: check the cable and the "
                                    "switch port"))
        elif name in IB_RATES:
            limit_name, per = IB_RATES[name]
            limit, source = config.errors.limit(limit_name)
            unit = "min" if per == 60 else "s"
            if rise.per(per) > limit:
                findings.append(Finding("ib_port_errors", "error", subject, f"{name} {rise.per(per):.1f}/{unit}", f"<= {limit:g}/{unit}",
                                        f"{subject} ({netdev}): {name} +{rise.delta} in {rise.seconds:.0f} s "
                                        f"({rise.per(per):.1f}/{unit}, limit {limit:g}/{unit}: {source}); check the cable, "
                                        "the transceiver and the switch port"))
    return findings + _retransmits(subject, netdev, resent)


def _retransmits(subject: str, netdev: str, resent: list[tuple[str, Change]]) -> list[Finding]:
    """Transport retransmissions rising on a port: a warning, never a drain by itself. A peer that stopped
    answering (a node that crashed mid-job) raises them on a healthy node too; on the path of a collective
    across nodes that measured low, the verdict names them (src/nodecheck/verdicts/signal_join.py)."""
    if not resent:
        return []
    seconds = max(rise.seconds for _, rise in resent)
    named = ", ".join(f"{name} +{rise.delta}" for name, rise in resent)
    what = "; ".join(TRANSPORT_COUNTERS[name] for name, _ in resent)
    return [Finding("rdma_retransmits", "warning", subject, named, "no increase",
                    f"{subject} ({netdev}): {named} in {seconds:.0f} s: {what}. Packets are lost between this port and "
                    "its peers, or a peer stopped answering; each costs a collective across nodes a resend. On RoCE "
                    "check that the fabric is lossless (PFC on the traffic class NCCL uses, ECN); on InfiniBand the "
                    "error counters of both ends of the link and of the switch (`ibqueryerrors`)")]


def netdev_findings(report: Report, config: Config) -> list[Finding]:
    """Per physical Ethernet NIC (RoCE rails and the socket NIC of gloo and NCCL's bootstrap): its carrier going
    down since the previous sample is a warning (a cable, optic or switch port flapping, or someone setting the link
    down: a job across nodes loses its connections either way); frames failing their checksum faster than the limit
    an error (a bad cable or optic, as InfiniBand's symbol errors), a warning where the path measured fine
    (src/nodecheck/verdicts/signal_join.py). InfiniBand netdevs are left to their ports' own counters."""
    return [f for nic in report.nics if nic.kind == "ethernet" and not nic.virtual and nic.counters
            for f in (*_carrier_drops(report, config, nic), *_crc_errors(report, config, nic))]


def _carrier_drops(report: Report, config: Config, nic) -> list[Finding]:
    name = "carrier_down_count" if nic.counters.get("carrier_down_count") is not None else "carrier_changes"
    if nic.counters.get(name) is None:
        return []
    drops = change(report, config, f"net/{nic.name}/{name}", nic.counters[name])
    if not drops.delta:
        return []
    times = f"{drops.delta} time(s)" if name == "carrier_down_count" else f"{drops.delta} carrier change(s) (a down and an up each)"
    return [Finding("nic_link_errors", "warning", nic.name, f"{name} +{drops.delta}", "no increase",
                    f"{nic.name}: its link went down {times} in {drops.seconds:.0f} s (now {nic.state or 'unknown'}): a "
                    "cable, optic or switch port flapping, or the link set down by hand; a job across nodes loses its "
                    "connections. Check `ip -s link show`, the switch port and the optic")]


def _crc_errors(report: Report, config: Config, nic) -> list[Finding]:
    if nic.counters.get("rx_crc_errors") is None:
        return []
    rise = change(report, config, f"net/{nic.name}/rx_crc_errors", nic.counters["rx_crc_errors"])
    limit, source = config.errors.limit("nic_rx_crc_errors_per_s")
    if not rise.delta or rise.per(1) <= limit:
        return []
    return [Finding("nic_link_errors", "error", nic.name, f"rx_crc_errors {rise.per(1):.1f}/s", f"<= {limit:g}/s",
                    f"{nic.name}: rx_crc_errors +{rise.delta} in {rise.seconds:.0f} s ({rise.per(1):.1f}/s, limit "
                    f"{limit:g}/s: {source}): frames arrive damaged; check the cable, the optic and the switch port")]
