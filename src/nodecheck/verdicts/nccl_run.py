"""What NCCL really did (NcclRun: read from a debug log by bench.nccl_debug, or from its JSON form in a
measurement's details) and what is wrong with that on a node like the Report's. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from nodecheck.assemble.nvlinks import nvlink_pairs
from nodecheck.checks.nccl_conf import DISABLING, hca_shortfall
from nodecheck.checks.roce import roce_gid_findings
from nodecheck.core.link_types import link_family, nccl_reach
from nodecheck.core.units import first_of
from nodecheck.report.findings import Finding
from nodecheck.verdicts.nccl_gdr import gdr_finding
from nodecheck.verdicts.nccl_ib_errors import ib_error_findings
from nodecheck.verdicts.nccl_mnnvl import mnnvl_findings
from nodecheck.verdicts.nccl_nvls import nvls_findings

MAX_HOSTS, MAX_NET_DEVICES, MAX_SETTINGS, MAX_IB_ERRORS, MAX_BUS_IDS = 1024, 64, 64, 64, 256
MAX_FABRIC_GPUS = 1024  # GPUs whose fabric reading is kept: an NVL576 domain's; a log naming more is garbage past these
MAX_COMM_KINDS = 16  # distinct (nNodes, MNNVL) pairs kept
MAX_NVLS_ERRORS = 64  # distinct (host, CUDA error) NVLS failures kept; the lines are always counted


@dataclass
class NcclRun:
    nccl_version: str | None = None
    network: str | None = None  # "Using network X", else the NET/<name> NCCL set up or its channels name
    ib_devices: list[str] = field(default_factory=list)  # HCA:port from "NET/IB : Using"
    socket_ifaces: list[str] = field(default_factory=list)  # Bootstrap and NET/Socket interfaces
    inter_node_transports: list[str] = field(default_factory=list)  # sorted, distinct
    intra_node_transports: list[str] = field(default_factory=list)
    gdr: bool | None = None  # any NET channel with /GDRDMA; False: NET channels without it; None: no NET channel
    nvls: bool | None = None  # NVLS in use; False: reported unavailable or 0 channels; None: not said
    warning_count: int = 0
    warnings: list[str] = field(default_factory=list)  # the NCCL WARN lines' text, distinct, in order
    nodes: list[str] = field(default_factory=list)  # host names, in order of appearance
    # per host, per local GPU (as NCCL prints it in a channel line: a bus id such as "92000", or a CUDA device
    # number), the network devices its channels use (the N of NET/IB/N; PXN channels through a peer excluded)
    gpu_net_devices: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    net_device_names: dict[str, dict[str, str]] = field(default_factory=dict)  # per host: "N" -> HCA:port (NET/IB : Using)
    nccl_lines: int = 0  # lines that were NCCL's own (0: this is not an NCCL debug log)
    settings: dict[str, str] = field(default_factory=dict)  # "NCCL_X set by environment to V": the job's or nccl.conf's
    ofi_provider: str | None = None  # aws-ofi-nccl's "NET/OFI Selected provider is tcp": the libfabric provider under it
    nranks: int | None = None  # the job's ranks: the largest "nranks N" a comm line names, or rank + 1 a channel names
    # NET/IB work requests that failed ("Got completion from peer P with status=N ... hca H"), each distinct
    # {host, peer, status, hca} with its count (at most MAX_IB_ERRORS); their WARN lines are not quoted one by one
    ib_errors: list[dict] = field(default_factory=list)
    ib_error_lines: int = 0
    addresses: dict[str, str] = field(default_factory=dict)  # an address a host's Bootstrap/OOB line names -> the host
    # why no communicator spans the log's hosts (each ran a job of its own), or None: then several hosts are no job
    # across nodes
    separate_hosts: str | None = None
    # why NCCL took one host for several (its lines hold more ranks of a communicator than NCCL's "localRanks" for it),
    # or None; and whether NCCL's per-node counts hold every rank each host printed (the log is part of a job across
    # nodes, as NCCL counted them); both from bench.nccl_hosts
    host_split: str | None = None
    local_ranks_fit: bool = False
    # the GPUs of each SHM channel as its line names them ("1[1] -> 2[2]": NVML indices; "0[18000]": bus ids before NCCL
    # 2.18.3, src/transport/shm.cc), distinct, at most MAX_NET_DEVICES
    shm_pairs: list[list[str]] = field(default_factory=list)
    # why NCCL ran without GPUDirect RDMA, as its INFO lines say (bench.nccl_debug): a NIC it found no GPUDirect on
    # ("mlx5_1 (no module)", or aws-ofi-nccl's line), and its distance rule per GPU and NIC ("GPU 18000 / HCA 0
    # (distance 5 > 4)"); each distinct, at most MAX_NET_DEVICES
    gdr_off_nics: list[str] = field(default_factory=list)
    gdr_off_distance: list[str] = field(default_factory=list)
    # the bus id of each rank's GPU as NCCL's Init lines print it ("... cudaDev 0 nvmlDev 0 busId 1c000 commId ..."),
    # distinct, at most MAX_BUS_IDS: which node's GPUs the log is of
    bus_ids: list[str] = field(default_factory=list)
    # NCCL's reading of each rank's GPU fabric ("MNNVL busId 0x801000 fabric UUID u0.u1 cliqueId 0x2786 state 3 healthMask
    # 0xaa", bench.nccl_mnnvl): {host, bus_id, uuid (null: 0.0, no multi-node NVLink domain), clique_id, state,
    # health_mask}, one per host and bus id, at most 1024; and each communicator's [nNodes, MNNVL] ("... MNNVL 0"), distinct
    fabric: list[dict] = field(default_factory=list)
    comm_mnnvl: list[list[int]] = field(default_factory=list)
    # NCCL's NVLS transport failing a CUDA call ("transport/nvls.cc:254 NCCL WARN Cuda failure 401 '...'", bench.nccl_nvls):
    # {host, code (null: NCCL before 2.19 printed none), error, count}, per host and error; their WARN lines not quoted
    nvls_errors: list[dict] = field(default_factory=list)
    nvls_error_lines: int = 0


MAX_QUOTED = 10  # NCCL warnings turned into findings, each quoted; the rest counted in the last
# libfabric providers that carry data over TCP/IP: aws-ofi-nccl on them is a socket network under the plugin's name
# ("Using network AWS Libfabric" reads the same either way; "NET/OFI Selected provider is tcp" tells them apart)
SOCKET_PROVIDERS = ("tcp", "sockets", "udp")
GID_SETTINGS = ("NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_ADDR_RANGE")


def nccl_findings(run: NcclRun, report) -> list:
    """What the log says went wrong on a node like `report` (this node, or a snapshot's)."""
    findings = []
    # NCCL's network is sockets ("NET/IB : No device found" then NET/Socket; aws-ofi-nccl on libfabric's tcp provider)
    # and data crossed nodes: NET channels, records from more than one host (an excerpt without channel lines), or more
    # ranks than this node has GPUs (a container's or an anonymised host's paste names one host). One node over
    # loopback is no fallback.
    beyond_node = bool(run.nranks and report.gpus and run.nranks > len(report.gpus))  # more ranks than this node's GPUs
    tcp_provider = run.ofi_provider in SOCKET_PROVIDERS
    several_hosts = len(run.nodes) > 1 and not run.separate_hosts  # hosts that each ran their own job cross no node
    across = bool(run.inter_node_transports) or several_hosts or beyond_node
    socket_network = run.network == "Socket" or tcp_provider
    over_sockets = across and (socket_network or any(t.startswith("NET/Socket") for t in run.inter_node_transports))
    rdma_up = [n.rdma_device for n in report.rdma_nics_up()]
    # every line names one host, its ranks fit this node's GPUs, yet channels went through the network (a host name
    # shared by two machines, "ubuntu", names more ranks than one node holds)
    # NCCL's own per-node count settles it where it gives one: more ranks on the host than it counted per node is a host
    # it split; every rank within it is one host's part of a job across nodes (a paste of that host's lines)
    one_host = (len(run.nodes) == 1 and bool(run.inter_node_transports) and bool(run.nranks and report.gpus)
                and not beyond_node and (run.host_split is not None or not run.local_ranks_fit))
    if one_host:  # every line names one host, yet channels went through the network: NCCL saw several hosts
        findings.append(_one_host(run))
    elif (over_sockets or tcp_provider) and rdma_up:  # the plugin found no RDMA device
        under = f" (aws-ofi-nccl on libfabric's {run.ofi_provider} provider)" if tcp_provider else ""
        findings.append(Finding("nccl_socket_fallback", "warning", "nccl", f"NET/Socket{under}", ", ".join(rdma_up),
                                f"NCCL sent inter-node traffic over TCP sockets{under} while RDMA NICs are up "
                                f"({', '.join(rdma_up)}): check NCCL_IB_DISABLE, NCCL_IB_HCA, the net plugin (FI_PROVIDER, "
                                "the EFA or CXI devices in the container), and `NCCL INFO NET/IB` in the log"))
    if run.gdr is False and not over_sockets:
        findings.append(gdr_finding(run, report))
    shm = [t for t in run.intra_node_transports if t.startswith("SHM")]
    if shm and (near := _shm_where_p2p_is_due(run, report)):
        findings.append(Finding("nccl_p2p_disabled", "warning", "nccl", ", ".join(shm), "P2P or NVLS",
                                f"GPUs of one node talked over {', '.join(shm)} (host memory) although {near} link them: "
                                "P2P is off (ACS redirect, the IOMMU, a container without IPC, or NCCL_P2P_DISABLE)"))
    findings += _rail_mismatches(run, report)
    for name, value in run.settings.items():
        values, effect = DISABLING.get(name, ((), ""))
        if effect and value and (values is None or value.upper() in values):
            findings.append(Finding("nccl_setting", "warning", "nccl", f"{name}={value[:40]}", "unset",
                                    f"the NCCL run took {name}={value[:40]} from its environment (the job's, or "
                                    f"/etc/nccl.conf's): a debugging variable (NCCL: \"should not be used in production\"); "
                                    f"{effect}"))
    shortfall = hca_shortfall(report, run.settings.get("NCCL_IB_HCA"))
    if shortfall and run.settings.get("NCCL_IB_HCA") != (report.nccl_conf() or {}).get("NCCL_IB_HCA"):  # else nccl_config
        findings.append(Finding("nccl_setting", "warning", "nccl", f"NCCL_IB_HCA={shortfall[0][:40]}", shortfall[1],
                                f"the NCCL run took its NCCL_IB_HCA from its environment (the job's): {shortfall[2]}; its "
                                "bandwidth is judged against the rails it selects, so a slow job can pass here"))
    if any(name in run.settings for name in GID_SETTINGS):  # the job pinned how NCCL picks its RoCE GID
        named = {f.subject for f in report.findings if f.kind == "roce_gid_unroutable"}
        findings += [f for f in roce_gid_findings(report, settings=run.settings, where="the NCCL run's environment")
                     if f.subject not in named]
    findings += ib_error_findings(run.ib_errors, run.addresses) + mnnvl_findings(run) + nvls_findings(run)
    for text in run.warnings[:MAX_QUOTED]:
        findings.append(Finding("nccl_warning", "warning", "nccl", "NCCL WARN", "none", f"NCCL WARN {text}"[:500]))
    # the IB and NVLS errors are said in their own findings
    unquoted = run.warning_count - run.ib_error_lines - run.nvls_error_lines - MAX_QUOTED
    if unquoted > 0 and run.warnings:
        findings[-1].message += f" (+{unquoted} more NCCL WARN lines)"
    return findings


def _one_host(run: NcclRun) -> Finding:
    """Channels of a log naming one host went through the network: NCCL took its ranks for different hosts where its
    own counts show it (a warning), else said as the question it is (info): an excerpt of one host of a job across
    nodes reads the same where NCCL printed no per-node count."""
    host, via = run.nodes[0][:60], ", ".join(run.inter_node_transports[:3])
    causes = ("(NCCL_HOSTID, containers with their own hostname or /dev/shm, a rank that sees only its own GPU; or two "
              "machines share the name)")
    if run.host_split:
        return Finding("nccl_p2p_disabled", "warning", "nccl", via, "P2P or SHM",
                       f"NCCL's channels between GPUs of one host ({host}) went through the network ({via}): "
                       f"{run.host_split}, so NCCL took its ranks for different hosts {causes}, and they do not use "
                       "NVLink or PCIe peer-to-peer")
    return Finding("nccl_p2p_disabled", "info", "nccl", via, "P2P or SHM",
                   f"every line of the log names one host ({host}), yet channels went through the network ({via}) and "
                   "its ranks fit this node: if the job ran on that host alone, NCCL took its ranks for different hosts "
                   f"{causes} and they do not use NVLink or PCIe peer-to-peer; if it spanned nodes, the log holds one "
                   "host's lines: give every host's")


def _p2p_reach(settings: dict) -> tuple:
    """The topo -m link families over which the run's NCCL takes P2P (SHM past them; PATH_SYS only for two GPUs on an
    AMD CPU): NCCL's default, or what its environment set; NCCL_P2P_DISABLE=1 is LOC."""
    if settings.get("NCCL_P2P_DISABLE", "").strip() == "1":
        return ()
    return nccl_reach(settings.get("NCCL_P2P_LEVEL", ""))


def _shm_where_p2p_is_due(run: NcclRun, report) -> str | None:
    """The GPUs an SHM channel joined although NVLink or a PCIe switch links them on the node ("gpu6 and gpu7 (NV18)"),
    or None. A pair whose P2P NVML says it does not support (GeForce boards: `nvidia-smi topo -p2p r`) is no finding.
    A log whose SHM lines name no GPUs (NCCL before 2.7) is held against the node's closest link."""
    links = nvlink_pairs(report)
    due_over = _p2p_reach(run.settings)
    if not run.shm_pairs:
        near = [t for t in links.values() if link_family(t) in due_over]
        return f"its GPUs ({near[0]})" if near else None
    due = []
    for a, b in run.shm_pairs:
        ga, gb = _local_gpu(a, report.gpus), _local_gpu(b, report.gpus)
        if ga is None or gb is None or ga is gb:
            continue
        kind = links.get(tuple(sorted((ga.index, gb.index))))
        if not kind or link_family(kind) not in due_over or _no_p2p(ga, gb) or _no_p2p(gb, ga):
            continue
        said = f"gpu{min(ga.index, gb.index)} and gpu{max(ga.index, gb.index)} ({kind})"
        if said not in due:
            due.append(said)
    return first_of(due, 4) if due else None


def _no_p2p(gpu, peer) -> bool:
    """Whether NVML says `gpu` reads `peer` without P2P (`nvidia-smi topo -p2p r`: "GPU not supported" on GeForce)."""
    return (gpu.p2p_read or {}).get(f"gpu{peer.index}", "ok") != "ok"


def other_node(run: NcclRun, report, where: str) -> str | None:
    """Why the log is of another node's GPUs, or None: NCCL's Init lines name each rank's GPU by its bus id, and none
    of them is one of the node's. Held against another board's links and NICs, a log says what is not so of this node
    (an 8x L20 node's SHM between PCIe-switch pairs would read as P2P off across the HGX node's NVLinks)."""
    ours = {nccl_bus_id(g.pci_bus_id) for g in report.gpus}
    theirs = {nccl_bus_id(b) for b in run.bus_ids} - {None}
    if not theirs or not ours or None in ours or theirs & ours:
        return None
    said_theirs, said_ours = (first_of([f"{i:x}" for i in sorted(ids)], 8) for ids in (theirs, ours))
    return (f"the log's GPUs are at bus ids {said_theirs} (NCCL's \"busId\"), none of {where}'s ({said_ours}): a log "
            "is judged against its own node (--from a snapshot of it, `nodecheck snapshot` there)")


def without_node(report):
    """The Report with nothing of its node's hardware: what a log says by itself is judged against it, nothing else."""
    return replace(report, gpus=[], nics=[], links=[], paths=[], findings=[], platform=None, pcie_paths=None)


def nccl_bus_id(pci: str | None) -> int | None:
    """NCCL's number for a PCI address: '0000:92:00.0' -> 0x92000 (printed "92000" in channel lines)."""
    digits = (pci or "").replace(":", "").replace(".", "")
    return int(digits, 16) if digits and all(c in "0123456789abcdefABCDEF" for c in digits) else None


def _local_gpu(label: str, gpus: list):
    """The GPU a channel line's bracket names: a bus id when one of this node's GPUs has it, else a CUDA
    device number (NCCL 2.19 and later print that)."""
    bus = nccl_bus_id(label)
    by_bus = [g for g in gpus if nccl_bus_id(g.pci_bus_id) == bus]
    if by_bus:
        return by_bus[0]
    return gpus[int(label)] if label.isdecimal() and int(label) < len(gpus) else None


def _rail_mismatches(run: NcclRun, report) -> list:
    """A GPU of this node whose network channels use only HCAs that are not its nearest NICs by the
    topology (nvidia-smi topo -m): its inter-node traffic crosses PCIe switches or sockets. Judged only
    for the log's lines from this node (by host name) and when NCCL named its HCAs."""
    hostname = (report.node.get("hostname") or "").split(".")[0]
    host = next((h for h in run.gpu_net_devices if h.split(".")[0] == hostname), None) if hostname else None
    names = run.net_device_names.get(host or "", {})
    findings = []
    for label, devices in (run.gpu_net_devices.get(host, {}) if host else {}).items():
        gpu = _local_gpu(label, report.gpus)
        used = sorted({names[str(d)].split(":")[0] for d in devices if str(d) in names})
        if gpu is None or not gpu.nearest_nics or not used or set(used) & set(gpu.nearest_nics):
            continue
        findings.append(Finding("nccl_rail_mismatch", "warning", f"gpu{gpu.index}", ", ".join(used), ", ".join(gpu.nearest_nics),
                                f"NCCL sent gpu{gpu.index}'s inter-node traffic over {', '.join(used)}, not its nearest NIC "
                                f"({', '.join(gpu.nearest_nics)}) by the topology: the data crosses PCIe switches or the "
                                "socket interconnect; check NCCL_IB_HCA, the NIC's state, and NCCL_CROSS_NIC"))
    return sorted(findings, key=lambda f: int(f.subject[3:]))


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _per_host(inner):
    return lambda value: isinstance(value, dict) and all(
        isinstance(host, str) and isinstance(gpus, dict) and all(isinstance(k, str) and inner(v) for k, v in gpus.items())
        for host, gpus in value.items())


_SHAPES = {
    "nccl_version": lambda v: isinstance(v, str), "network": lambda v: isinstance(v, str),
    "ib_devices": _strings, "socket_ifaces": _strings, "inter_node_transports": _strings,
    "intra_node_transports": _strings, "warnings": _strings, "nodes": _strings,
    "gdr": lambda v: isinstance(v, bool), "nvls": lambda v: isinstance(v, bool),
    "warning_count": lambda v: type(v) is int and v >= 0, "nccl_lines": lambda v: type(v) is int and v >= 0,
    "ofi_provider": lambda v: isinstance(v, str) and len(v) <= 40, "nranks": lambda v: type(v) is int and 0 < v < 1 << 24,
    "gpu_net_devices": _per_host(lambda v: isinstance(v, list) and all(type(i) is int for i in v)),
    "net_device_names": _per_host(lambda v: isinstance(v, str)),
    "settings": lambda v: isinstance(v, dict) and len(v) <= MAX_SETTINGS and all(
        isinstance(k, str) and isinstance(x, str) and len(k) <= 80 and len(x) <= 128 for k, x in v.items()),
    "ib_errors": lambda v: isinstance(v, list) and len(v) <= MAX_IB_ERRORS and all(_ib_error(e) for e in v),
    "ib_error_lines": lambda v: type(v) is int and v >= 0,
    "nvls_errors": lambda v: isinstance(v, list) and len(v) <= MAX_NVLS_ERRORS and all(_nvls_error(e) for e in v),
    "nvls_error_lines": lambda v: type(v) is int and v >= 0,
    "separate_hosts": lambda v: isinstance(v, str) and len(v) <= 300,
    "host_split": lambda v: isinstance(v, str) and len(v) <= 300,
    "local_ranks_fit": lambda v: isinstance(v, bool),
    "gdr_off_nics": lambda v: _strings(v) and len(v) <= MAX_NET_DEVICES and all(len(x) <= 200 for x in v),
    "gdr_off_distance": lambda v: _strings(v) and len(v) <= MAX_NET_DEVICES and all(len(x) <= 200 for x in v),
    "bus_ids": lambda v: _strings(v) and len(v) <= MAX_BUS_IDS and all(len(x) <= 16 for x in v),
    "shm_pairs": lambda v: isinstance(v, list) and len(v) <= MAX_NET_DEVICES and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(g, str) and len(g) <= 16 for g in p) for p in v),
    "fabric": lambda v: isinstance(v, list) and len(v) <= MAX_FABRIC_GPUS and all(_fabric_entry(e) for e in v),
    "comm_mnnvl": lambda v: isinstance(v, list) and len(v) <= MAX_COMM_KINDS and all(
        isinstance(p, list) and len(p) == 2 and all(type(x) is int and 0 <= x < 1 << 24 for x in p) for p in v),
    "addresses": lambda v: isinstance(v, dict) and len(v) <= MAX_HOSTS and all(
        isinstance(k, str) and isinstance(x, str) and len(k) <= 80 and len(x) <= 255 for k, x in v.items()),
}


