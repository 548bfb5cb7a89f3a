"""Error counters judged: PCIe AER on every GPU's and NIC's path (the pcie_paths hops), InfiniBand port
counters, an Ethernet NIC's link flaps and checksum errors. Pure: reads the Report and the Config.

A counter's rate needs two samples: this run's (counter_sample) and the newest earlier one at least
[errors.limits] min_rate_interval_s old (report.history, kept in the state file). Without one the check is
"unknown (first sample)", never healthy; a counter that went down (a reset) is unknown for that run. Every
limit comes from src/nodecheck/core/data/specs.toml [error_limits] (the PCIe one derived from the link: BER x lane rate x
60 s x width, as DCGM derives its replay watch) or the config's [errors.limits].
"""

from __future__ import annotations

from nodecheck.assemble.counters import Change, change, device_hops
from nodecheck.checks.base import Check, Kind
from nodecheck.config import Config
from nodecheck.core.pci import Hop
from nodecheck.core.specs import pcie_errors_per_minute, pcie_generation
from nodecheck.probes.ib_counters import TRANSPORT_COUNTERS, saturated
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

IB_ANY_INCREASE = ("excessive_buffer_overrun_errors", "local_link_integrity_errors")
IB_RATES = {"symbol_error": ("ib_symbol_error_per_s", 1), "link_error_recovery": ("ib_link_error_recovery_per_min", 60),
            "port_rcv_errors": ("ib_port_rcv_errors_per_s", 1), "port_xmit_discards": ("ib_port_xmit_discards_per_s", 1)}


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


def aer_unknown(report: Report) -> dict[str, str]:
    unknown = {}
    if report.pcie_paths and not any(hop.aer for hops in report.pcie_paths.values() for hop in hops):
        why = "no device on the GPUs' and NICs' PCIe paths has AER counters (aer_dev_*) to read"  # a VM's bridges, or pci=noaer
        unknown.update({PCIE_AER_FATAL.name: why, PCIE_LINK_ERRORS.name: why})
    return unknown


def ib_unknown(report: Report) -> dict[str, str]:
    """An active port none of whose error counters reads as a count ("N/A (no PMA)": no Performance Management
    Agent, or the files are missing) is unknown while the others read, not healthy."""
    for nic in report.nics:
        for port in nic.ib_ports:
            if port.state == "ACTIVE" and not any(value is not None for value in port.counters.values()):
                why = f"{port.device}/{port.port}: its error counters are unreadable (no count in counters/ or hw_counters/)"
                return {IB_LINK_DOWNED.name: why, IB_PORT_ERRORS.name: why}
    return {}


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
PCIE_AER_FATAL = Kind("pcie_aer_fatal", "fabric", "{subject} {measured}", signal=True, clearable=True,
    doc=(
        ("error",
         "a device on a GPU's or NIC's PCIe path (the device, a switch port, the root port) counted fatal AER errors since boot"
         " (`aer_dev_fatal`) that no `nodecheck clear pcie_aer_fatal` acknowledged: drain now; in a log given to `nodecheck "
         "kernel-log`, an uncorrected fatal AER line (\"PCIe Bus Error: severity=Uncorrected (Fatal)\") of a device the log "
         "ties to a GPU or ConnectX NIC (its driver is theirs, or one of theirs logged \"can't recover (no error_detected "
         "callback)\": NVIDIA's driver has no AER recovery, so the GPU stays lost), or such a GPU's line alone"),
        ("warning",
         "in a log given to `nodecheck kernel-log`, an uncorrected fatal AER line of a device the log ties to no GPU or NIC"),
    ))
PCIE_LINK_ERRORS = Kind("pcie_link_errors", "fabric", "{subject} {measured} > {expected}", signal=True, tempered=True,
    doc=(
        ("error (warning where the path's bandwidth test passed)",
         "since the previous sample, AER nonfatal errors rose on a hop of a GPU's or NIC's path, or its AER correctable errors "
         "ran faster than the link's limit (BER 1e-12 x lane rate x 60 s x width per minute, as DCGM derives its replay watch: "
         "gen4 x16 16/min, gen5 x16 31/min). Unknown (first sample) until a previous run's counters are in the state file"),
        ("warning",
         "in a log given to `nodecheck kernel-log`, an uncorrected non-fatal AER line (\"severity=Uncorrected (Non-Fatal)\"): "
         "errors the link recovered from"),
    ))
IB_LINK_DOWNED = Kind("ib_link_downed", "fabric", "{subject} {measured}", signal=True,
    doc=(
        ("error",
         "an InfiniBand port's `link_downed` rose since the previous sample: drain now"),
    ))
IB_PORT_ERRORS = Kind("ib_port_errors", "fabric", "{subject} {measured}", signal=True, tempered=True,
    doc=(
        ("error (warning where the path's bandwidth test passed)",
         "an InfiniBand port's `excessive_buffer_overrun_errors` or `local_link_integrity_errors` rose, or `symbol_error` (> "
         "10/s), `link_error_recovery` (> 5/min), `port_rcv_errors` (> 10/s), `port_xmit_discards` (> 100/s) ran above its "
         "limit (specs.toml `[error_limits]`, config `[errors.limits]`)"),
    ))
IB_COUNTER_SATURATED = Kind("ib_counter_saturated", "fabric", "{subject} {measured} saturated",
    doc=(
        ("warning",
         "an InfiniBand error counter sits at its width's maximum (the 8-bit `link_downed` at 255): it can no longer show "
         "increases until the port's counters are reset"),
    ))
RDMA_RETRANSMITS = Kind("rdma_retransmits", "fabric", "{subject} retransmits: {measured}", signal=True,
    doc=(
        ("warning",
         "an RDMA port's transport retransmission counters (`hw_counters/`: `local_ack_timeout_err`, `packet_seq_err`, "
         "`out_of_sequence`, `req_transport_retries_exceeded`) rose since the previous sample: packets lost between the port "
         "and its peers (on RoCE a fabric that is not lossless: PFC, ECN), or a peer that stopped answering. Never a drain by "
         "itself; a collective across nodes below its threshold names it"),
    ))
NIC_LINK_ERRORS = Kind("nic_link_errors", "fabric", "{subject} {measured}", signal=True, tempered=True,
    doc=(
        ("error, warning",
         "a physical Ethernet NIC (a RoCE rail, the socket NIC of gloo and NCCL's bootstrap) whose carrier went down since the "
         "previous sample (`carrier_down_count`, else `carrier_changes`: a warning, a flap or a link set down by hand), or "
         "whose `statistics/rx_crc_errors` rose faster than `[error_limits] nic_rx_crc_errors_per_s` (10/s: an error; a warning"
         " where the path's last bandwidth test passed). InfiniBand netdevs are judged by their ports' counters"),
    ))

AER = Check((PCIE_AER_FATAL, PCIE_LINK_ERRORS), aer_findings, needs="pcie_paths", unknown=aer_unknown,
            rates=(("aer/", (PCIE_LINK_ERRORS,)),))
IB = Check((IB_LINK_DOWNED, IB_PORT_ERRORS, IB_COUNTER_SATURATED, RDMA_RETRANSMITS), ib_findings, needs="nics",
           unknown=ib_unknown, rates=(("ib/", (IB_LINK_DOWNED, IB_PORT_ERRORS, RDMA_RETRANSMITS)),))
NETDEV = Check((NIC_LINK_ERRORS,), netdev_findings, needs="nics", rates=(("net/", (NIC_LINK_ERRORS,)),))
