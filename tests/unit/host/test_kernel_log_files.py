"""`nodecheck kernel-log FILE` on the files operators really hand over, and on files that are no kernel log:
the real Dell XE9680 dmesg with five drain-now Xid 119 (../shared/captures/public/health/xid) gzipped, xz'd,
bzip2'd, in UTF-16, as a journal export; prose, a config, random bytes and an empty file are refused (exit 2),
never judged clean. The journal's export and JSON forms are built from the real lines as systemd documents
them (https://systemd.io/JOURNAL_EXPORT_FORMATS/: `NAME=value` fields, a binary field as its name, a 64-bit
little-endian length and the bytes; `-o json`: one object per line, MESSAGE an array of bytes when not UTF-8)."""

import bz2
import gzip
import json
import lzma
import os
import re

import pytest
from helpers import REPO, SHARED, cli

from nodecheck.probes.kernel_lines import has_kernel_line, kernel_message
from nodecheck.probes.kernel_log import parse_kernel_log

XID119 = SHARED / "captures/public/health/xid/gpud-dmesg-xid119-dell-xe9680.log"
EXIT_FINDINGS, EXIT_USAGE = 1, 2


@pytest.fixture
def real_log() -> bytes:
    if not XID119.exists():
        pytest.skip("../shared/captures is not beside the checkout")
    return XID119.read_bytes()


