"""What an NCCL_DEBUG=INFO log says NCCL really did: its version, the network it chose (IB, Socket, a
plugin such as AWS Libfabric), the HCAs and socket interfaces, the transport of every channel inside a
node (P2P/IPC, P2P/CUMEM, SHM, ...) and between nodes (NET/IB/0/GDRDMA, NET/Socket/1, ...), the
parameters it took from its environment ("NCCL_PROTO set by environment to simple"), and every NCCL WARN.
Lines may carry mpirun (`[1,0]<stdout>:`) or srun (`0: `) prefixes; nccl-tests tables, shell prompts and
`...` cuts are skipped; a truncated log gives what it holds.

A transport NCCL prints after "via" is between nodes when it goes over the network plugin (`NET/`),
inside a node otherwise; `/GDRDMA` at its end means GPUDirect RDMA.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

from nodecheck.bench.nccl_hosts import MAX_COMM_SIZE, MAX_COMM_SIZES, host_split, note_local_ranks, separate_hosts
from nodecheck.bench.nccl_interleaved import split_record
from nodecheck.bench.nccl_mnnvl import note_mnnvl
from nodecheck.bench.nccl_nvls import note_nvls_failure
from nodecheck.bench.nccl_tests import DEVICE_LINE, LAUNCHER_PREFIX
from nodecheck.core.errors import ParseError, ProbeFailed
from nodecheck.core.limits import MAX_COMMAND_OUTPUT
from nodecheck.core.units import tally
from nodecheck.host.files import read_bounded
from nodecheck.verdicts.nccl_run import MAX_BUS_IDS, MAX_HOSTS, MAX_IB_ERRORS, MAX_NET_DEVICES, MAX_SETTINGS, NcclRun

# Where an NCCL record starts, anywhere in a line: an optional host:pid:tid (the host may be empty), an optional
# [dev], the level. Linear: a host starts only where no name character precedes it.
_RECORD = re.compile(r"(?:(?<![\w.:-])(?P<host>[\w.-]*):(?P<pid>\d+):(?P<tid>\d+)\s+)?(?:\[(?P<dev>\d+)\]\s+)?\bNCCL (?P<level>INFO|WARN)\b ?")
_HOSTNAME = re.compile(r"[\w.-]*[A-Za-z_-]")  # a host name holds a letter, '-' or '_': 12:00:00 is a time of day
# A token a paste puts before the next record on the same line: its timestamp (ISO date and time, epoch ms,
# time of day) or rank tag
_STAMP = re.compile(r"\[?(?:\d{4}-\d{2}-\d{2}(?:T[\d:.,]+(?:Z|[+-]\d{2}:?\d{2})?)?|\d{10,13}|\d{2}:\d{2}:\d{2}(?:[.,]\d+)?Z?)\]?|\[\d+\]")
_VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)")
_NETWORK = re.compile(r"^Using (?:internal )?[Nn]etwork (\S.*)$")  # NCCL 2.3: "Using internal Network Socket"
_SOCKET = re.compile(r"^(?:Bootstrap ?|NET/Socket ): Using (.*)$")  # NCCL 2.24.3 on: "Bootstrap: Using eth0:10.0.0.1<0>"
_IB = re.compile(r"^NET/(IB\S*) : Using (.*)$")
_IB_DEVICE = re.compile(r"\[(\d+)\]([A-Za-z0-9_.-]+:\d+)")  # [index]HCA:port
# "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"; NCCL before 2.7 printed "Ring 00 : 15 -> 0 [send] via NET/Socket/0"
_CHANNEL = re.compile(r"^(?:Channel|Ring) \d{1,4}(?:/\d{1,4})? : (?P<src>\d{1,7})(?:\[(?P<src_gpu>[0-9a-fA-F]{1,16})\])? -> "
                      r"(?P<dst>\d{1,7})(?:\[(?P<dst_gpu>[0-9a-fA-F]{1,16})\])?(?: \[(?P<side>send|receive)\])? via (?P<via>\S.*)$")
_RANKS = re.compile(r"\brank (\d{1,7}) n[Rr]anks (\d{1,7})\b")  # "comm 0x.. rank 3 nranks 16", "rank 1 nRanks 2 nNodes 1"
_BUS_ID = re.compile(r"\bbusId ([0-9a-fA-F]{1,16})\b")  # after "rank R nranks N" in a comm's Init lines (NCCL 2.9 on)
_OFI_PROVIDER = re.compile(r"^NET/OFI Selected [Pp]rovider is ([A-Za-z0-9_;.-]{1,40})")
# What NCCL prints after its "host:pid:tid [dev] NCCL INFO" head, as a paste that lost the head has it (a grep, a
# README's excerpt): read as NCCL's own lines only where the whole text holds no headed line at all
_BARE = re.compile(r"^(?:NET/OFI |NET/IB ?: |NET/Socket ?: |NET/Plugin|Using network |Channel \d{1,4}/\d{1,4} : \d|NCCL version \d|MNNVL busId 0x|Bootstrap ?: Using )")
# a parameter NCCL took from its environment, where /etc/nccl.conf's values land too (src/misc/param.cc: "NCCL_PROTO set
# by environment to simple"); the HCA and interface selections say it shorter (src/transport/net_ib/init.cc: "NCCL_IB_HCA
# set to mlx5_2:1,mlx5_0:1", src/misc/socket.cc: "NCCL_SOCKET_IFNAME set to eth0")
_SET_BY = re.compile(r"^(NCCL_[A-Z0-9_]{1,64}) set (?:by environment )?to (.{0,128})$")
_NVLS_CHANNELS = re.compile(r"\b(\d+) nvls channels\b")
_NVLS_UNAVAILABLE = re.compile(r"NVLS (?:multicast support is not available|disabled)", re.I)
_NVLS_IN_USE = re.compile(r"\bNVLS (?:comm|multicast support is available)", re.I)
# a time stamp before a line: "[2026-01-15 02:30:45] NET/OFI ...", and RFC 3339 as `kubectl logs --timestamps` and
# `docker logs -t` print it ("2026-01-15T02:30:45.123456789Z host:1:2 [0] transport/nvls.cc:254 NCCL WARN ...")
_STAMP_HEAD = re.compile(r"^(?:(?:\[[\d\-T:.,Z ]{8,40}\]|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)\s*){1,2}")
# NCCL's WARN head: "host:pid:tid [dev] file:line", from 2.30 with the function after it ("transport/nvls.cc:379
# (nvlsAllocateMem)", src/debug.cc); from 2.26 a WARN line starts with its time ("[2025-07-21 19:05:29] ", _STAMP_HEAD)
_SOURCE_HEAD = re.compile(r"(?P<host>[\w.-]{0,64}):\d{1,10}:\d{1,10}(?: \[\d{1,4}\])? (?P<source>[\w./-]{1,80}:\d{1,6})"
                          r"(?: \((?:[^()\s]|\(\)){1,120}\))?")
_SOURCE_TAIL = re.compile(r"(?<=[\s)\]>|])" + _SOURCE_HEAD.pattern + r"$")
# NCCL's IB transport reporting a failed work request (transport/net_ib.cc, and the HPC-X plugin's ib_plugin.c): "NET/IB :
# Got completion with error 12, opcode 0, len 0, vendor err 129" (older NCCL), "... from peer 10.0.35.1<49189> with
# error 4, ..." , "... from peer 10.216.210.236<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv) ...", later
# "... hca mlx5_10" at the end, and the newest "with status=transport retry counter exceeded(12) ...": the peer (its
# address as NCCL's socket prints it, host<port>), the ibv_wc_status, the local HCA
_IB_COMPLETION = re.compile(r"NET/IB\w{0,16}(?:/GIN)? ?: ?Got completion (?:from peer (?:(?P<peer>\S{1,80}) )?)?with "
                            r"(?:error (?P<error>\d{1,4})\b|status=(?:[A-Za-z][^()\n]{0,63}\()?(?P<status>\d{1,4})\b)")
_IB_HCA = re.compile(r" hca ([\w.-]{1,40})\s{0,8}$")
# an interface and its address as NCCL's socket lines print them: "[0]eth0:10.0.35.1<0>", "ib0:fe80::1%ib0<0>"
_INTERFACE = re.compile(r"(?:\[\d+\])?([A-Za-z0-9_.@-]+):([0-9a-fA-F.:%A-Za-z]{2,64})<\d+>")
# Why NCCL ran a NIC without GPUDirect RDMA, as it says at INFO level (NET subsystem). The NIC side, no GPUDirect on
# that HCA at all ("NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1' (no module)": no peer-memory module, no DMA-BUF;
# NCCL 2.5 to 2.12 added "(no module)", 2.4 named the GPU first; from 2.13 every network prints its HCAs' support, and
# NET/Socket's is always off); aws-ofi-nccl's own ("NET/OFI Could not disable CUDA API usage for HMEM, disabling GDR")
_GDR_NIC_OFF = re.compile(r"^NET/(?P<net>[A-Za-z][\w ]{0,30}?) ?: GPU Direct RDMA Disabled for (?:GPU \d{1,4}\[\d{1,4}\] / )?"
                          r"HCA \d{1,4} '(?P<hca>[^']{1,64})'(?P<why> \([^()]{1,60}\))?")
_OFI_GDR_OFF = re.compile(r"^NET/OFI .{0,120}?\bdisabling GDR\b")
# the path side, NCCL's rule: GDR only up to NCCL_NET_GDR_LEVEL (PXB by default, src/graph/paths.cc): "GPU Direct RDMA
# Disabled for GPU 18000 / HCA 0 (distance 5 > 4)" (2.5 to 2.29; 2.4: "NET/IB : ... GPU 2[2] / HCA 0 (distance 3 >= 2)";
# 2.29.2: "GPU/0-98304 (rank 0) - NET/0-0 (distance 9 > 5)", a PXN path's "using PXN via GPU/..., " before the distance)
_GDR_DISTANCE = re.compile(r"^(?:NET/\w{1,30} ?: )?GPU Direct RDMA Disabled for (?P<what>GPU.{1,160}?distance \d{1,3} >=? \d{1,3}\))")
MAX_WARNINGS = 50  # quoted warnings kept; the count is always whole
MAX_NETWORKS = 16  # network names kept (IB, Socket, a plugin's): a log naming thousands is garbage past these


def parse_nccl_debug(text: str) -> NcclRun:
    """The facts of an NCCL debug log; ParseError when it is too large or holds no NCCL line at all."""
    if len(text) > MAX_COMMAND_OUTPUT:
        raise ParseError(f"NCCL log: more than {MAX_COMMAND_OUTPUT >> 20} MiB: not read")
    run = NcclRun()
    inter, intra, net_names, nodes, warnings = set(), set(), [], {}, {}
    headed = bool(_RECORD.search(text))  # any "NCCL INFO/WARN" line: then bare lines are not read as NCCL's
    header_nodes: dict[str, None] = {}  # nccl-tests' "# Rank N ... on HOST": the same machines, maybe spelled otherwise
    nvls_channels: list[int] = []
    comms: dict[int, dict[str, set[int]]] = {}  # a communicator's size -> per host, the ranks its lines name
    local_ranks: dict[int, int] = {}  # a communicator's size -> NCCL's count of its ranks per node (localRanks)
    fabric_seen: set = set()  # (host, bus id) of the GPUs whose fabric NCCL's lines gave
    for raw in text.splitlines():
        line = LAUNCHER_PREFIX.sub("", raw.rstrip("\r"))
        if split := split_record(line):  # an nccl-tests row's piece, then a record: the record, its host unglued
            line = split[1]
        if run.nccl_version is None and (version := _VERSION.search(line)):
            run.nccl_version = version[1]
        if tests_host := DEVICE_LINE.match(line):  # nccl-tests' "# Rank N ... on HOST device D [bus] NAME"
            header_nodes.setdefault(tests_host[2], None)
            continue
        found = records(line)
        if not found and not headed and _BARE.match(bare := _STAMP_HEAD.sub("", line.strip())):
            found = [(None, "INFO", bare.rstrip(), None)]
        for host, level, body, source in found:
            run.nccl_lines += 1
            if host:
                nodes.setdefault(host, None)
            if level == "WARN":
                _note_provider(run, body)  # aws-ofi-nccl warns it when no RDMA provider was found
                run.warning_count += 1
                if _note_ib_error(run, host or "", body) or note_nvls_failure(run, host or "", body, source):
                    continue  # judged together, not quoted one by one
                if len(warnings) < MAX_WARNINGS:
                    warnings.setdefault(body, None)
                continue
            if not note_mnnvl(run, host or "", body, fabric_seen):
                _read_info(body, host or "", run, inter, intra, net_names, nvls_channels, comms, local_ranks)
    if run.nccl_lines == 0:
        raise ParseError("no NCCL debug line (host:pid:tid [dev] NCCL INFO ...): run with NCCL_DEBUG=INFO")
    run.inter_node_transports, run.intra_node_transports = sorted(inter), sorted(intra)
    run.network = run.network or (net_names[0] if net_names else None)
    if inter:  # NET/IB/0/GDRDMA, and NET/IB/0/GDRDMA/Shared when the proxy's buffers are shared
        run.gdr = any("GDRDMA" in t.split("/")[3:] for t in inter)
    if run.nvls is None and nvls_channels:
        run.nvls = max(nvls_channels) > 0
    # NCCL's own host names count the nodes; the header's only where NCCL's lines name none (a one-node run
    # printed "on localhost" by nccl-tests and "hostname:pid:tid" by NCCL: one node, not two)
    run.nodes, run.warnings = list(nodes) or list(header_nodes), list(warnings)
    run.separate_hosts = None if inter else separate_hosts(comms)
    run.host_split, run.local_ranks_fit = host_split(comms, local_ranks)
    return run


def records(line: str) -> list[tuple[str | None, str, str, str | None]]:
    """The NCCL records in one line of a log as pasted: (host or None, INFO or WARN, text, the source file:line a WARN
    head names or None)."""
    # a record without its host:pid:tid head counts only where it starts the line (after time stamps and a table's
    # '|') or follows a WARN's head: "NCCL WARN lines" in a README's sentence is prose, not NCCL's
    starts = []
    for match in _RECORD.finditer(line):
        head = None
        if match["pid"] is None:
            if match.start() >= MAX_LEAD:  # judged without copying a long line's text before it: linear
                continue
            before = line[:match.start()]
            if (head := _source_head(before)) is None and not _only_stamps(before):
                continue
        starts.append((match, head))
    out = []
    for index, (match, head) in enumerate(starts):
        following = index + 1 < len(starts)
        text = line[match.end():starts[index + 1][0].start() if following else len(line)].rstrip(" \t|")
        for _ in range(2 if following else 0):  # "2024-06-01 12:00:00.123": a date and a time
            rest, _, last = text.rpartition(" ")
            if _STAMP.fullmatch(last):
                text = rest.rstrip(" \t|")
        # a WARN's "host:pid:tid [dev] file.c:line" head (NCCL 2.3's INFO too) names the host of a record without one
        host, source = (match["host"], None) if head is None else (head["host"], head["source"])
        host = host if host and _HOSTNAME.match(host) else None
        out.append((host, match["level"], text.strip(), source))
    return out


MAX_LEAD = 240  # characters before a headless record: a launcher's prefix, stamps and a WARN's head fit in this


def _only_stamps(before: str) -> bool:
    """Whether the text before a headless record is nothing a sentence would hold: stamps, '|' and spaces."""
    return all(_STAMP.fullmatch(token) for token in before.replace("|", " ").split()[:4])


def _source_head(before: str) -> re.Match | None:
    """A WARN's "host:pid:tid [dev] file:line" head ending the text before its level ("host:91:91 [0]
    misc/ibvwrap.cu:63 NCCL WARN"; NCCL 2.3's INFO too): the whole text after its stamps, or its end after a prefix a
    launcher writes, ending in a space or a bracket (Ray's "(WorkerDict pid=3569860) ", pdsh's and mpirun's "host: ",
    vLLM's "(VllmWorker rank=1 pid=2345) ")."""
    text = _STAMP_HEAD.sub("", before.strip())
    return _SOURCE_HEAD.fullmatch(text) or _SOURCE_TAIL.search(text)


def _read_info(body: str, host: str, run: NcclRun, inter: set, intra: set, net_names: list, nvls_channels: list,
               comms: dict, local_ranks: dict) -> None:
    if ranks := _RANKS.search(body):
        run.nranks = max(run.nranks or 0, int(ranks[2]))
        rank, size = int(ranks[1]), int(ranks[2])
        if host and rank < size <= MAX_COMM_SIZE and (size in comms or len(comms) < MAX_COMM_SIZES) \
                and (host in comms.get(size, {}) or len(comms.get(size, {})) < MAX_HOSTS):
            comms.setdefault(size, {}).setdefault(host, set()).add(rank)
        note_local_ranks(local_ranks, size, body, ranks.end())
        if (bus := _BUS_ID.search(body, ranks.end())) and bus[1].lower() not in run.bus_ids and len(run.bus_ids) < MAX_BUS_IDS:
            run.bus_ids.append(bus[1].lower())
    _note_provider(run, body)  # a NET/OFI line: none of the lines below
    if network := _NETWORK.match(body):  # (\S.*) and rstrip: a lazy group before \s*$ is quadratic in trailing spaces
        run.network = run.network or network[1].rstrip()[:64]
    elif socket := _SOCKET.match(body):
        _note_addresses(run, host, socket[1])
        for token in socket[1].split():  # one interface per token, each matched at its start: linear
            iface = _INTERFACE.match(token)
            # a node has a few interfaces: past MAX_NET_DEVICES a log names garbage, and the list stays short to search
            if iface and iface[1] not in run.socket_ifaces and len(run.socket_ifaces) < MAX_NET_DEVICES:
                run.socket_ifaces.append(iface[1])
        if body.startswith("NET/Socket") and "Socket" not in net_names:
            net_names.append("Socket")
    elif ib := _IB.match(body):
        _note_addresses(run, host, ib[2].rpartition(" OOB ")[2] if " OOB " in ib[2] else "")
        devices = _IB_DEVICE.findall(ib[2])
        for _, name in devices[:MAX_NET_DEVICES]:
            if name not in run.ib_devices and len(run.ib_devices) < MAX_NET_DEVICES:
                run.ib_devices.append(name)
        if host not in run.net_device_names and len(run.net_device_names) < MAX_HOSTS:
            run.net_device_names[host] = dict(devices[:MAX_NET_DEVICES])
        if ib[1] not in net_names and len(net_names) < MAX_NETWORKS:
            net_names.append(ib[1])
    elif channel := _CHANNEL.match(body):
        via = channel["via"].rstrip()
        run.nranks = max(run.nranks or 0, int(channel["src"]) + 1, int(channel["dst"]) + 1)
        if via.startswith("NET/"):
            inter.add(via)
            _note_rail(run, host, channel)
            name = via.split("/")[1]
            if name not in net_names and len(net_names) < MAX_NETWORKS:
                net_names.append(name)
        else:
            intra.add(via)
            pair = [channel["src_gpu"], channel["dst_gpu"]]
            if via.startswith("SHM") and None not in pair and pair not in run.shm_pairs and len(run.shm_pairs) < MAX_NET_DEVICES:
                run.shm_pairs.append([g.lower() for g in pair])
    elif _note_gdr_off(run, body):
        pass
    elif setting := _SET_BY.match(body):
        if setting[1] in run.settings or len(run.settings) < MAX_SETTINGS:
            # the first word, as NCCL keeps its first; ncclParam's lines end in '.' ("... set by environment to 3.")
            run.settings.setdefault(setting[1], setting[2].strip().removesuffix("."))
    elif channels := _NVLS_CHANNELS.search(body):
        nvls_channels.append(int(channels[1]))
    elif _NVLS_UNAVAILABLE.search(body):
        run.nvls = False
    elif _NVLS_IN_USE.search(body) and run.nvls is None:
        run.nvls = True


def _note_gdr_off(run: NcclRun, body: str) -> bool:
    """Whether an INFO line says why NCCL runs without GPUDirect RDMA; if so its cause is kept (distinct, bounded)."""
    if (nic := _GDR_NIC_OFF.match(body)) and nic["net"].strip() != "Socket":
        _keep(run.gdr_off_nics, nic["hca"] + (nic["why"] or ""))
    elif ofi := _OFI_GDR_OFF.match(body):
        _keep(run.gdr_off_nics, ofi[0])
    elif distance := _GDR_DISTANCE.match(body):
        _keep(run.gdr_off_distance, distance["what"])
    else:
        return bool(nic)  # NET/Socket's HCAs: never GPUDirect, nothing to say
    return True


def _keep(kept: list[str], said: str) -> None:
    if said not in kept and len(kept) < MAX_NET_DEVICES:
        kept.append(said)


def _note_ib_error(run: NcclRun, host: str, body: str) -> bool:
    """Whether a WARN line is NCCL's IB transport reporting a failed work request; if so it is counted, by (host,
    peer, status, local HCA)."""
    failed = _IB_COMPLETION.match(body)
    if not failed:
        return False
    run.ib_error_lines += 1
    peer = failed["peer"].rpartition("<")[0] or failed["peer"] if failed["peer"] else None
    hca = _IB_HCA.search(body, failed.end())
    key = {"host": host[:255], "peer": peer, "status": int(failed["error"] or failed["status"]), "hca": hca[1] if hca else None}
    tally(run.ib_errors, key, MAX_IB_ERRORS)
    return True


def _note_addresses(run: NcclRun, host: str, text: str) -> None:
    """The addresses a host's Bootstrap, NET/Socket or OOB line names ("ib0:10.0.35.1<0>"): a failed IB transfer
    names its peer by that address."""
    if not host:
        return
    for token in text.split()[:MAX_NET_DEVICES]:
        if (address := _INTERFACE.match(token)) and len(run.addresses) < MAX_HOSTS:
            run.addresses.setdefault(address[2], host)


def _note_provider(run: NcclRun, body: str) -> None:
    """aws-ofi-nccl's "NET/OFI Selected provider is tcp, ..." (an INFO line, or a WARN where no RDMA provider was
    found): the first provider named is kept."""
    if provider := _OFI_PROVIDER.match(body):
        run.ofi_provider = run.ofi_provider or provider[1].rstrip(",").lower()


def _note_rail(run: NcclRun, host: str, channel: re.Match) -> None:
    """Which network device the local GPU of a NET channel uses: the sender's for [send], the receiver's for
    [receive] (a line without the tag, older NCCL, is the sender's). `NET/IB/3(1)`: PXN, through a peer."""
    parts = channel["via"].split("/")
    if len(parts) < 3 or not parts[2].isdecimal():  # '²' is a digit that int() refuses
        return
    gpu = channel["dst_gpu"] if channel["side"] == "receive" else channel["src_gpu"]
    if gpu is None:  # NCCL before 2.7 named no GPU in its ring lines
        return
    gpus = run.gpu_net_devices.setdefault(host, {}) if len(run.gpu_net_devices) < MAX_HOSTS else {}
    devices = gpus.setdefault(gpu.lower(), []) if len(gpus) < MAX_NET_DEVICES else []
    if int(parts[2]) not in devices and len(devices) < MAX_NET_DEVICES:
        devices.append(int(parts[2]))
        devices.sort()


# What bench asks of NCCL: INFO level for the INIT, NET and ENV subsystems only (the version, the network and its
# HCAs, every channel's transport, warnings, the parameters it took from its environment), a few hundred lines per
# rank instead of thousands.
DEBUG_SUBSYS = "INIT,NET,ENV"


def debug_env(environ: dict[str, str], directory: str | None = None) -> dict[str, str]:
    """environ with NCCL's debug output turned on (a job's own NCCL_DEBUG=TRACE stays), written to files in
    `directory` (one per process: %h host, %p pid), or mixed into stdout when None (nccl-tests)."""
    env = dict(environ)
    if env.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        env["NCCL_DEBUG"] = "INFO"
        env["NCCL_DEBUG_SUBSYS"] = DEBUG_SUBSYS
    if directory is not None:
        env["NCCL_DEBUG_FILE"] = f"{directory}/nccl-debug.%h.%p.log"
        env["NCCL_TOPO_DUMP_FILE"] = f"{directory}/{TOPOLOGY_FILE}"  # NCCL's picture of the node, written by rank 0
    else:
        env.pop("NCCL_DEBUG_FILE", None)
    return env


TOPOLOGY_FILE = "nccl-topo.xml"


def read_topology(directory: str | Path) -> dict | None:
    """The topology NCCL dumped into `directory` (NCCL_TOPO_DUMP_FILE, see debug_env), as the Report keeps it
    (probes/nccl_topo.py's NcclTopo); None when NCCL wrote none there (a rank other than 0, a run that did not start)
    or what it wrote is not its topology."""
    from nodecheck.probes.nccl_topo import MAX_TOPO_BYTES, parse_nccl_topo_xml

    try:
        text = read_bounded(Path(directory) / TOPOLOGY_FILE, MAX_TOPO_BYTES)
        return asdict(parse_nccl_topo_xml(text)) if text else None
    except (ProbeFailed, ParseError):
        return None


def read_debug_files(directory: str | Path) -> NcclRun | None:
    """What the ranks' debug files in `directory` say, read up to MAX_COMMAND_OUTPUT in all; None when NCCL
    wrote nothing readable (it may not have started)."""
    texts, left = [], MAX_COMMAND_OUTPUT
    for path in sorted(Path(directory).glob("nccl-debug.*.log"))[:256]:
        try:
            text = read_bounded(path, left) if left > 0 else None
        except ProbeFailed:  # past what is left to read: the files read so far say enough
            text = None
        if text:
            texts.append(text)
            left -= len(text)
    return debug_run("\n".join(texts))


def debug_run(text: str) -> NcclRun | None:
    """The NcclRun of text that may hold NCCL debug lines; None when it holds none."""
    try:
        return parse_nccl_debug(text[:MAX_COMMAND_OUTPUT])
    except ParseError:
        return None


def attach(measurement, run: NcclRun | None, topology: dict | None = None):
    """The measurement with what NCCL did during it in details["nccl"] (rules judge it: nccl_run), and the topology
    it routed by in details["nccl_topology"] (held against the node's: verdicts/nccl_topo.py)."""
    if run is not None:
        measurement.details["nccl"] = asdict(run)
    if topology is not None:
        measurement.details["nccl_topology"] = topology
    return measurement
