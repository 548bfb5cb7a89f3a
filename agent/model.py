"""The Report: the one object every face (CLI, exporter, prolog) reads. Its JSON form is
documented in docs/report-schema.md; bump SCHEMA_VERSION on any incompatible change."""

from __future__ import annotations

import re
from dataclasses import MISSING, asdict, dataclass, field, fields

SCHEMA_VERSION = 2  # 2: paths and measurements carry scope (and endpoints, ranks); GPUs memory_bytes
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
    "gpudirect_rdma_unavailable": "no GPUDirect RDMA peer-memory module",
    "iommu_translated": "{subject} IOMMU {measured}",
    "pcie_hop_narrow": "{subject} PCIe {measured} < {expected}",
    "pcie_acs_redirect": "{subject} ACS redirects peer traffic",
    "probe_failed": "{subject} {measured}",
    "bandwidth_below_spec": "{subject} bandwidth {measured} of spec, {expected} expected",
    "bandwidth_above_bound": "{subject} {measured} x the rails' bound: fabric misread",
    "bench_failed": "{head} failed",
    "bench_wrong_result": "{head} returned wrong data",
    "nccl_socket_fallback": "NCCL over sockets, RDMA NICs up",
    "nccl_no_gdr": "NCCL without GPUDirect RDMA",
    "nccl_p2p_disabled": "NCCL over {measured} inside the node",
    "nccl_rail_mismatch": "{subject} NCCL on {measured}, nearest {expected}",
    "nccl_warning": "{head}",
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
    architecture: int | None = None  # NVML's number (nvmlDeviceGetArchitecture: 7 Ampere, 9 Hopper ...)
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


# How nodecheck spells paths, read in this one place: (pattern, scope, endpoint groups, ranks group).
# A measurement from another node carries its node's name first ("node2/gpu0:host").
_PATHS = [
    (re.compile(r"gpu(\d+):host"), "host-link"),
    (re.compile(r"gpu(\d+)(?::|->|<->)gpu(\d+)"), "gpu-pair"),
    (re.compile(r"nic:(.+)"), "nic"),
    (re.compile(r"(?:allreduce|nccl-tests):node-(\d+)-gpus"), "node"),
    (re.compile(r"allreduce:(\d+)-ranks"), "cluster"),
]


def path_identity(path: str) -> tuple[str | None, list[str], int | None]:
    """(scope, endpoints, ranks) of a path: host-link (gpu0:host), gpu-pair (gpu0:gpu1, gpu0->gpu1,
    gpu0<->gpu1), nic (nic:eth0), node (an all-reduce inside one node) or cluster (across nodes)."""
    bare = path.rsplit("/", 1)[-1]
    for pattern, scope in _PATHS:
        match = pattern.fullmatch(bare)
        if match is None:
            continue
        if scope == "host-link":
            return scope, [f"gpu{match[1]}", "host"], None
        if scope == "gpu-pair":
            return scope, [f"gpu{match[1]}", f"gpu{match[2]}"], None
        if scope == "nic":
            return scope, [match[1]], None
        return scope, [], int(match[1])
    return None, [], None