def judged(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return cli("kernel-log", "--json", str(path))


def xid119_count(run) -> int:
    return sum(e["xid"] == 119 and e["severity"] == "error" for e in json.loads(run.stdout)["events"])


@pytest.mark.parametrize("name, pack", [("dmesg.gz", gzip.compress), ("kern.log.2.gz", gzip.compress),
                                        ("dmesg.xz", lzma.compress), ("dmesg.bz2", bz2.compress),
                                        ("utf16-bom.log", lambda d: d.decode().encode("utf-16")),
                                        ("utf16le.log", lambda d: d.decode().encode("utf-16-le")),
                                        ("utf16be.log", lambda d: d.decode().encode("utf-16-be")),
                                        ("bom.log", lambda d: b"\xef\xbb\xbf" + d)])
def test_a_compressed_or_utf16_log_is_read_as_the_plain_one(tmp_path, real_log, name, pack):
    run = judged(tmp_path, name, pack(real_log))
    assert run.returncode == EXIT_FINDINGS, run.stderr
    assert xid119_count(run) == 5


def test_gzip_members_concatenated_are_read_whole(tmp_path, real_log):
    half = len(real_log) // 2
    cut = real_log.rindex(b"\n", 0, half) + 1
    run = judged(tmp_path, "two-members.gz", gzip.compress(real_log[:cut]) + gzip.compress(real_log[cut:]))
    assert xid119_count(run) == 5


@pytest.mark.parametrize("name, data, said", [
    ("empty.log", b"", "is empty"),
    ("random.bin", bytes((n * 7919 + 13) % 251 for n in range(50_000)), "no kernel-log line"),
    ("pyproject.toml", (REPO / "pyproject.toml").read_bytes(), "no kernel-log line"),
    ("README.md", (REPO / "README.md").read_bytes(), "no kernel-log line"),
    ("utf16-prose.txt", "A kernel log holds lines like NVRM: Xid (PCI:0000:9b:00): 79, pid=1.\n".encode("utf-16"),
     "no kernel-log line"),
    ("cut.gz", gzip.compress(b"[ 1.000000] NVRM: Xid (PCI:0000:9b:00): 79, pid=1\n" * 100)[:40], "not a whole gzip file"),
    ("empty.gz", gzip.compress(b""), "empty once decompressed"),
    ("log.zst", b"\x28\xb5\x2f\xfd" + bytes(64), "zstd"),
    ("system.journal", b"LPKSHHRH" + bytes(64), "journalctl --file"),
])
def test_what_is_no_kernel_log_is_refused_not_judged_clean(tmp_path, name, data, said):
    run = judged(tmp_path, name, data)
    assert run.returncode == EXIT_USAGE, run.stdout
    assert said in run.stderr and "Traceback" not in run.stderr
    assert run.stdout == ""


def test_a_decompression_bomb_stops_at_the_bound(tmp_path):
    run = judged(tmp_path, "bomb.gz", gzip.compress(b"\0" * (40 << 20)))
    assert run.returncode == EXIT_USAGE and "once decompressed" in run.stderr


def test_log_words_quoted_in_prose_are_not_events():
    """README-like text around real stamped lines: only the lines that are the kernel's count."""
    prose = ("To see it, grep for NVRM: Xid (PCI:0000:9b:00): 79, pid=1, GPU has fallen off the bus.\n"
             "- a ConnectX's mlx5_core 0000:1a:00.0: port_module:254:(pid 0): Port module event[error]: module 0, "
             "Cable error, High Temperature\n"
             "[  10.000000] NVRM: Xid (PCI:0000:18:00): 48, pid=7, DBE\n")
    (event,) = parse_kernel_log(prose)
    assert (event.pci, event.code, event.usec) == ("0000:18:00.0", 48, 10_000_000)


@pytest.mark.parametrize("line, usec", [
    ("6,1234,8312000001,-;NVRM: Xid (PCI:0000:9b:00): 79, pid=1", 8312000001),
    ("<3>[ 8312.000001] NVRM: Xid (PCI:0000:9b:00): 79, pid=1", 8312000001),  # dmesg -r
    ("Nov 29 09:06:40 gpu017 kernel: [ 8312.000001] NVRM: Xid (PCI:0000:9b:00): 79, pid=1", 8312000001),  # kern.log
    ("Nov  9 09:06:40.123456 gpu017 kernel: NVRM: Xid (PCI:0000:9b:00): 79, pid=1", None),  # short-precise
    ("2026-11-29T09:06:40+0000 gpu017 kernel: NVRM: Xid (PCI:0000:9b:00): 79, pid=1", None),  # short-iso
    ("Sun 2026-11-29 09:06:40 UTC gpu017 kernel: NVRM: Xid (PCI:0000:9b:00): 79, pid=1", None),  # short-full
    ("2026-11-29T09:06:40.123456+00:00 gpu017 kernel: NVRM: Xid (PCI:0000:9b:00): 79, pid=1", None),  # rsyslog RFC 3339
    ("2026-11-29T09:06:40,123456+00:00 NVRM: Xid (PCI:0000:9b:00): 79, pid=1", None),  # dmesg --time-format iso
    ("kern  :err   : [ 8312.000001] NVRM: Xid (PCI:0000:9b:00): 79, pid=1", None),  # dmesg -x (facility first)
    ("[Sun Nov 29 09:06:40 2026] NVRM: Xid (PCI:0000:9b:00): 79, pid=1", None),  # dmesg -T
    ("NVRM: Xid (PCI:0000:9b:00): 79, pid=1", None),  # dmesg -t
])
def test_every_log_form_gives_the_event_and_its_time(line, usec):
    (event,) = parse_kernel_log(line)
    assert (event.pci, event.code) == ("0000:9b:00.0", 79)
    assert kernel_message(line)[0].startswith("NVRM: ")
    if usec is not None:
        assert event.usec == usec
    assert has_kernel_line(line)


@pytest.mark.parametrize("quote", ["> ", ">", "> > ", "  >  > "], ids=["quote", "tight", "nested", "indented"])
def test_a_log_quoted_in_a_ticket_gives_the_same_events(tmp_path, real_log, quote):
    """The XE9680's real dmesg as a ticket, an e-mail or a markdown quote carries it: before, "holds no kernel-log
    line" and exit 2; now the five drain-now Xid 119, as from the plain log."""
    quoted = b"".join(quote.encode() + line + b"\n" for line in real_log.splitlines())
    run = judged(tmp_path, "ticket.txt", b"From the customer:\n```\n" + quoted + b"```\n")
    assert run.returncode == EXIT_FINDINGS and xid119_count(run) == 5, run.stderr
    plain = [(e.pci, e.code, e.usec) for e in parse_kernel_log(real_log.decode())]
    assert [(e.pci, e.code, e.usec) for e in parse_kernel_log(quoted.decode())] == plain


def test_prose_and_configs_hold_no_kernel_line():
    assert not has_kernel_line((REPO / "pyproject.toml").read_text())
    assert not has_kernel_line("the kernel: it logs NVRM: Xid lines\nLinux kernel: a word\n")
    assert has_kernel_line("prose\n[  1.000000] usb 1-1: new device\n")


def export_entry(message: bytes, monotonic: int, binary: bool = False) -> bytes:
    field = (b"MESSAGE\n" + len(message).to_bytes(8, "little") + message + b"\n") if binary else b"MESSAGE=" + message + b"\n"
    return (f"__CURSOR=s=0;i={monotonic}\n__REALTIME_TIMESTAMP=1740327858000000\n__MONOTONIC_TIMESTAMP={monotonic}\n"
            "_TRANSPORT=kernel\nSYSLOG_IDENTIFIER=kernel\n").encode() + field + b"\n"


def test_a_journal_export_is_read_with_its_times(tmp_path, real_log):
    lines = [re.sub(rb"^\[[^]]*\] ", b"", line) for line in real_log.splitlines()]
    data = b"".join(export_entry(line, 8312_000_000 + n, binary=(n % 3 == 0)) for n, line in enumerate(lines))
    run = judged(tmp_path, "kernel.export", data)
    assert xid119_count(run) == 5
    assert all(e["usec"] >= 8312_000_000 for e in json.loads(run.stdout)["events"])
    run = judged(tmp_path, "kernel.export.gz", gzip.compress(data))
    assert xid119_count(run) == 5


def test_journal_json_is_read_messages_as_bytes_too(tmp_path, real_log):
    lines = [re.sub(rb"^\[[^]]*\] ", b"", line) for line in real_log.splitlines()]
    entries = [{"__MONOTONIC_TIMESTAMP": str(8312_000_000 + n), "_TRANSPORT": "kernel",
                "MESSAGE": list(line) if n % 2 else line.decode()} for n, line in enumerate(lines)]
    hostile = ["[" * 100_000, "{\"MESSAGE\": 7}", "not json"]
    run = judged(tmp_path, "kernel.json", "\n".join([json.dumps(e) for e in entries] + hostile).encode())
    assert run.returncode == EXIT_FINDINGS, run.stderr
    assert xid119_count(run) == 5


def test_an_unreadable_file_is_named(tmp_path):
    if os.geteuid() == 0:
        path = tmp_path / "fifo"
        os.mkfifo(path)
    else:
        path = tmp_path / "absent"
    run = cli("kernel-log", str(path))
    assert run.returncode == EXIT_USAGE and str(path) in run.stderr
