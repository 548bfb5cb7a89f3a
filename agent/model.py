"""The Report: the one object every face (CLI, exporter, prolog) reads. Its JSON form is
documented in docs/report-schema.md; bump SCHEMA_VERSION on any incompatible change."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SCHEMA_VERSION = 1
SEVERITIES = ("info", "warning", "error", "critical")


# What each link type crosses, nearest first (the nvidia-smi legend). SOC is the pre-2017 name of SYS.
LINK_CLASS = {
    "X": "self",
    "NV": "nvlink",
    "PIX": "pcie-single-bridge",
    "PXB": "pcie-multiple-bridges",
    "PHB": "pcie-host-bridge",
    "NODE": "numa-node-interconnect",
    "SYS": "socket-interconnect",
    "SOC": "socket-interconnect",
}
LINK_DISTANCE = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6, "SOC": 6}


def link_family(link_type: str) -> str:
    return "NV" if link_type.startswith("NV") else link_type


def link_class(link_type: str) -> str:
    return LINK_CLASS[link_family(link_type)]


def link_distance(link_type: str) -> int:
    """Smaller is closer: NV# < PIX < PXB < PHB < NODE < SYS."""
    return LINK_DISTANCE[link_family(link_type)]


def nvlink_count(link_type: str) -> int | None:
    return int(link_type[2:]) if link_type.startswith("NV") else None



def at_or_above(findings: list, severity: str) -> list:
    """The findings at or above `severity`, in their order (what fails a run)."""
    floor = SEVERITIES.index(severity)
    return [f for f in findings if SEVERITIES.index(f.severity) >= floor]
# Every finding kind nodecheck raises, with the figure it puts in a Slurm drain reason ({subject},
# {measured}, {expected}; {head}: the message up to its first ": "). The rules raise only these
# (tests/test_finding_kinds.py), docs/report-schema.md lists each, and the exporter publishes one
# health gauge per kind.
FINDING_KINDS = {
    "gpu_count_low": "GPUs {measured} < {expected}",
    "pcie_downtrained": "{subject} PCIe {measured} < {expected}",
    "nvlink_inactive": "{subject} NVLinks active {measured} < {expected}",
    "nvlink_count_low": "{subject} NVLinks {measured} < {expected}",
    "ecc_disabled": "{subject} ECC off",
    "row_remap_failed": "{subject} row remapping failed",
    "row_remap_pending": "{subject} row remapping pending",
    "gpu_link_changed": "{subject} link {measured} != {expected}",
    "nic_missing": "{subject} missing",
    "nic_down": "{subject} {measured} != {expected}",
    "nic_slow": "{subject} {measured} < {expected}",
    "nic_speed_unknown": "{subject} speed unknown, {expected} expected",
    "nic_far_from_gpu": "{head}",
    "probe_failed": "{subject} {measured}",
    "bandwidth_below_spec": "{subject} bandwidth {measured} of spec, {expected} expected",
    "bandwidth_above_bound": "{subject} {measured} x the rails' bound: fabric misread",
    "bench_failed": "{head} failed",
    # raised by `nodecheck prolog` / `healthcheck` only
    "check_timed_out": "{subject} timed out after {expected}",
    "check_failed": "{head}",
    "peer_unreachable": "{subject} unreachable",
    "peer_outside_subnet": "{subject} {measured} outside {expected}",
    "peer_slow": "{subject} round trip {measured}, peers' median {expected}",
}


@dataclass
class Gpu:
    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    cpu_affinity: str = ""  # Linux cpulist; "" when not reported
    numa_node: int | None = None  # the CPU-side NUMA node closest to the GPU
    gpu_numa_id: int | None = None  # the GPU's own memory NUMA node (coherent platforms only)
    pcie: dict | None = None  # gen_current, gen_max, gen_gpu_max, width_current, width_max
    utilization_percent: int | None = None
    memory_bytes: int | None = None  # the GPU's memory (NVML), which bounds the largest payload a test may use
    nvlinks: list[dict] = field(default_factory=list)  # {link, active, version}
    ecc_enabled: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    nearest_nics: list[str] = field(default_factory=list)


@dataclass
class Link:
    a: int | str  # GPU index or NIC name
    b: int | str
    type: str  # as nvidia-smi prints it: NV18, PIX, SYS ...
    path_class: str  # nvlink, pcie-host-bridge, socket-interconnect ...


