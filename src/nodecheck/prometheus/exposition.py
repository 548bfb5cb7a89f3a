"""The Report as Prometheus metrics: one custom collector that builds fresh metric families from the
latest Report at each collect (no global gauges keeping stale label sets), and the node_exporter
textfile form of the same metrics. Names follow Prometheus conventions (nodecheck_ prefix, base
units, _ratio, _info); the GPU join labels are spelled as dcgm-exporter spells them (gpu, UUID,
pci_bus_id, device) so joins work. dcgm's `modelName` is published as `model_name`: promtool's lint
rejects camelCase label names, and the model is not a join key. No hostname label: Prometheus adds
`instance`."""

from __future__ import annotations

from collections import Counter
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from nodecheck import __version__
from nodecheck.checks import FINDING_KINDS, unmade_checks
from nodecheck.config import DEFAULT_VIRTUAL_NICS
from nodecheck.core.pci import normal_pci
from nodecheck.probes.kernel_log import NIC_MODULE_ERROR, NIC_SLOT_POWER
from nodecheck.report.findings import SEVERITIES
from nodecheck.report.model import Report

TEXTFILE_NAME = "nodecheck.prom"
_NIC_EVENT_LABELS = {NIC_MODULE_ERROR: "module_error", NIC_SLOT_POWER: "slot_power"}  # a ConnectX NIC's kernel events


def _gauge(name: str, doc: str, labels: list[str], rows) -> GaugeMetricFamily:
    """One family; a label set given twice is published once, the first time (two findings of one kind on one
    subject, two rates of one InfiniBand port: a second series with the same labels makes node_exporter's textfile
    collector refuse it and Prometheus drop the sample)."""
    family, seen = GaugeMetricFamily(name, doc, labels=labels), set()
    for values, value in rows:
        key = tuple(str(v) if v is not None else "" for v in values)
        if value is not None and key not in seen:
            seen.add(key)
            family.add_metric(list(key), float(value))
    return family


class ReportCollector:
    """collect() reads `latest()` once and yields families for it; it never raises on a partial Report.
    virtual_nics: name patterns of the virtual NICs to carry ([metrics] virtual_nics); the rest are left out."""

    def __init__(self, latest: Callable[[], Report | None], virtual_nics=DEFAULT_VIRTUAL_NICS) -> None:
        self.latest = latest
        self.virtual_nics = tuple(virtual_nics)

    def collect(self) -> Iterator[Metric]:
        yield _gauge("nodecheck_build_info", "nodecheck version.", ["version"], [([__version__], 1)])
        report = self.latest()
        if report is None:
            return
        yield from _probes(report)
        yield from _fingerprint(report)
        yield from _gpus(report)
        yield from _nvlink_domain(report)
        yield from _links_and_nics(report, self.virtual_nics)
        yield from _measurements(report)
        yield from _kernel_log(report)
        yield from _aer(report)
        yield from _gpu_signals(report)
        yield from _findings(report)


def _probes(report: Report) -> Iterator[Metric]:
    yield _gauge("nodecheck_report_timestamp_seconds", "When the probes of the latest report started.", [],
                 [([], report.generated_at)])
    yield _gauge("nodecheck_node_uptime_seconds", "Seconds since the node booted (/proc/uptime), as the report read it: "
                 "the time the counters kept since boot (and since the driver loaded) cover.", [],
                 [([], report.history.uptime_s if report.history else None)])
    yield _gauge("nodecheck_probe_success", "1 when the probe read its source or the source is absent, 0 when it failed.",
                 ["probe"], [([p.name], int(p.ok or p.no_data)) for p in report.probes])
    yield _gauge("nodecheck_probe_data", "1 when the probe found its source (0: no driver, binary not installed).",
                 ["probe"], [([p.name], int(p.ok)) for p in report.probes])
    yield _gauge("nodecheck_probe_duration_seconds", "How long the probe took.", ["probe"],
                 [([p.name], p.duration_seconds) for p in report.probes])


def _fingerprint(report: Report) -> Iterator[Metric]:
    from nodecheck.assemble.fingerprint import FIELDS, fingerprint

    labels = fingerprint(report).labels()
    yield _gauge("nodecheck_node_fingerprint_info", "What every node of one type should share: its "
                 "type, driver, CUDA, VBIOS and NIC firmware versions, kernel, and hashes of its topology and its /etc/nccl.conf.", list(FIELDS),
                 [([labels[f] for f in FIELDS], 1)])


