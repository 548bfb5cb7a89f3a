"""The Report: the one object every face (CLI, exporter, prolog) reads. Its JSON form is
documented in docs/report-schema.md; bump SCHEMA_VERSION on any incompatible change."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from nodecheck.core.limits import MAX_GPUS
from nodecheck.core.link_types import LINK_TYPE
from nodecheck.core.pci import Hop, normal_pci
from nodecheck.core.typed_json import ESSENTIAL, record
from nodecheck.report.events import History, KernelLog
from nodecheck.report.findings import SEVERITIES, Finding, at_or_above
from nodecheck.report.gpu import GpuFabric, GpuModelSpec, GpuProcess, GpuSignals
from nodecheck.report.measurement import Measurement, measured_on, path_identity  # noqa: F401 (the Report's vocabulary)

SCHEMA_VERSION = 2  # 2: paths and measurements carry scope (and endpoints, ranks); GPUs memory_bytes
BENCH_TESTS = ("h2d", "d2h", "p2p", "allreduce", "nccl_tests", "hbm", "gemm")  # what `bench --tests` and [prolog] bench name


@dataclass
class Gpu:
    index: int = field(metadata=ESSENTIAL)
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    vbios: str | None = None  # NVML's VBIOS version
    architecture: int | None = None  # NVML's number (nvmlDeviceGetArchitecture: 7 Ampere, 9 Hopper ...)
    cpu_affinity: str = ""  # Linux cpulist; "" when not reported
    numa_node: int | None = None  # the CPU-side NUMA node closest to the GPU
    gpu_numa_id: int | None = None  # the GPU's own memory NUMA node (coherent platforms only)
    pcie: dict | None = None  # gen_current, gen_max, gen_gpu_max, width_current, width_max
    utilization_percent: int | None = None
    memory_bytes: int | None = None  # the GPU's memory (NVML), which bounds the largest payload a test may use
    nvlinks: list[dict] = field(default_factory=list)  # {link, active, version, remote, remote_type}; active None: NVML's error
    nvlink_speed_mbps: int | None = None  # NVML's per-link NVLink speed (what `nvidia-smi nvlink -s` prints), MB/s
    p2p_read: dict[str, str] | None = None  # peer ("gpu1") -> NVML's P2P read status ("ok", "not supported" ...)
    nvlinks_wired: int | None = None  # how many of its NVLinks should be up (nvlink_rules.wired_nvlinks); None: nothing says
    ecc_enabled: bool | None = None
    ecc_pending: bool | None = None  # the ECC mode it takes at its next reset (NVML's pending mode)
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    fabric: GpuFabric | None = None  # None: NVML did not say (no fabric API in this driver, or NVML not read)
    c2c: dict | None = None  # {links, link_mbps}: active NVLink-C2C links to a Grace CPU, the host's path (NVML)
    power_limit_w: float | None = None  # the power limit in force (NVML's enforced limit)
    power_limit_default_w: float | None = None  # the board's default limit
    mig_enabled: bool | None = None  # in MIG mode (NVML); None: no MIG on this GPU, or not read
    persistent: bool | None = None  # the driver keeps it initialised with no client (persistence mode); None: not read
    compute_mode: str | None = None  # who may hold a context: default, exclusive_process, prohibited (NVML); None: not read
    mig_pending: bool | None = None  # the MIG mode it takes at its next reset
    nearest_nics: list[str] = field(default_factory=list)
    signals: GpuSignals | None = None  # None: NVML not read
    processes: list[GpuProcess] | None = None  # what holds it (NVML's list; /proc's names); None: NVML did not list
    memory_used_bytes: int | None = None  # in use, the driver's reservation apart; None where NVML did not say so
    spec: GpuModelSpec | None = None  # what its model is rated at (specs.toml [[gpu_models]]); None: a model not there

    def __post_init__(self) -> None:  # a Report read back (a hostile one too): only NVLink entries of the shape written
        self.nvlinks = [link for link in self.nvlinks if isinstance(link, dict) and isinstance(link.get("link"), int)
                        and "active" in link and link["active"] in (True, False, None)]
        for link in self.nvlinks:  # the far end NVML named: a short bus id, or nothing
            if not isinstance(link.get("remote"), str) or len(link["remote"]) > 32:
                link.pop("remote", None)
            if link.get("remote_type") not in ("gpu", "switch", "npu", "unknown") or "remote" not in link:
                link.pop("remote_type", None)
        if not isinstance(self.p2p_read, dict):
            self.p2p_read = None
        elif self.p2p_read:
            self.p2p_read = {str(k)[:12]: str(v)[:40] for k, v in list(self.p2p_read.items())[:MAX_GPUS]}

    def on_grace(self) -> bool:
        """A GPU on NVLink-C2C to a Grace CPU (GH200, GB200, GB300): NVML's C2C links, or the memory NUMA node `topo -m`
        gives coherent platforms only. `topo -m` says SYS to every NIC there (sgl-project/sglang#11208's GB200 tray),
        though its own Grace's NICs are one C2C hop away, where NCCL takes GPUDirect RDMA (NCCL_NET_GDR_C2C)."""
        return bool(self.c2c) or self.gpu_numa_id is not None


@dataclass
class InaccessibleGpu:
    """A GPU NVML counts but cannot open (nvmlDeviceGetHandleByIndex refused): fallen off the bus, failed to
    initialise, or not this user's to open. Its facts are unknown; the other GPUs are read."""

    index: int = field(metadata=ESSENTIAL)  # NVML's index (PCI bus order)
    error: str = ""  # NVML's reason: "GPU is lost", "Unknown Error", "Insufficient Permissions"
    code: int | None = None  # NVML's return code (15 GPU is lost, 4 no permission, 999 unknown)


@dataclass
class Link:
    a: int | str = field(metadata=ESSENTIAL)  # GPU index or NIC name
    b: int | str = field(metadata=ESSENTIAL)
    type: str = field(metadata=ESSENTIAL)  # as nvidia-smi prints it: NV18, PIX, SYS ...
    path_class: str  # nvlink, pcie-host-bridge, socket-interconnect ...

    def __post_init__(self) -> None:  # a Report read back (a hostile one too) holds only types nvidia-smi prints
        if not isinstance(self.type, str) or not LINK_TYPE.fullmatch(self.type):
            raise ValueError(f"link type {str(self.type)[:20]!r} is not one nvidia-smi prints")


@dataclass
class PathSpec:
    """Theoretical unidirectional rate of one path; None with the reason when it cannot be derived."""

    path: str = field(metadata=ESSENTIAL)  # gpu0:host, gpu0:gpu1, nic:eth0
    kind: str = field(metadata=ESSENTIAL)  # pcie, nvlink, ethernet, infiniband
    bytes_per_second: float | None
    basis: str
    source: str | None = None
    expected_bytes_per_second: float | None = None  # from config, when it states one
    line_bytes_per_second: float | None = None  # a NIC's link rate, where its PCIe path bounds it lower
    scope: str | None = None  # host-link, gpu-pair, nic: from the path when not given
    endpoints: list[str] = field(default_factory=list)  # ["gpu0", "host"], ["gpu0", "gpu1"], ["eth0"]

    def __post_init__(self) -> None:
        if self.scope is None:
            self.scope, self.endpoints, _ = path_identity(self.path)

    @property
    def link_bytes_per_second(self) -> float | None:  # a NIC's own link rate, whether its PCIe path bounds it or not
        return self.line_bytes_per_second or self.bytes_per_second


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
    name: str = field(metadata=ESSENTIAL)
    ok: bool
    no_data: bool
    duration_seconds: float
    error: str | None
    timed_out: bool = False


@dataclass
class IbPort:
    device: str = field(metadata=ESSENTIAL)  # mlx5_0
    port: int
    state: str | None  # ACTIVE, DOWN, INIT ...
    phys_state: str | None  # LinkUp, Disabled, Polling ...
    rate: str | None  # as sysfs prints it: "400 Gb/sec (4X NDR)"
    link_layer: str | None  # InfiniBand or Ethernet (RoCE)
    # the error counters rules judge (src/nodecheck/probes/ib_counters.py): name -> count, None where the port says
    # "N/A (no PMA)" or garbage (unknown, never 0); {} when not read
    counters: dict[str, int | None] = field(default_factory=dict)
    gids: dict[str, str] | None = None  # RoCE: GID table index -> the set GID (src/nodecheck/probes/roce_gids.py); None: not read
    gid_versions: dict[str, int] = field(default_factory=dict)  # GID table index -> its RoCE version (1, 2)


@dataclass
class Nic:
    name: str = field(metadata=ESSENTIAL)
    kind: str = field(metadata=ESSENTIAL)  # ethernet, infiniband, loopback, other
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
    firmware: str | None = None  # its RDMA device's fw_ver (/sys/class/infiniband/DEV/fw_ver)
    bond_members: list[str] | None = None  # a link aggregate (the bonding driver's bonding/slaves): its members; None if not one
    # a physical netdev's link counters (src/nodecheck/probes/nics.py NETDEV_COUNTERS): name -> count, None when garbled; {} when not read
    counters: dict[str, int | None] = field(default_factory=dict)


@dataclass
class Platform:
    """What GPU traffic depends on below the PCIe links, from sysfs, /proc and /etc/nccl.conf (src/nodecheck/probes/platform.py)."""

    peer_memory: str | None  # /sys/module/{nvidia_peermem,nv_peer_mem}: the one loaded, None when neither is
    modules_known: bool  # /sys/module could be listed (a snapshot without it says nothing)
    iommu: dict[str, str] = field(default_factory=dict)  # /sys/kernel/iommu_groups/N/{devices/ADDRESS,type}
    iommu_cmdline: list[str] = field(default_factory=list)  # /proc/cmdline: iommu=pt, intel_iommu=on ...
    # /proc/driver/nvidia/version: NVIDIA's open kernel modules; None when it is unreadable. With Linux >= 5.12
    # they give GPUDirect RDMA through DMA-BUF, without a peer-memory module (NCCL >= 2.13 uses it by itself).
    open_kernel_modules: bool | None = None
    kernel: str | None = None  # uname's release
    dma_buf: bool | None = None  # open_kernel_modules on kernel >= 5.12; None when either is unknown
    gpudirect: str | None = None  # derived: the peer-memory module, else "dma-buf" when possible
    nccl_conf: dict[str, str] | None = None  # /etc/nccl.conf as NCCL reads it (name -> value); None when absent

    def __post_init__(self) -> None:
        self.gpudirect = self.peer_memory or ("dma-buf" if self.dma_buf else None)

    def iommu_modes(self) -> dict[str | None, str]:
        """Normalized PCI address -> its IOMMU group's type (identity, DMA, DMA-FQ)."""
        return {normal_pci(bdf): kind for bdf, kind in self.iommu.items()}


@dataclass
class Imex:
    """The IMEX service of a multi-node NVLink domain (GB200 NVL72), from `nvidia-imex-ctl -q` and `-N -j`
    (src/nodecheck/probes/imex.py): without it no GPU shares memory with another node's over NVLink."""

    daemon: str | None  # this node's daemon: READY, INITIALIZING, WAITING_FOR_PEERS ...; None when unread (why)
    domain: str | None  # UP, DOWN, DEGRADED; None when unread (why)
    nodes: list[dict] = field(default_factory=list)  # {index, host, status, unconnected: [hosts it cannot reach]}
    why: str | None = None  # what could not be read, or "not configured"


@dataclass
class PcieAcs:
    """ACS of the PCIe bridges, from `lspci -D -vvv` ACSCtl lines (src/nodecheck/probes/acs.py)."""

    known: bool  # ACS could be read: root, lspci present and answering
    why: str | None = None  # why it is unknown
    redirect: dict[str, bool] = field(default_factory=dict)  # ACS-capable bridge's address -> P2P redirect on


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
    platform: Platform | None = None
    pcie_paths: dict[str, list[Hop]] | None = None  # GPU and NIC PCI address -> its hops, the device first (src/nodecheck/probes/pcie.py)
    pcie_acs: PcieAcs | None = None
    imex: Imex | None = None  # only where nvidia-imex-ctl is installed
    kernel_log: KernelLog | None = None  # NVIDIA Xid/SXid events since boot (src/nodecheck/probes/kernel_log.py)
    gpus_inaccessible: list[InaccessibleGpu] = field(default_factory=list)  # counted by NVML, not opened
    driver_gpus: list[str] | None = None  # the PCI addresses the NVIDIA kernel driver manages (/proc/driver/nvidia/gpus)
    history: History | None = None  # acknowledgements from the state file (src/nodecheck/host/state.py)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        data = asdict(self)
        data["schema"] = "nodecheck.report"
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Report":
        """A Report from its JSON form (`inspect --json`, `bench --json`), earlier schema versions too, read
        by the field types alone: a key a later version adds is dropped, one an earlier lacks takes its
        default (None, [] or {} where it has none); scopes come from the paths. A section of what a source
        read (platform, pcie_paths, pcie_acs, cpu) that is not its shape is dropped, as if not read.
        ValueError when the document is not a Report's shape."""
        if not isinstance(data, dict):
            raise ValueError("a Report is a JSON object")
        report = record(cls, data, _LENIENT)
        report.generated_at, report.source = report.generated_at or 0.0, report.source or ""
        report.schema_version = SCHEMA_VERSION  # read into today's shape
        return report

    def fails(self, fail_severity: str) -> bool:
        """A finding at or above `fail_severity` (the CLI's exit code 1)."""
        return bool(at_or_above(self.findings, fail_severity))

    def in_nvlink_domain(self) -> bool:
        """Whether the node is in a multi-node NVLink domain (GB200 NVL72): a GPU's fabric names a cluster."""
        return any(g.fabric is not None and g.fabric.cluster_uuid for g in self.gpus)

    def nvlink_across_nodes(self) -> tuple[bool, str]:
        """Whether a job across this node's NVLink domain takes NVLink between nodes, and why: the GPUs registered in a
        multi-node domain and IMEX READY with its domain UP, every node connected. Without IMEX a GPU shares no
        memory with another node's, and NCCL takes the rails (a GB200 job at rail speed read 0.20 of NVLink)."""
        if not self.in_nvlink_domain():
            return False, "not in a multi-node NVLink domain"
        imex = self.imex
        if imex is None:
            return False, "IMEX's state is unknown (nvidia-imex-ctl not read)"
        if imex.daemon != "READY" or imex.domain != "UP" or any(n.get("unconnected") for n in imex.nodes):
            state = f"daemon {imex.daemon or 'unread'}, domain {imex.domain or 'unread'}"
            return False, f"IMEX is not ready ({state}{', nodes unconnected' if imex.domain == 'UP' else ''})"
        return True, "IMEX READY, its domain UP"

    def rdma_nics_up(self) -> list[Nic]:
        """The NICs of an RDMA device with an ACTIVE port (InfiniBand, RoCE, EFA)."""
        return [n for n in self.nics if n.rdma_device and any(p.state == "ACTIVE" for p in n.ib_ports)]

    def acs_redirects(self) -> dict[str, bool] | None:
        """Normalized bridge PCI address -> ACS P2P redirect on; None when ACS is unknown (not root, no lspci,
        a snapshot from before nodecheck ran it)."""
        if self.pcie_acs is None or not self.pcie_acs.known:
            return None
        return {normal_pci(bdf) or bdf: on for bdf, on in self.pcie_acs.redirect.items()}

    def nccl_conf(self) -> dict[str, str] | None:
        """/etc/nccl.conf as NCCL reads it (name -> value); None when absent or the platform was not read."""
        return self.platform.nccl_conf if self.platform else None

    def iommu_modes(self) -> dict[str | None, str]:
        """Normalized PCI address -> its IOMMU group's type; {} when the platform was not read."""
        return self.platform.iommu_modes() if self.platform else {}

    def hops(self) -> dict[str | None, list[Hop]]:
        """Normalized PCI address of a GPU or NIC -> its PCIe hops, the device first; {} when not read."""
        return {normal_pci(bdf): hops for bdf, hops in (self.pcie_paths or {}).items() if normal_pci(bdf)}

    def path_spec(self, path: str) -> PathSpec | None:
        """The spec of one path ("gpu0:host", "gpu0:gpu1", "nic:eth0"), None when the Report has none."""
        return next((p for p in self.paths if p.path == path), None)

    def worst_severity(self) -> str | None:
        ranks = [SEVERITIES.index(f.severity) for f in self.findings]
        return SEVERITIES[max(ranks)] if ranks else None


# What a source read, dropped when malformed (a hostile snapshot's value is as good as none); a malformed
# list of GPUs, NICs or measurements refuses the whole document instead.
_LENIENT = {(Report, "platform"), (Report, "pcie_paths"), (Report, "pcie_acs"), (Report, "kernel_log"), (Report, "cpu"),
            (Report, "history"), (Report, "imex")}


def from_json(kind, raw):
    """One dataclass of the model (a Measurement, a Gpu ...) from its JSON object, read as Report.from_dict
    reads it; ValueError when it is not that shape."""
    return record(kind, raw, _LENIENT)