@dataclass
class PathSpec:
    """Theoretical unidirectional rate of one path; None with the reason when it cannot be derived."""

    path: str  # gpu0:host, gpu0:gpu1, nic:eth0
    kind: str  # pcie, nvlink, ethernet, infiniband
    bytes_per_second: float | None
    basis: str
    source: str | None = None
    expected_bytes_per_second: float | None = None  # from config, when it states one


@dataclass
class Finding:
    kind: str  # gpu_count_low, pcie_downtrained, nvlink_inactive, ...
    severity: str  # one of SEVERITIES
    subject: str  # gpu0, gpu0-gpu1, eth0, node
    measured: object
    expected: object
    message: str  # one line a person can act on


@dataclass
class Measurement:
    """One bandwidth test on one path, compared with that path's theoretical unidirectional spec."""

    path: str  # allreduce:3-ranks, gpu0:host ...
    test: str  # allreduce, h2d, d2h, p2p
    ok: bool  # False: the test failed (error says why); no figure
    bytes_per_second: float | None  # busbw for collectives
    spec_bytes_per_second: float | None
    ratio: float | None  # measured / spec
    payload_bytes: int | None
    method: str  # how it was measured
    direction: str  # unidirectional, bidirectional, busbw
    details: dict = field(default_factory=dict)  # sweep rows, per-node figures ...
    error: str | None = None

    @classmethod
    def measured(cls, path: str, test: str, rate: float, spec: float | None, payload: int | None, method: str,
                 direction: str, details: dict | None = None) -> "Measurement":
        return cls(path, test, True, rate, spec, rate / spec if spec else None, payload, method, direction, details or {})

    @classmethod
    def failed(cls, path: str, test: str, method: str, direction: str, error: str) -> "Measurement":
        return cls(path, test, False, None, None, None, None, method, direction, error=error)


@dataclass
class Cpu:
    packages: int
    numa_nodes: int
    cores: int
    pus: int
    numa: list[dict] = field(default_factory=list)  # {node, cpus}
    model: str | None = None


@dataclass
class ProbeOutcome:
    name: str
    ok: bool
    no_data: bool
    duration_seconds: float
    error: str | None
    timed_out: bool = False


@dataclass
class IbPort:
    device: str  # mlx5_0
    port: int
    state: str | None  # ACTIVE, DOWN, INIT ...
    phys_state: str | None  # LinkUp, Disabled, Polling ...
    rate: str | None  # as sysfs prints it: "400 Gb/sec (4X NDR)"
    link_layer: str | None  # InfiniBand or Ethernet (RoCE)


@dataclass
class Nic:
    name: str
    kind: str  # ethernet, infiniband, loopback, other
    virtual: bool  # no PCI device behind it (bridge, veth, lo ...)
    state: str | None
    speed_mbps: int | None
    mtu: int | None
    driver: str | None
    pci_address: str | None
    numa_node: int | None
    mac: str | None
    addresses: list[dict] = field(default_factory=list)
    rdma_device: str | None = None  # mlx5_0 when this netdev belongs to an RDMA device
    ib_ports: list[IbPort] = field(default_factory=list)


@dataclass
class Report:
    generated_at: float
    source: str
    node: dict
    probes: list[ProbeOutcome]
    cpu: Cpu | None
    gpus: list[Gpu]
    gpus_absent_reason: str | None
    nics: list[Nic]
    links: list[Link]
    paths: list[PathSpec]
    findings: list[Finding] = field(default_factory=list)
    advice: list[dict] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    measured_at: float | None = None  # when the measurements were taken (`bench`, or the daemon's last bench run)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        data = asdict(self)
        data["schema"] = "nodecheck.report"
        return data

    def fails(self, fail_severity: str) -> bool:
        """A finding at or above `fail_severity` (the CLI's exit code 1)."""
        return bool(at_or_above(self.findings, fail_severity))

    def path_spec(self, path: str) -> PathSpec | None:
        """The spec of one path ("gpu0:host", "gpu0:gpu1", "nic:eth0"), None when the Report has none."""
        return next((p for p in self.paths if p.path == path), None)

    def worst_severity(self) -> str | None:
        ranks = [SEVERITIES.index(f.severity) for f in self.findings]
        return SEVERITIES[max(ranks)] if ranks else None