def _gpus(report: Report) -> Iterator[Metric]:
    gpus = report.gpus
    yield _gauge("nodecheck_gpus", "GPUs visible on the node.", [], [([], len(gpus))])
    yield _gauge("nodecheck_gpu_inaccessible", "1 for a GPU NVML counts but cannot open (fallen off the bus, failed to "
                 "initialise, or no permission), by NVML's index and reason.", ["gpu", "reason"],
                 [([g.index, g.error], 1) for g in report.gpus_inaccessible])
    yield _gauge("nodecheck_gpu_info", "GPU identity and locality (join labels as dcgm-exporter spells them).",
                 ["gpu", "UUID", "pci_bus_id", "device", "model_name", "numa_node", "cpu_affinity"],
                 [([g.index, g.uuid, g.pci_bus_id, f"nvidia{g.index}", g.name, g.numa_node, g.cpu_affinity], 1) for g in gpus])
    for key, name, doc in (("gen_current", "generation", "PCIe link generation now (idle GPUs drop it to save power)."),
                           ("gen_max", "generation_max", "Highest PCIe generation the GPU can reach in its slot."),
                           ("width_current", "width", "PCIe link width now (lanes)."),
                           ("width_max", "width_max", "Widest PCIe link the GPU can train to (lanes).")):
        yield _gauge(f"nodecheck_gpu_pcie_link_{name}", doc, ["gpu"], [([g.index], (g.pcie or {}).get(key)) for g in gpus])
    for key, name, doc in (("ecc_enabled", "ecc_enabled", "ECC on (1) or off (0); absent when NVML does not say."),
                           ("remapped_rows_pending", "row_remap_pending", "A row remapping waits for a GPU reset (1)."),
                           ("remapped_rows_failed", "row_remap_failed", "A row remapping failed: replace the GPU (1).")):
        yield _gauge(f"nodecheck_gpu_{name}", doc, ["gpu"],
                     [([g.index], None if getattr(g, key) is None else int(getattr(g, key))) for g in gpus])
    yield _gauge("nodecheck_gpu_fabric_registered", "Registered with the NVLink fabric (1); not yet, or failed (0: CUDA "
                 "refuses work, or NVLink peer traffic fails). Absent without a fabric (PCIe boards) or when NVML does "
                 "not say.", ["gpu"],
                 [([g.index], None if g.fabric is None or g.fabric.registered is None else int(g.fabric.registered))
                  for g in gpus])
    with_nvlinks = [g for g in gpus if g.nvlinks]
    yield _gauge("nodecheck_gpu_nvlink_links", "NVLinks whose state NVML reports for the GPU (active or not).", ["gpu"],
                 [([g.index], sum(1 for l in g.nvlinks if l["active"] is not None)) for g in with_nvlinks])
    yield _gauge("nodecheck_gpu_nvlink_active_links", "NVLinks that are active.", ["gpu"],
                 [([g.index], sum(1 for l in g.nvlinks if l["active"])) for g in with_nvlinks])
    yield _gauge("nodecheck_gpu_nvlink_wired_links", "NVLinks that should be active: what [gpus] nvlinks_per_gpu, the NV# "
                 "pairs of the topology, the board's bridges or the GPU's siblings say; absent where nothing says any "
                 "should be (a slot no bridge is wired to reads inactive by design).", ["gpu"],
                 [([g.index], g.nvlinks_wired) for g in with_nvlinks])
    yield _gauge("nodecheck_gpu_nvlink_unreadable_links", "NVLinks whose state NVML failed to say (Unknown Error, GPU is "
                 "lost); absent where it said every link's.", ["gpu"],
                 [([g.index], sum(1 for l in g.nvlinks if l["active"] is None) or None) for g in with_nvlinks])
    with_c2c = [g for g in gpus if g.c2c]
    yield _gauge("nodecheck_gpu_c2c_links", "NVLink-C2C links between the GPU and its Grace CPU whose state NVML reports.",
                 ["gpu"], [([g.index], g.c2c["links"] + len(g.c2c.get("inactive") or [])) for g in with_c2c])
    yield _gauge("nodecheck_gpu_c2c_active_links", "NVLink-C2C links that are active (the GPU's host path).", ["gpu"],
                 [([g.index], g.c2c["links"]) for g in with_c2c])
    yield _gauge("nodecheck_gpu_power_limit_watts", "The power limit in force (NVML's enforced limit).", ["gpu"],
                 [([g.index], g.power_limit_w) for g in gpus])
    yield _gauge("nodecheck_gpu_power_limit_default_watts", "The board's default power limit.", ["gpu"],
                 [([g.index], g.power_limit_default_w) for g in gpus])
    yield _gauge("nodecheck_gpu_mig_enabled", "1 when the GPU is in MIG mode (no NVLink, no peer-to-peer), 0 when not; "
                 "absent on GPUs without MIG.", ["gpu"],
                 [([g.index], None if g.mig_enabled is None else int(g.mig_enabled)) for g in gpus])
    yield _gauge("nodecheck_gpu_persistence_mode", "1 when the driver keeps the GPU initialised with no client "
                 "(persistence mode, nvidia-persistenced), 0 when not; absent where NVML does not say.", ["gpu"],
                 [([g.index], None if g.persistent is None else int(g.persistent)) for g in gpus])
    yield _gauge("nodecheck_gpu_compute_mode_info", "The GPU's compute mode (NVML: default, exclusive_process, prohibited); "
                 "absent where NVML does not say.", ["gpu", "mode"], [([g.index, g.compute_mode], 1) for g in gpus if g.compute_mode])
    read = [g for g in gpus if g.processes is not None]  # listed by NVML: none is 0; refused, absent
    yield _gauge("nodecheck_gpu_processes", "Processes holding the GPU (NVML's compute and graphics lists), nodecheck's "
                 "own apart: owner=\"job\" in a Slurm job, \"none\" outside every job (the prolog's gpu_in_use), "
                 "\"unknown\" where /proc does not show the pid.", ["gpu", "owner"],
                 [([g.index, owner], sum(1 for p in g.processes if not p.ours and _owner(p) == owner))
                  for g in read for owner in ("job", "none", "unknown")])
    yield _gauge("nodecheck_gpu_memory_used_bytes", "GPU memory in use, the driver's reservation apart; absent where "
                 "the driver does not keep the two apart.", ["gpu"], [([g.index], g.memory_used_bytes) for g in gpus])


