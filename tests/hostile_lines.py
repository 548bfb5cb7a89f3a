"""Hostile one-megabyte lines for every text parser: each parser's own keywords repeated, the shapes that
make a backtracking regular expression quadratic (a 210 KB `LnkSta:` line froze the prolog for 49 s).
Used by tests/test_linear_parsers.py (each parser must finish) and benchmarks/bench_parsers.py (how fast)."""

from __future__ import annotations

MB = 1 << 20


def repeated(unit: str, size: int = MB) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _cases() -> dict:
    from nodecheck import slurm
    from nodecheck.bench import nccl_debug, nccl_tests
    from nodecheck.probes import acs, kernel_lines, kernel_log, nics, platform, topo

    nccl_line = "h:1:1 [0] NCCL INFO "
    return {
        "lspci (ACS, links)": (lambda line: acs.parse_lspci(f"0000:00:01.0 PCI bridge: x\n\t\t{line}\n"),
                               ["LnkSta: Speed 8GT/s ", "\tLnkCap:\tPort #0, Speed ", "ACSCtl: SrcValid+ ", " ", "1.2.3GT/s, "]),
        "nvidia-smi topo -m": (lambda line: topo.parse_topo_matrix(f"\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \t{line}\n"),
                               ["NV18\t", " ", "GPU0\t", "0-15,"]),
        "nccl-tests output": (lambda line: nccl_tests.parse_nccl_log(f"# nThread 1 nGpus 8\n{line}\n"),
                              ["#  Rank  0 Group  0 Pid 1 on ", "   8   2 float sum ", " 1", "#  Avg bus bandwidth : "]),
        "NCCL debug log": (lambda line: nccl_debug.parse_nccl_debug(f"{nccl_line}{line}\n"),
                           ["Bootstrap : Using ab:", "ab:", ":1:1 [0] ", "2024-01-01T00:00:00 ", "Channel 00/0 : 0[0] -> ",
                            "NET/IB : Using [1]a", "|", "NET/OFI Selected provider is ", "rank 1 nranks ", "Ring 00 : 15 -> 0 ",
                            "Channel 00/0 : 0[0] -> 1[1] via ", "Using internal Network ", " "]),
        "NCCL debug log without heads": (lambda line: nccl_debug.parse_nccl_debug(f"NET/OFI x\n{line}\n"),
                                         ["NET/OFI Selected provider is ", "[2026-01-15 02:30:45] ", "Channel 00/0 : 0",
                                          "[default0]:", "0: ", " "]),
        "/proc/net/route": (lambda line: nics.parse_proc_route(f"Iface\tDestination\tGateway\n{line}\n"), ["\t", "eth0\t0001"]),
        "/proc/cmdline": (lambda line: platform.parse_cmdline(line), ["iommu=", " ", "\""]),
        "kernel log (Xid)": (lambda line: kernel_log.parse_kernel_log(f"{line}\n"),
                             ["NVRM: Xid (PCI:0000:18:00", "NVRM: Xid (", "6,1,1,-;", "0000:18:", "NVRM: The NVIDIA GPU 0000:18:00.0 ",
                              "nvidia-nvswitch0: SXid (PCI:", "caused by previous Xid 1", "[ 8312.", "Nov 29 09:06:40 ", " ",
                              "1", "<4>", "gpu017 kernel: ", "[Sun Dec  1 14:54:40 2024] ", "kern  :err   : ",
                              "mlx5_core 0000:1a:00.0: ", "Port module event[error]: module 0, ", "2026-11-29T09:06:40,"]),
        "kernel log lines (is one a log line?)": (kernel_lines.has_kernel_line,
                                                   ["<4>", "Nov 29 09:06:40 ", "[ 1.", "1,", " ", "\n", "2026-11-29T09:06:40,",
                                                    "[Sun Dec  1 14:54:40 2024] ", "gpu017 kernel: "]),
        "kernel log file (journal export, json)": (_journal_file,
                                                   ["__CURSOR=", "MESSAGE=NVRM: Xid (", "=", "\n", '{"MESSAGE": "', "[[[["]),
        "scontrol show node": (lambda line: slurm.parse_node("n1", f"NodeName=n1 State=IDLE {line}\n"),
                               ["Reason= [", " ", "State="]),
    }


def _journal_file(line: str) -> None:
    import tempfile
    from pathlib import Path

    from nodecheck.limits import MAX_COMMAND_OUTPUT
    from nodecheck.log_file import read_log_file

    with tempfile.TemporaryDirectory() as folder:
        for head in ("__CURSOR=s\n", '{"MESSAGE": "x"}\n'):
            (Path(folder) / "log").write_text(head + line.replace("\\n", "\n"))
            read_log_file(Path(folder) / "log", MAX_COMMAND_OUTPUT)


def run_all(name: str) -> list[tuple[str, float]]:
    """(pattern, seconds) for each hostile line of one parser; a parser's own error is an answer, not a failure."""
    import contextlib
    import time

    parse, units = _cases()[name]
    out = []
    for unit in units:
        line = repeated(unit)
        started = time.perf_counter()
        with contextlib.suppress(Exception):  # ParseError and friends: what matters here is that it returned
            parse(line)
        out.append((unit, time.perf_counter() - started))
    return out


def names() -> list[str]:
    return list(_cases())
