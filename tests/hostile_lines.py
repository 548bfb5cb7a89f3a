r"""Hostile megabytes for every text parser, in three shapes: each parser's own keywords repeated; each keyword
then a run of spaces, digits or separators and one last character (a lazy group before `\s*$` is quadratic in
the run: 80 KB of spaces after `via` took 33.6 s); and many lines naming many distinct things (a list searched
for each new name is quadratic in the names: 80,000 socket interfaces, 2.5 MB of fallen-off-the-bus addresses).
Used by tests/system/test_linear_parsers.py (each parser must finish) and benchmarks/bench_parsers.py (how fast)."""

from __future__ import annotations

MB = 1 << 20


def repeated(unit: str, size: int = MB) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _cases() -> dict:
    from nodecheck.bench import nccl_debug, nccl_tests
    from nodecheck.probes import acs, kernel_lines, kernel_log, nccl_topo, nics, platform, topo
    from nodecheck.slurm import scontrol as slurm

    nccl_line = "h:1:1 [0] NCCL INFO "
    return {
        "lspci (ACS, links)": (lambda line: acs.parse_lspci(f"0000:00:01.0 PCI bridge: x\n\t\t{line}\n"),
                               ["LnkSta: Speed 8GT/s ", "\tLnkCap:\tPort #0, Speed ", "ACSCtl: SrcValid+ ", " ", "1.2.3GT/s, "]),
        "nvidia-smi topo -m": (lambda line: topo.parse_topo_matrix(f"\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \t{line}\n"),
                               ["NV18\t", " ", "GPU0\t", "0-15,"]),
        "nccl-tests output": (lambda line: nccl_tests.parse_nccl_log(f"# nThread 1 nGpus 8\n{line}\n"),
                              ["#  Rank  0 Group  0 Pid 1 on ", "   8   2 float sum ", " 1", "#  Avg bus bandwidth : ",
                               " Out of bounds values : ", "# ", " 2026-07-09 16:03:21", " size  count ", "# busbw i_cv% ",
                               "[0]", "[0] 8 2 float sum -1[0] 1.0", "  Rank  0 Pid 1 ", " on h device 0 ", "nThread 1 ",
                               "   8   2 float sum -1h:1:1 [0] NCCL INFO ", " 1 NCCL INFO ", "1 2 3 4h:1:1 [0] NCCL WARN "]),
        "NCCL topology XML": (lambda line: nccl_topo.parse_nccl_topo_xml(f'<system version="1"><cpu numaid="0">{line}</cpu></system>'),
                              ['<pci busid="0000:00:00.0" link_speed="32.0 GT/s PCIe" link_width="16"/>', '<gpu dev="0"><nvlink target="',
                               '<nic><net name="mlx5_0" speed="400000"/></nic>', " ", "0"]),
        "NCCL topology log": (lambda line: nccl_topo.parse_nccl_topo_log(f"{nccl_line}=== System : maxBw 1.0 ===\n{nccl_line}CPU/0\n{nccl_line}{line}\n"),
                              ["+ PCI[24.0] - PCI/1000", " ", "+ NVL[240.0] - GPU/", "                + PCI[", "GPU/E000 ("]),
        "NCCL debug log": (lambda line: nccl_debug.parse_nccl_debug(f"{nccl_line}{line}\n"),
                           ["Bootstrap : Using ab:", "ab:", ":1:1 [0] ", "2024-01-01T00:00:00 ", "Channel 00/0 : 0[0] -> ",
                            "NET/IB : Using [1]a", "|", "NET/OFI Selected provider is ", "rank 1 nranks ", "Ring 00 : 15 -> 0 ",
                            "Channel 00/0 : 0[0] -> 1[1] via ", "Using internal Network ", " ",
                            "NET/IB : Got completion from peer ", "NET/IB: Got completion from peer a<1> with status=a",
                            "NET/IB : Got completion with error 4, opcode 1, len 0, vendor err 81 hca ",
                            "h:1:1 [0] ib_plugin.c:1 NCCL WARN NET/IB : Got completion from peer a<1> with status=12 ",
                            "GPU Direct RDMA Disabled for GPU ", "GPU Direct RDMA Disabled for GPU 1 / HCA 0 (distance 5 > ",
                            "NET/IB : GPU Direct RDMA Disabled for HCA 0 '", "NET/a : GPU Direct RDMA Disabled for HCA 0 'a' (",
                            "NET/OFI a disabling GD", "MNNVL busId 0x", "MNNVL busId 0x1 fabric UUID 1.",
                            "MNNVL busId 0x1 fabric UUID 1.1 cliqueId 0x1 state 3 healthMask 0x",
                            "comm 0x1 rank 0 nRanks 1 nNodes 2 localRanks 1 localRank 0 MNNVL ", "NCCL WARN ",
                            "(p) h:1:1 [0] transport/nvls.cc:1 (f) NCCL WARN Cuda failure 1 'x' "]),
        "NCCL debug log (WARN)": (lambda line: nccl_debug.parse_nccl_debug(f"h:1:1 [0] NCCL WARN {line}\n"),
                                  ["NET/IB : Got completion from peer ", "NET/IB: Got completion from peer a<1> with status=a",
                                   "NET/IB : Got completion with error 4, opcode 1, len 0, vendor err 81 hca ",
                                   "NET/IB : Got completion from peer a<1> with status=12 ", " "]),
        "NCCL debug log without heads": (lambda line: nccl_debug.parse_nccl_debug(f"NET/OFI x\n{line}\n"),
                                         ["NET/OFI Selected provider is ", "[2026-01-15 02:30:45] ", "Channel 00/0 : 0",
                                          "[default0]:", "0: ", " "]),
        "NCCL Inspector": (lambda line: _inspector(line),
                           ['{"coll_perf": {"coll": "', '"coll_sn": ', "{", "[", " ", '{"header": {}, "metadata": {}, "dump_stats": ']),
        "NCCL RAS report": (lambda line: _ras(line),
                            ["Rank 1 -- GPU 0 managed by process 1 on node ", "#0-0 (ab) ", "30 ranks have launched up to operation ",
                             "Process 1 on node h managing GPU ", " ", "    0         1 "]),
        "NCCL RAS JSON": (lambda line: _ras_json(line),
                          ['{"nccl_version": "2.29.1", "communicators": [{"ranks": [{"rank": 0, "host": "', '"', "[", "{", " ",
                           '{"event": "PEER_DEAD", "group": "LIFECYCLE", "peer": {"addr": "']),
        "NCCL Inspector Prometheus": (lambda line: _inspector_prom(line),
                                      ['nccl_bus_bandwidth_gbs{node="', 'nccl_bus_bandwidth_gbs{', 'a="', '\\"', " ", "}"]),
        "/proc/net/route": (lambda line: nics.parse_proc_route(f"Iface\tDestination\tGateway\n{line}\n"), ["\t", "eth0\t0001"]),
        "/proc/cmdline": (lambda line: platform.parse_cmdline(line), ["iommu=", " ", "\""]),
        "kernel log (Xid)": (lambda line: kernel_log.parse_kernel_log(f"{line}\n"),
                             ["NVRM: Xid (PCI:0000:18:00", "NVRM: Xid (", "6,1,1,-;", "0000:18:", "NVRM: The NVIDIA GPU 0000:18:00.0 ",
                              "nvidia-nvswitch0: SXid (PCI:", "caused by previous Xid 1", "[ 8312.", "Nov 29 09:06:40 ", " ",
                              "1", "<4>", "gpu017 kernel: ", "[Sun Dec  1 14:54:40 2024] ", "kern  :err   : ",
                              "mlx5_core 0000:1a:00.0: ", "Port module event[error]: module 0, ", "2026-11-29T09:06:40,",
                              "> ", "   >"]),
        "kernel log (AER)": (lambda line: _aer(f"{line}\n"),
                             ["[ 1.0] pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=",
                              "[ 1.0] pcieport 0000:00:03.0:    [", "[  +0.000001] nvidia 0000:03:00.0: AER: ", "[Oct14 14:56] ",
                              "[<    0.000001>] ", "[ 1.0 <"]),
        "kernel log lines (is one a log line?)": (kernel_lines.has_kernel_line,
                                                   ["<4>", "Nov 29 09:06:40 ", "[ 1.", "1,", " ", "\n", "2026-11-29T09:06:40,",
                                                    "[Sun Dec  1 14:54:40 2024] ", "gpu017 kernel: "]),
        "kernel log file (journal export, json)": (_journal_file,
                                                   ["__CURSOR=", "MESSAGE=NVRM: Xid (", "=", "\n", '{"MESSAGE": "', "[[[["]),
        "scontrol show node": (lambda line: slurm.parse_node("n1", f"NodeName=n1 State=IDLE {line}\n"),
                               ["Reason= [", " ", "State=", "Reason="]),
        "fleet (node types)": (None, []),  # many shapes only (_many)
    }


