"""A ConnectX NIC's own events in the kernel log (src/nodecheck/probes/kernel_log.py, kind "nic"): a port module error (its cable
or transceiver: high temperature, a bad or shorted cable, a module past the port's power budget ...) and its PCIe
slot short of power (the NIC then powers ports down). Warnings, as gpud records them (events, not a health verdict):
what they do to the rail its own checks judge (nic_down, nic_rail_down, ib_link_downed, symbol errors); these say
why, named in a slow all-reduce's verdict over that NIC (signal_join). Cleared with `nodecheck clear` once the
cable or slot is dealt with. Pure: reads the Report and the Config."""

from __future__ import annotations

from nodecheck.assemble.open_events import NIC_EVENT_NAMES
from nodecheck.checks.base import Check, Kind
from nodecheck.checks.signals import log_unread, open_events, since_boot
from nodecheck.config import Config
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

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


# the finding kinds this family raises, and its checks (checks/__init__.py lists them in order)
NIC_MODULE_ERROR_KIND = Kind("nic_module_error", "fabric", "{subject} cable or transceiver: {measured}", signal=True, clearable=True,
    doc=(
        ("warning",
         "a ConnectX NIC logged a port module error since boot (mlx5_core: \"Port module event[error]: module 0, Cable error, "
         "High Temperature\"; Bad or shorted cable/module, Power budget exceeded ...): its cable or transceiver faulted. "
         "Subject the NIC's netdev (its PCI function's), else `pci:ADDRESS`; `measured` the last event (\"module 0: High "
         "Temperature\"). A warning, as gpud records these events: the rail's own checks judge what it did to the link; named "
         "in a slow all-reduce's verdict over that NIC; `nodecheck clear nic_module_error --gpu NETDEV` after the repair; alert"
         " `NodecheckNicModuleError` (warning)"),
    ))
NIC_SLOT_POWER_KIND = Kind("nic_slot_power", "fabric", "{subject} {measured}", signal=True, clearable=True,
    doc=(
        ("warning",
         "a ConnectX NIC logged \"Detected insufficient power on the PCIe slot (27W)\" since boot: it powers down ports it "
         "cannot feed. Subject and clearing as `nic_module_error`"),
    ))

CHECK = Check((NIC_MODULE_ERROR_KIND, NIC_SLOT_POWER_KIND), nic_events, needs="kernel_log",
              unknown=lambda report: log_unread(report, NIC_MODULE_ERROR_KIND, NIC_SLOT_POWER_KIND))