@dataclass
class PathSpec:
    """Theoretical unidirectional rate of one path; None with the reason when it cannot be derived."""

    path: str  # gpu0:host, gpu0:gpu1, nic:eth0
    kind: str  # pcie, nvlink, ethernet, infiniband
    bytes_per_second: float | None
    basis: str
    source: str | None = None
    expected_bytes_per_second: float | None = None  # from config, when it states one
    scope: str | None = None  # host-link, gpu-pair, nic: from the path when not given
    endpoints: list[str] = field(default_factory=list)  # ["gpu0", "host"], ["gpu0", "gpu1"], ["eth0"]

    def __post_init__(self) -> None:
        if self.scope is None:
            self.scope, self.endpoints, _ = path_identity(self.path)


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
    scope: str | None = None  # host-link, gpu-pair, node, cluster: from the path when not given
    ranks: int | None = None  # all-reduce: the ranks it ran over

    def __post_init__(self) -> None:
        if self.scope is None:
            self.scope, _, ranks = path_identity(self.path)
            self.ranks = self.ranks if self.ranks is not None else ranks

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
    platform: dict | None = None  # GPUDirect RDMA's peer-memory module, IOMMU group types (probes/platform.py)
    pcie_paths: dict | None = None  # GPU and NIC PCI address -> its hops up to the root port (probes/pcie.py)
    pcie_acs: dict | None = None  # ACS P2P redirect per bridge, or why it is unknown (probes/acs.py)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        data = asdict(self)
        data["schema"] = "nodecheck.report"
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Report":
        """A Report from its JSON form (`inspect --json`, `bench --json`), earlier schema versions too:
        a field they lack takes its default (None where it has none), scopes come from the paths.
        ValueError when the document is not a Report's shape."""
        if not isinstance(data, dict):
            raise ValueError("a Report is a JSON object")
        nics = [_record(Nic, raw) for raw in _list(data, "nics")]
        for nic in nics:
            nic.ib_ports = [_record(IbPort, raw) for raw in (nic.ib_ports or [])]
        cpu = data.get("cpu")
        return cls(
            generated_at=data.get("generated_at") or 0.0, source=str(data.get("source") or ""),
            node=dict(data.get("node") or {}), probes=[_record(ProbeOutcome, r) for r in _list(data, "probes")],
            cpu=_record(Cpu, cpu) if cpu else None, gpus=[_record(Gpu, r) for r in _list(data, "gpus")],
            gpus_absent_reason=data.get("gpus_absent_reason"), nics=nics, links=[_record(Link, r) for r in _list(data, "links")],
            paths=[_record(PathSpec, r) for r in _list(data, "paths")],
            findings=[_record(Finding, r) for r in _list(data, "findings")], advice=_list(data, "advice"),
            measurements=[_record(Measurement, r) for r in _list(data, "measurements")], measured_at=data.get("measured_at"),
            platform=data.get("platform") if isinstance(data.get("platform"), dict) else None,
            pcie_paths=data.get("pcie_paths") if isinstance(data.get("pcie_paths"), dict) else None,
            pcie_acs=data.get("pcie_acs") if isinstance(data.get("pcie_acs"), dict) else None)

    def fails(self, fail_severity: str) -> bool:
        """A finding at or above `fail_severity` (the CLI's exit code 1)."""
        return bool(at_or_above(self.findings, fail_severity))

    def rdma_nics_up(self) -> list[Nic]:
        """The NICs of an RDMA device with an ACTIVE port (InfiniBand, RoCE, EFA)."""
        return [n for n in self.nics if n.rdma_device and any(p.state == "ACTIVE" for p in n.ib_ports)]

    def acs_redirects(self) -> dict[str, bool] | None:
        """Bridge PCI address -> ACS P2P redirect on, as probes/acs.py read it; None when ACS is unknown (not
        root, no lspci, a snapshot from before nodecheck ran it) or the record is malformed."""
        acs = self.pcie_acs if isinstance(self.pcie_acs, dict) else {}
        redirect = acs.get("redirect")
        if not acs.get("known") or not isinstance(redirect, dict):
            return None
        return {str(bdf): on is True for bdf, on in redirect.items()}

    def iommu_modes(self) -> dict[str | None, object]:
        """Normalized PCI address -> its IOMMU group's type (identity, DMA, DMA-FQ), as probes/platform.py read it."""
        from nodecheck.bench.identity import normal_pci

        platform = self.platform if isinstance(self.platform, dict) else {}
        groups = platform.get("iommu") if isinstance(platform.get("iommu"), dict) else {}
        return {normal_pci(k): v for k, v in groups.items() if isinstance(k, str)}

    def path_spec(self, path: str) -> PathSpec | None:
        """The spec of one path ("gpu0:host", "gpu0:gpu1", "nic:eth0"), None when the Report has none."""
        return next((p for p in self.paths if p.path == path), None)

    def worst_severity(self) -> str | None:
        ranks = [SEVERITIES.index(f.severity) for f in self.findings]
        return SEVERITIES[max(ranks)] if ranks else None


def _list(data: dict, key: str) -> list:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{key}: expected a list")
    return value


def _record(kind, raw):
    """One dataclass from its JSON object: unknown keys (a later version's) dropped, missing ones None."""
    if not isinstance(raw, dict):
        raise ValueError(f"{kind.__name__}: expected an object, got {type(raw).__name__}")
    known = {f.name: f for f in fields(kind)}
    values = {k: v for k, v in raw.items() if k in known}
    for name, spec in known.items():
        if name not in values and spec.default is MISSING and spec.default_factory is MISSING:  # required
            values[name] = None
    return kind(**values)