def _inspector(line: str) -> None:
    from nodecheck.core.errors import ParseError
    from nodecheck.job.inspector import parse_inspector
    from nodecheck.job.ranks import judge_job

    marker = '{"header": {"id": "0x1", "rank": 0, "n_ranks": 2}, "metadata": {"hostname": "h", "pid": 1}, "dump_stats": {"coll_records": 9}}'
    try:
        judge_job(parse_inspector(f"{marker}\n{line}\n").ops)
    except ParseError:
        pass


def _ras(line: str) -> None:
    from nodecheck.job.ras import parse_ras
    from nodecheck.job.stuck import judge_ras

    head = "NCCL version 2.26.2 compiled with CUDA 12.6\nGroup     Comms\nINCOMPLETE\n#0-0 (ab) MISMATCH\n2 ranks have launched up to operation 1\n"
    judge_ras(parse_ras(head + line + "\n"))


def _ras_json(line: str) -> None:
    from nodecheck.core.errors import ParseError
    from nodecheck.job.ras_json import parse_ras_json
    from nodecheck.job.stuck import judge_ras

    head = '{"nccl_version": "2.29.1", "communicators": [{"hash": "0x1", "ranks": [], "missing_ranks": []}]}\n'
    try:
        judge_ras(parse_ras_json(head + line + "\n"))
    except ParseError:
        pass