def _owner(process) -> str:
    return "unknown" if process.gone else "none" if process.job is None else "job"


def _nvlink_domain(report: Report) -> Iterator[Metric]:
    """The node's NVLink bandwidth mode and, where nvidia-imex-ctl answers, its IMEX daemon and domain."""
    mode = (report.node or {}).get("nvlink_bw_mode")
    yield _gauge("nodecheck_nvlink_bw_mode_info", "The node's NVLink bandwidth mode (NVML; FULL, or a reduced one: OFF, MIN, "
                 "HALF, 3QUARTER); absent where NVML does not say.", ["mode"], [([mode], 1)] if mode else [])
    imex = report.imex
    yield _gauge("nodecheck_imex_daemon_ready", "1 when this node's IMEX daemon is READY, 0 when not or not answering; "
                 "absent without nvidia-imex-ctl.", [],
                 [([], int(imex.daemon == "READY") if imex.daemon or imex.why else None)] if imex else [])
    yield _gauge("nodecheck_imex_domain_up", "1 when the IMEX domain is UP, 0 when DEGRADED or DOWN; absent when unread.",
                 [], [([], int(imex.domain == "UP"))] if imex and imex.domain else [])


def exported_nics(report: Report, virtual_nics) -> list:
    """The physical NICs, the link aggregates the bonding driver shows (any name: node_exporter's tree has bonds
    called dmz and int), and the virtual ones whose names match a pattern of virtual_nics."""
    return [n for n in report.nics
            if not n.virtual or n.bond_members is not None or any(fnmatchcase(n.name, p) for p in virtual_nics)]


