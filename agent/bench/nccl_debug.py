"""What an NCCL_DEBUG=INFO log says NCCL really did: its version, the network it chose (IB, Socket, a
plugin such as AWS Libfabric), the HCAs and socket interfaces, the transport of every channel inside a
node (P2P/IPC, P2P/CUMEM, SHM, ...) and between nodes (NET/IB/0/GDRDMA, NET/Socket/1, ...), and every
NCCL WARN. Lines may carry mpirun (`[1,0]<stdout>:`) or srun (`0: `) prefixes; nccl-tests tables,
shell prompts and `...` cuts are skipped; a truncated log gives what it holds.

A transport NCCL prints after "via" is between nodes when it goes over the network plugin (`NET/`),
inside a node otherwise; `/GDRDMA` at its end means GPUDirect RDMA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nodecheck.bench.nccl_tests import LAUNCHER_PREFIX
from nodecheck.errors import ParseError
from nodecheck.limits import MAX_COMMAND_OUTPUT

_NCCL_LINE = re.compile(r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL (?P<level>INFO|WARN) ?(?P<text>.*)$")
_VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)")
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_SOCKET = re.compile(r"^(?:Bootstrap|NET/Socket) : Using (.*)$")
_SOCKET_IFACE = re.compile(r"(?:\[\d+\])?([A-Za-z0-9_.@-]+):[0-9a-fA-F.:%]+<\d+>")
_IB = re.compile(r"^NET/(IB\S*) : Using (.*)$")
_IB_DEVICE = re.compile(r"\[\d+\]([A-Za-z0-9_.-]+:\d+)")
_CHANNEL = re.compile(r"^Channel \d+(?:/\d+)? : (?P<src>\d+)\[[0-9a-fA-F]+\] -> (?P<dst>\d+)\[[0-9a-fA-F]+\]"
                      r"(?: \[(?:send|receive)\])? via (?P<via>.+?)\s*$")
_NVLS_CHANNELS = re.compile(r"\b(\d+) nvls channels\b")
_NVLS_UNAVAILABLE = re.compile(r"NVLS (?:multicast support is not available|disabled)", re.I)
_NVLS_IN_USE = re.compile(r"\bNVLS (?:comm|multicast support is available)", re.I)
_TESTS_HOST = re.compile(r"^#\s+Rank\s+\d+\b.*?\bon\s+(\S+)\s+device\b")
MAX_WARNINGS = 50  # quoted warnings kept; the count is always whole


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
    nccl_lines: int = 0  # lines that were NCCL's own (0: this is not an NCCL debug log)


def parse_nccl_debug(text: str) -> NcclRun:
    """The facts of an NCCL debug log; ParseError when it is too large or holds no NCCL line at all."""
    if len(text) > MAX_COMMAND_OUTPUT:
        raise ParseError(f"NCCL log: more than {MAX_COMMAND_OUTPUT >> 20} MiB: not read")
    run = NcclRun()
    inter, intra, net_names, nodes, warnings = set(), set(), [], {}, {}
    nvls_channels: list[int] = []
    for raw in text.splitlines():
        line = LAUNCHER_PREFIX.sub("", raw.rstrip("\r"))
        if run.nccl_version is None and (version := _VERSION.search(line)):
            run.nccl_version = version[1]
        if tests_host := _TESTS_HOST.match(line):
            nodes.setdefault(tests_host[1], None)
            continue
        match = _NCCL_LINE.match(line)
        if match is None:
            continue
        run.nccl_lines += 1
        nodes.setdefault(match["host"], None)
        body = match["text"].strip()
        if match["level"] == "WARN":
            run.warning_count += 1
            if len(warnings) < MAX_WARNINGS:
                warnings.setdefault(body, None)
            continue
        _read_info(body, run, inter, intra, net_names, nvls_channels)
    if run.nccl_lines == 0:
        raise ParseError("no NCCL debug line (host:pid:tid [dev] NCCL INFO ...): run with NCCL_DEBUG=INFO")
    run.inter_node_transports, run.intra_node_transports = sorted(inter), sorted(intra)
    run.network = run.network or (net_names[0] if net_names else None)
    if inter:
        run.gdr = any(t.endswith("/GDRDMA") for t in inter)
    if run.nvls is None and nvls_channels:
        run.nvls = max(nvls_channels) > 0
    run.nodes, run.warnings = list(nodes), list(warnings)
    return run


def _read_info(body: str, run: NcclRun, inter: set, intra: set, net_names: list, nvls_channels: list) -> None:
    if network := _NETWORK.match(body):
        run.network = run.network or network[1]
    elif socket := _SOCKET.match(body):
        for name in _SOCKET_IFACE.findall(socket[1]):
            if name not in run.socket_ifaces:
                run.socket_ifaces.append(name)
        if body.startswith("NET/Socket") and "Socket" not in net_names:
            net_names.append("Socket")
    elif ib := _IB.match(body):
        run.ib_devices += [d for d in _IB_DEVICE.findall(ib[2]) if d not in run.ib_devices]
        if ib[1] not in net_names:
            net_names.append(ib[1])
    elif channel := _CHANNEL.match(body):
        via = channel["via"]
        if via.startswith("NET/"):
            inter.add(via)
            name = via.split("/")[1]
            if name not in net_names:
                net_names.append(name)
        else:
            intra.add(via)
    elif channels := _NVLS_CHANNELS.search(body):
        nvls_channels.append(int(channels[1]))
    elif _NVLS_UNAVAILABLE.search(body):
        run.nvls = False
    elif _NVLS_IN_USE.search(body) and run.nvls is None:
        run.nvls = True


MAX_QUOTED = 10  # NCCL warnings turned into findings, each quoted; the rest counted in the last


def nccl_findings(run: NcclRun, report) -> list:
    """What the log says went wrong on a node like `report` (this node, or a snapshot's)."""
    from nodecheck.model import Finding, link_family

    findings = []
    over_sockets = any(t.startswith("NET/Socket") for t in run.inter_node_transports) or (
        run.network == "Socket" and bool(run.inter_node_transports))
    rdma_up = [n.rdma_device for n in report.rdma_nics_up()]
    if over_sockets and rdma_up:
        findings.append(Finding("nccl_socket_fallback", "warning", "nccl", "NET/Socket", ", ".join(rdma_up),
                                f"NCCL sent inter-node traffic over TCP sockets while RDMA NICs are up ({', '.join(rdma_up)}): "
                                "check NCCL_IB_DISABLE, NCCL_IB_HCA, the net plugin, and `NCCL INFO NET/IB` in the log"))
    if run.gdr is False and not over_sockets:
        findings.append(Finding("nccl_no_gdr", "warning", "nccl", ", ".join(run.inter_node_transports), "/GDRDMA",
                                "NCCL's network channels run without GPUDirect RDMA: inter-node data is staged through "
                                "host memory; load nvidia_peermem (or use DMA-BUF), check NCCL_NET_GDR_LEVEL and the "
                                "GPU-NIC distance"))
    near = [l for l in report.links if isinstance(l.a, int) and isinstance(l.b, int)
            and link_family(l.type) in ("NV", "PIX", "PXB")]
    shm = [t for t in run.intra_node_transports if t.startswith("SHM")]
    if shm and near:
        findings.append(Finding("nccl_p2p_disabled", "warning", "nccl", ", ".join(shm), "P2P or NVLS",
                                f"GPUs of one node talked over {', '.join(shm)} (host memory) although they are linked by "
                                f"{near[0].type}: P2P is off (NCCL_P2P_DISABLE, ACS redirect, the IOMMU, or a container "
                                "without IPC)"))
    for text in run.warnings[:MAX_QUOTED]:
        findings.append(Finding("nccl_warning", "warning", "nccl", "NCCL WARN", "none", f"NCCL WARN {text}"[:500]))
    if run.warning_count > MAX_QUOTED:
        findings[-1].message += f" (+{run.warning_count - MAX_QUOTED} more NCCL WARN lines)"
    return findings