def _ib_error(entry) -> bool:
    """One failed-IB-transfer record of a Report read from a file (untrusted): its exact shape."""
    return (isinstance(entry, dict) and set(entry) == {"host", "peer", "status", "hca", "count"}
            and isinstance(entry["host"], str) and len(entry["host"]) <= 255
            and all(entry[k] is None or (isinstance(entry[k], str) and len(entry[k]) <= 80) for k in ("peer", "hca"))
            and type(entry["status"]) is int and 0 <= entry["status"] < 10_000 and type(entry["count"]) is int
            and entry["count"] > 0)


def _nvls_error(entry) -> bool:
    """One NVLS failure record of a Report read from a file (untrusted): its exact shape."""
    return (isinstance(entry, dict) and set(entry) == {"host", "code", "error", "count"}
            and isinstance(entry["host"], str) and len(entry["host"]) <= 255 and isinstance(entry["error"], str)
            and len(entry["error"]) <= 80 and (entry["code"] is None or type(entry["code"]) is int and 0 <= entry["code"] < 100_000)
            and type(entry["count"]) is int and entry["count"] > 0)


def _fabric_entry(entry) -> bool:
    """One GPU's fabric reading of a Report read from a file (untrusted): its exact shape."""
    return (isinstance(entry, dict) and set(entry) == {"host", "bus_id", "uuid", "clique_id", "state", "health_mask"}
            and isinstance(entry["host"], str) and len(entry["host"]) <= 255 and isinstance(entry["bus_id"], str)
            and len(entry["bus_id"]) <= 16 and (entry["uuid"] is None or isinstance(entry["uuid"], str) and len(entry["uuid"]) <= 33)
            and all(type(entry[k]) is int and 0 <= entry[k] < 1 << 32 for k in ("clique_id", "state", "health_mask")))


def nccl_run_from_details(data) -> NcclRun | None:
    """An NcclRun from its JSON form (a measurement's details["nccl"]); a Report read from a file is
    untrusted: a field of the wrong shape takes its default. None when it is not an object."""
    if not isinstance(data, dict):
        return None
    run = NcclRun()
    for f in fields(NcclRun):
        if f.name in data and _SHAPES[f.name](data[f.name]):
            setattr(run, f.name, data[f.name])
    return run