def _inspector_prom(line: str) -> None:
    from nodecheck.job.inspector_prom import parse_inspector_prom
    from nodecheck.job.peers import judge_peers

    head = 'nccl_bus_bandwidth_gbs{node="a",gpu="GPU0",message_size="4-5GB"} 600\n'
    judge_peers(parse_inspector_prom(head + line + "\n")[0])


def _journal_file(line: str) -> None:
    import tempfile
    from pathlib import Path

    from nodecheck.core.limits import MAX_COMMAND_OUTPUT
    from nodecheck.host.log_file import read_log_file

    with tempfile.TemporaryDirectory() as folder:
        for head in ("__CURSOR=s\n", '{"MESSAGE": "x"}\n'):
            (Path(folder) / "log").write_text(head + line.replace("\\n", "\n"))
            read_log_file(Path(folder) / "log", MAX_COMMAND_OUTPUT)


RUNS = (" ", "0", ":", "\t")  # what follows a keyword in the second shape


def shapes(unit: str) -> list[tuple[str, str]]:
    """(label, text) of one unit: repeated, and followed by each run and one last character."""
    return [(repr(unit[:28]), repeated(unit))] + [(f"{unit[:16]!r}+{run!r}*", unit + run * MB + "x") for run in RUNS]


def _aer(text: str):
    from nodecheck.checks.aer_log import aer_log_findings
    from nodecheck.probes.kernel_aer import parse_aer_events

    return aer_log_findings(parse_aer_events(text))