def _links_and_nics(report: Report, virtual_nics) -> Iterator[Metric]:
    yield _gauge("nodecheck_link_info", "nvidia-smi topo -m link between a GPU and a GPU or NIC.", ["a", "b", "type", "path_class"],
                 [([l.a, l.b, l.type, l.path_class], 1) for l in report.links])
    nics = exported_nics(report, virtual_nics)
    yield _gauge("nodecheck_nic_info", "NIC identity and locality (virtual: no PCI device, e.g. a bond).",
                 ["nic", "kind", "driver", "pci_address", "rdma_device", "numa_node", "virtual"],
                 [([n.name, n.kind, n.driver, n.pci_address, n.rdma_device, n.numa_node, str(n.virtual).lower()], 1)
                  for n in nics])
    yield _gauge("nodecheck_nic_up", "1 when the NIC's operational state is up.", ["nic"],
                 [([n.name], int(n.state == "up")) for n in nics if n.state is not None])
    yield _gauge("nodecheck_nic_speed_bytes_per_second", "Negotiated NIC speed (absent when not reported).", ["nic"],
                 [([n.name], n.speed_mbps * 1e6 / 8 if n.speed_mbps else None) for n in nics])
    left_out = {f"nic:{n.name}" for n in report.nics} - {f"nic:{n.name}" for n in nics}
    yield _gauge("nodecheck_path_spec_bytes_per_second", "Theoretical unidirectional rate of each path.", ["path", "kind"],
                 [([p.path, p.kind], p.bytes_per_second) for p in report.paths if p.path not in left_out])
    platform = report.platform
    loaded = int(bool(platform.peer_memory)) if platform and platform.modules_known else None
    yield _gauge("nodecheck_gpudirect_peer_memory_loaded", "GPUDirect RDMA's peer-memory module is loaded (absent: unknown).",
                 [], [([], loaded)])
    redirect = report.acs_redirects()
    yield _gauge("nodecheck_pcie_acs_redirect_bridges",
                 "PCIe bridges with ACS P2P request or completion redirect on (absent: ACS unknown, e.g. not root).",
                 [], [([], None if redirect is None else sum(redirect.values()))])


def _measurements(report: Report) -> Iterator[Metric]:
    labels = ["path", "test", "direction"]
    ms = report.measurements
    yield _gauge("nodecheck_bandwidth_timestamp_seconds", "When the bandwidth tests last ran.", [],
                 [([], report.measured_at)])
    yield _gauge("nodecheck_bandwidth_test_success", "1 when the bandwidth test completed.", labels,
                 [([m.path, m.test, m.direction], int(m.ok)) for m in ms])
    yield _gauge("nodecheck_bandwidth_bytes_per_second", "Measured bandwidth (busbw for collectives).", labels,
                 [([m.path, m.test, m.direction], m.bytes_per_second) for m in ms])
    yield _gauge("nodecheck_bandwidth_spec_bytes_per_second", "Theoretical rate of the measured path.", labels,
                 [([m.path, m.test, m.direction], m.spec_bytes_per_second) for m in ms])
    computed = [m for m in ms if m.flops_per_second is not None]
    if computed:  # tests of compute (gemm): their figures are operations, not bytes
        yield _gauge("nodecheck_gpu_flops_per_second", "A GPU's measured dense matrix throughput (bench gemm).", labels,
                     [([m.path, m.test, m.direction], m.flops_per_second) for m in computed])
        yield _gauge("nodecheck_gpu_spec_flops_per_second", "The GPU model's dense matrix throughput at the test's precision.",
                     labels, [([m.path, m.test, m.direction], m.spec_flops_per_second) for m in computed])
    yield _gauge("nodecheck_bandwidth_ratio", "Measured / spec.", labels,
                 [([m.path, m.test, m.direction], m.ratio) for m in ms])
    yield _gauge("nodecheck_bandwidth_threshold_ratio",
                 "The ratio of spec below which the measurement is a finding (calibrated per path, or the config's).",
                 labels, [([m.path, m.test, m.direction], _threshold(m)) for m in ms])


