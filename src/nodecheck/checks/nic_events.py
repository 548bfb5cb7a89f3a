"""A ConnectX NIC's own events in the kernel log (src/nodecheck/probes/kernel_log.py, kind "nic"): a port module error (its cable
or transceiver: high temperature, a bad or shorted cable, a module past the port's power budget ...) and its PCIe
slot short of power (the NIC then powers ports down). Warnings, as gpud records them (events, not a health verdict):
what they do to the rail its own checks judge (nic_down, nic_rail_down, ib_link_downed, symbol errors); these say
why, named in a slow all-reduce's verdict over that NIC (signal_join). Cleared with `nodecheck clear` once the
cable or slot is dealt with. Pure: reads the Report and the Config."""

from __future__ import annotations

from nodecheck.checks.signals import open_events, since_boot
from nodecheck.config import Config
from nodecheck.probes.kernel_log import NIC_MODULE_ERROR, NIC_SLOT_POWER
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

NIC_EVENT_NAMES = {NIC_MODULE_ERROR: "port module error", NIC_SLOT_POWER: "PCIe slot short of power"}
_WHAT_TO_DO = {
    "nic_module_error": ("its cable or transceiver faulted (mlx5 port module event); read the module's temperature and "
                         "alarms (`ethtool -m {nic}`), reseat or replace the cable or transceiver"),
    "nic_slot_power": ("the slot does not give the NIC the power it needs, and the NIC powers down ports it cannot "
                       "feed; check the riser and the server's PCIe slot power (its BMC), or move the NIC"),
}


def nic_events(report: Report, config: Config) -> list[Finding]:
    findings = []
    for kind in ("nic_module_error", "nic_slot_power"):
        for subject, events in sorted(open_events(report, config, kind).items()):
            last = events[-1]
            where = f" ({last.pci})" if last.pci and not subject.startswith("pci:") else ""
            name = NIC_EVENT_NAMES[last.code]
            todo = _WHAT_TO_DO[kind].format(nic=subject if not subject.startswith(("pci:", "nic?")) else "<netdev>")
            findings.append(Finding(kind, "warning", subject, last.message[:80], "none",
                                    f"{subject}{where} logged a {name} {since_boot(events)}, last: {last.message}: "
                                    f"{todo}; then `nodecheck clear {kind} --gpu {subject}`"))
    return findings