def _many() -> dict:
    """name of a parser -> [(label, text, parse)]: many lines, each naming something new."""
    from nodecheck.bench import nccl_debug
    from nodecheck.bench.nccl_tests import parse_nccl_log as nccl_tests_log
    from nodecheck.probes import kernel_log
    from nodecheck.slurm.scontrol import parse_node as slurm_parse

    def lines(make) -> str:  # a megabyte of lines, each naming something new
        out, size, i = [], 0, 0
        while size < MB:
            out.append(make(i))
            size, i = size + len(out[-1]), i + 1
        return "".join(out)

    begun = lines(lambda i: f"NVRM: The NVIDIA GPU {i:08x}:01:00.0\n")
    return {
        "kernel log (Xid)": [("GPUs begun, then fallen off the bus", begun + "NVRM: fallen off the bus.\n" * begun.count("\n"),
                              kernel_log.parse_kernel_log),
                             ("uncorrected AER errors, each on a new device, each with its bits",
                            lines(lambda i: f"[ 1.0] pcieport 0000:{i % 256:02x}:{i % 32:02x}.{i % 8}: PCIe Bus Error: "
                                            f"severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)\n"
                                            f"[ 1.0] pcieport 0000:{i % 256:02x}:{i % 32:02x}.{i % 8}:    [ 5] SDES{i}\n"),
                            _aer),
                           ("a GPU begun, fallen, begun ...", lines(lambda i: f"NVRM: The NVIDIA GPU {i:08x}:01:00.0\n"
                                                                                "NVRM: x fallen off the bus\n"), kernel_log.parse_kernel_log),
                             ("a record's further lines, indented", "[ 1.0] NVRM: The NVIDIA GPU 0000:18:00.0\n"
                              + lines(lambda i: f"               NVRM: line {i}\n"), kernel_log.parse_kernel_log),
                             ("an NVRM line, then a megabyte of indentation", "[ 1.0] NVRM: The NVIDIA GPU 0000:18:00.0\n"
                              + " " * MB + "NVRM: fallen off the bus\n", kernel_log.parse_kernel_log)],
        "NCCL debug log": [("socket interfaces, one line", "h:1:1 [0] NCCL INFO NET/Socket : Using "
                            + lines(lambda i: f"if{i}:10.0.0.1<0> ") + "\n", nccl_debug.parse_nccl_debug),
                           ("socket interfaces, a line each", lines(lambda i: f"h:1:1 [0] NCCL INFO NET/Socket : Using if{i}:10.0.0.1<0>\n"),
                            nccl_debug.parse_nccl_debug),
                           ("NET/IB : Using lines", lines(lambda i: f"h{i}:1:1 [0] NCCL INFO NET/IB{i} : Using [0]mlx5_{i}:1/IB\n"),
                            nccl_debug.parse_nccl_debug),
                           ("NET channels", lines(lambda i: f"h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/N{i}/0\n"),
                            nccl_debug.parse_nccl_debug),
                           ("fabric lines, each a new GPU", lines(lambda i: f"h{i}:1:1 [0] NCCL INFO MNNVL busId 0x{i:x} "
                                                                              f"fabric UUID {i:x}.1 cliqueId 0x1 state 3 healthMask 0xaa\n"),
                            nccl_debug.parse_nccl_debug),
                           ("communicators, each a new node count", lines(lambda i: f"h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 9 "
                                                                                    f"nNodes {i} localRanks 1 localRank 0 MNNVL 0\n"),
                            nccl_debug.parse_nccl_debug),
                           ("failed IB transfers, each with a new peer",
                            lines(lambda i: f"h{i}:1:1 [0] NCCL WARN NET/IB : Got completion from peer 10.{i}<1> with status=12\n"),
                            nccl_debug.parse_nccl_debug),
                           ("NVLS failures behind time stamps, each a new host",
                            lines(lambda i: f"[2025-07-21 19:05:29] h{i}:1:1 [0] transport/nvls.cc:{i % 999} (f{i}) NCCL WARN "
                                            f"Cuda failure {i % 999} 'e{i}'\n"), nccl_debug.parse_nccl_debug),
                           ("a WARN head, then a megabyte of function name", "h:1:1 [0] transport/net_ib.cc:1 (" + "f" * MB
                            + " NCCL WARN NET/IB : Got completion with error 12\n", nccl_debug.parse_nccl_debug)],
        "nccl-tests output": [("a row's start, then its figures a line each", "   8   2 float sum -1h:1:1 [0] NCCL INFO x\n"
                               + lines(lambda i: f"  {i}.0  0.00  0.00  0\n"), nccl_tests_log),
                              ("rows, each split by a record", lines(lambda i: f"  {i}  2 float sum -1h:1:1 [0] NCCL INFO x\n"
                                                                                 f"  1.0  0.00  0.00  0h:1:1 [0] NCCL INFO y\n")
                               + "  1.0  0.00  0.00  0\n", nccl_tests_log)],
        "scontrol show node": [("Reason= then spaces", "NodeName=n1 State=IDLE Reason=" + " " * MB + "x [u@t]\n",
                                lambda text: slurm_parse("n1", text))],
        "fleet (node types)": [("8,000 node types, a node each", "", lambda _: _fleet_of_types(8000)),
                               ("8,000 nodes of one type", "", lambda _: _fleet_of_types(1, 8000))],
    }


def _fleet_of_types(types: int, nodes_each: int = 1) -> None:
    from nodecheck.fleet import NodeView, compare

    views = [NodeView(f"n{t}-{k}", f"8x GPU model {t}", {"driver": "580"}, {"fact:gpus": 8.0})
             for t in range(types) for k in range(nodes_each)]
    compare(views)


def run_all(name: str) -> list[tuple[str, float]]:
    """(shape, seconds) for each hostile input of one parser; a parser's own error is an answer, not a failure."""
    import contextlib
    import time

    parse, units = _cases()[name]
    inputs = [(label, text, parse) for unit in units for label, text in shapes(unit)] + _many().get(name, [])
    out = []
    for label, text, call in inputs:
        started = time.perf_counter()
        with contextlib.suppress(Exception):  # ParseError and friends: what matters here is that it returned
            call(text)
        out.append((label, time.perf_counter() - started))
    return out


def names() -> list[str]:
    return list(_cases())