def _threshold(m) -> float | None:
    value = (m.details or {}).get("threshold") if isinstance(m.details, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _kernel_log(report: Report) -> Iterator[Metric]:
    """The kernel log's NVIDIA events since boot, counted per device and code (cleared or not: the findings and
    nodecheck_finding carry the judgment); absent when the log was not read."""
    log = report.kernel_log
    if log is None:
        return
    yield _gauge("nodecheck_kernel_log_readable", "1 when nodecheck could read the kernel log (0: its Xid checks are unknown, "
                 "e.g. it needs CAP_SYSLOG or the systemd-journal group).", [], [([], int(log.known))])
    lost = log.lost_before_usec if log.known else None
    yield _gauge("nodecheck_kernel_log_lost_before_seconds", "Events logged before this time since boot may be missing from "
                 "the Xid checks: the kernel's ring buffer overwrote them, and neither the journal nor an earlier nodecheck "
                 "run of this boot read them; absent when the log reaches back to boot.", [],
                 [([], lost / 1e6)] if lost is not None else [])
    gpus = {normal_pci(g.pci_bus_id): g for g in report.gpus}  # pci_bus_id as NVML and dcgm-exporter spell it, where known
    xids = Counter((gpus[e.pci].index, gpus[e.pci].pci_bus_id, e.code) if e.pci in gpus else ("", e.pci, e.code)
                   for e in log.events if e.kind == "xid")
    yield _gauge("nodecheck_gpu_xid_events", "NVIDIA Xid events the kernel logged since boot, per GPU (gpu empty when NVML no "
                 "longer lists it) and Xid.", ["gpu", "pci_bus_id", "xid"],
                 [([gpu, pci, code], n) for (gpu, pci, code), n in sorted(xids.items(), key=str)])
    nic_events = Counter((e.pci, e.code) for e in log.events if e.kind == "nic")
    yield _gauge("nodecheck_nic_kernel_events", "A ConnectX NIC's own events the kernel logged since boot: module_error (its "
                 "cable or transceiver), slot_power (its PCIe slot short of power).", ["pci_bus_id", "event"],
                 [([pci or "", _NIC_EVENT_LABELS.get(code, str(code))], n) for (pci, code), n in sorted(nic_events.items(),
                                                                                                      key=str)])
    sxids = Counter((e.switch, e.pci, e.code) for e in log.events if e.kind == "sxid")
    yield _gauge("nodecheck_nvswitch_sxid_events", "NVSwitch SXid events the kernel logged since boot.", ["nvswitch", "pci_bus_id", "sxid"],
                 [([switch, pci, code], n) for (switch, pci, code), n in sorted(sxids.items(), key=str)])


def _aer(report: Report) -> Iterator[Metric]:
    """The AER counts since boot of every device on a GPU's or NIC's PCIe path (the rates and their limits
    are judged by nodecheck: pcie_link_errors, pcie_aer_fatal); absent when no path was read."""
    from nodecheck.assemble.counters import AER_FAMILIES, device_hops

    if report.pcie_paths is None:
        return
    rows = [([bdf, family], hop.aer[family]) for bdf, (hop, _) in sorted(device_hops(report).items())
            for family in AER_FAMILIES if hop.aer and family in hop.aer]
    yield _gauge("nodecheck_pcie_aer_errors", "PCIe AER errors counted since boot (sysfs aer_dev_*) by each device on a GPU's "
                 "or NIC's path, by type (correctable, nonfatal, fatal).", ["pci_bus_id", "type"], rows)


def _gpu_signals(report: Report) -> Iterator[Metric]:
    """Each GPU's error signals as NVML reports them (dcgm-exporter's DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
    _NVLINK_*_ERROR_COUNT_TOTAL, _ECC_DBE_VOL_TOTAL, _CLOCKS_EVENT_REASONS) and the recovery action the driver asks
    for, labelled as dcgm-exporter labels them."""
    from nodecheck.report.gpu import HW_REASONS, SW_REASONS, reason_label

    gpus = [g for g in report.gpus if g.signals is not None]
    yield _gauge("nodecheck_gpu_pcie_replays", "PCIe replays counted since the driver loaded.", ["gpu"],
                 [([g.index], g.signals.pcie_replays) for g in gpus])
    yield _gauge("nodecheck_gpu_nvlink_errors", "NVLink errors counted since the driver loaded, summed over the GPU's links, "
                 "by type (replay, recovery, crc_flit, crc_data).", ["gpu", "type"],
                 [([g.index, name], value) for g in gpus for name, value in sorted((g.signals.nvlink_errors or {}).items())])
    yield _gauge("nodecheck_gpu_ecc_uncorrected_volatile", "Uncorrectable ECC errors since the driver loaded or the GPU reset.",
                 ["gpu"], [([g.index], g.signals.ecc_uncorrected_volatile) for g in gpus])
    reasons = {**HW_REASONS, **SW_REASONS}
    yield _gauge("nodecheck_gpu_clock_event_active", "1 while this reason slows the GPU's clocks (NVML clock event reasons).",
                 ["gpu", "reason"], [([g.index, reason_label(name)], int(bool(g.signals.clock_event_reasons & bit)))
                                     for g in gpus if g.signals.clock_event_reasons is not None for bit, name in reasons.items()])
    yield _gauge("nodecheck_gpu_clock_event_seconds", "Seconds this reason has slowed the GPU's clocks since the driver "
                 "loaded (NVML's clock event counters; rate() is the share of the time it held).", ["gpu", "reason"],
                 [([g.index, name], ns / 1e9) for g in gpus for name, ns in sorted((g.signals.clock_event_ns or {}).items())])
    yield _gauge("nodecheck_gpu_recovery_action", "The recovery action the driver asks for before the GPU is used again "
                 "(NVML_GPU_RECOVERY_ACTION_*): 0 none, 1 GPU reset, 2 node reboot, 3 peer-to-peer drain, 4 drain and "
                 "reset, 5 IMEX domain recovery, 6 PCIe bus reset, 7 system reboot; absent where the driver does not say.",
                 ["gpu"], [([g.index], g.signals.recovery_action) for g in gpus])
    yield _gauge("nodecheck_gpu_retired_pages", "Memory pages the GPU retired, single- and double-bit causes together "
                 "(GPUs before Ampere; absent where NVML does not say, as on GPUs that remap rows).", ["gpu"],
                 [([g.index], g.signals.retired_pages) for g in gpus])
    for key, name, doc in (("sram_threshold_exceeded", "sram_threshold_exceeded", "The SRAM uncorrectable errors passed the "
                            "field diagnostic's RMA threshold (1); absent where NVML does not say (it needs root)."),
                           ("retired_pages_pending", "retired_pages_pending", "A page retirement waits for a GPU reset (1)."),
                           ("inforom_valid", "inforom_valid", "The InfoROM is valid (1) or corrupted (0).")):
        yield _gauge(f"nodecheck_gpu_{name}", doc, ["gpu"],
                     [([g.index], None if getattr(g.signals, key) is None else int(getattr(g.signals, key))) for g in gpus])


def _findings(report: Report) -> Iterator[Metric]:
    yield _gauge("nodecheck_findings", "Findings of the latest report by severity.", ["severity"],
                 [([s], sum(1 for f in report.findings if f.severity == s)) for s in SEVERITIES])
    yield _gauge("nodecheck_finding", "One series per finding.", ["kind", "severity", "subject"],
                 [([f.kind, f.severity, f.subject], 1) for f in report.findings])
    raised = {f.kind for f in report.findings}
    unmade = unmade_checks(report)  # a check never made is unknown, never healthy
    yield _gauge("nodecheck_check_healthy", "1 when the latest report has no finding of this kind, 0 when it has; absent when "
                 "the check could not be made (nodecheck_check_unknown).", ["check"],
                 [([kind], int(kind not in raised)) for kind in FINDING_KINDS if kind not in unmade])
    yield _gauge("nodecheck_check_unknown", "1 for a check the latest report could not make (its probe failed or was "
                 "switched off, ACS needs root, no bandwidth test or NCCL run yet, or made by the prolog only).", ["check"],
                 [([kind], 1) for kind in FINDING_KINDS if kind in unmade])


def exposition(report: Report | None, virtual_nics=DEFAULT_VIRTUAL_NICS) -> bytes:
    """The metrics of a Report in Prometheus' text format: what /metrics serves and the textfile holds."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(lambda: report, virtual_nics))
    return generate_latest(registry)


def write_textfile(report: Report, directory: Path, virtual_nics=DEFAULT_VIRTUAL_NICS) -> Path:
    """The metrics as a node_exporter textfile, written atomically: a hidden temporary file (node_exporter
    reads only *.prom), fsynced, renamed over the old one; removed if anything interrupts the write."""
    from nodecheck.host.files import atomic_file

    target = directory / TEXTFILE_NAME
    with atomic_file(target) as out:
        out.write(exposition(report, virtual_nics))
    return target
