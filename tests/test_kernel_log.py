"""The kernel-log Xid parser (issue 23's first source) on real logs: the answer key of
../shared/captures/public/health/xid (every `NVRM: Xid` line as [pci, xid], derived there mechanically), the
same real lines as /dev/kmsg records, journalctl and monotonic dmesg print them, and the fallen-off-the-bus
and NVSwitch SXid forms as NVIDIA's driver prints them (quoted from gpud's parser, the lines its tests use)."""

import json

import pytest
from helpers import PUBLIC, need

from nodecheck.probes.kernel_log import parse_kernel_log
from nodecheck.xid_catalog import listed_codes, source, xid_entry

XID = PUBLIC / "health" / "xid"


def key() -> dict:
    return {name: value["xids"] for name, value in json.loads(need(XID / "EXPECTED.json").read_text()).items()
            if not name.startswith("_")}


@pytest.mark.parametrize("name", ["gpud-dmesg-xid119-dell-xe9680.log", "gcm-test-xid-31-48.log", "gpud-kmsg-peermem.log"])
def test_every_xid_of_the_captured_logs(name):
    events = parse_kernel_log(need(XID / name).read_text())
    assert [[e.pci.rsplit(".", 1)[0], e.code] for e in events] == key()[name]
    assert all(e.kind == "xid" and not e.implied for e in events)


def test_the_same_lines_as_kmsg_journalctl_and_monotonic_dmesg_print_them():
    lines = [line.split("] ", 1)[1] for line in need(XID / "gcm-test-xid-31-48.log").read_text().splitlines() if line]
    kmsg = "\n".join(f"3,{1200 + i},{227996636 + i},-;{line}" for i, line in enumerate(lines))
    journal = "\n".join(f"Oct 14 14:56:49 gpu017 kernel: {line}" for line in lines)
    monotonic = "\n".join(f"[ 8312.{i:06d}] {line}" for i, line in enumerate(lines))
    for text in (kmsg, journal, monotonic, "\n".join(lines)):
        assert [(e.pci, e.code) for e in parse_kernel_log(text)] == [("000d:00:00.0", 31), ("000d:00:00.0", 48)]
    assert [e.usec for e in parse_kernel_log(kmsg)] == [227996636, 227996637]
    assert [e.usec for e in parse_kernel_log(monotonic)] == [8312000000, 8312000001]
    assert [e.usec for e in parse_kernel_log(journal)] == [None, None]  # wall-clock stamps say nothing of the boot
    assert parse_kernel_log(kmsg)[1].message.startswith("pid=3234, Graphics SM Global Exception")


def test_fallen_off_the_bus_without_an_xid_line_is_an_xid_79_once():
    one_line = "[ 512.1] NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.\n"
    multi = ("[ 512.1] NVRM: The NVIDIA GPU 0000:18:00.0\n"
             "[ 512.1] NVRM: (PCI ID: 10de:2330) installed in this system has\n"
             "[ 512.1] NVRM: fallen off the bus and is not responding to commands.\n")
    for text in (one_line, multi):
        (event,) = parse_kernel_log(text)
        assert (event.pci, event.code, event.implied) == ("0000:18:00.0", 79, True)
    both = "[ 512.0] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n" + multi
    (event,) = parse_kernel_log(both)
    assert (event.code, event.implied, event.line) == (79, False, 1)
    far = "[ 1.0] NVRM: The NVIDIA GPU 0000:18:00.0\n" + "[ 1.0] other\n" * 8 + "[ 1.0] NVRM: fallen off the bus\n"
    assert parse_kernel_log(far) == []  # too far apart to be one message


def test_nvswitch_sxid_and_a_sympathetic_xid():
    (sxid,) = parse_kernel_log("[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up")
    assert (sxid.kind, sxid.switch, sxid.pci, sxid.code, sxid.message) == ("sxid", 0, "0000:05:00.0", 20034,
                                                                          "Fatal, Link 30 LTSSM Fault Up")
    line = need(XID / "gcm-test-xid-31-48.log").read_text().splitlines()[1]
    (event,) = parse_kernel_log(line.replace(": 48,", ": 45,") + " (caused by previous Xid 48)")
    assert (event.code, event.caused_by) == (45, 48) and xid_entry(45).sympathetic


def test_the_catalog_drains_what_the_issue_lists_and_watches_the_rest():
    drain = [48, 62, 64, 74, 79, 92, 95, 119, 120, 140, 143, *range(144, 151)]
    watch = [13, 31, 43, 45, 63, 94]
    assert [xid_entry(code).action for code in drain] == ["drain"] * len(drain)
    assert [xid_entry(code).action for code in watch] == ["watch"] * len(watch)
    assert sorted(drain + watch) == listed_codes()
    assert xid_entry(79).name == "GPU has fallen off the bus" and xid_entry(119).name == "GSP RPC Timeout"
    unknown = xid_entry(999)
    assert (unknown.action, unknown.listed) == ("watch", False) and "999" in unknown.name
    assert "docs.nvidia.com" in source()["catalog"]


def test_a_log_past_its_bound_is_refused_and_a_flood_is_capped():
    from nodecheck.errors import ParseError
    from nodecheck.limits import MAX_COMMAND_OUTPUT
    from nodecheck.probes import kernel_log

    with pytest.raises(ParseError):
        parse_kernel_log("x" * (MAX_COMMAND_OUTPUT + 1))
    flood = "NVRM: Xid (PCI:0000:18:00): 31, pid=1, fault\n" * (kernel_log.MAX_EVENTS + 50)
    assert len(parse_kernel_log(flood)) == kernel_log.MAX_EVENTS


def test_read_with_dmesg_else_journalctl_else_a_named_unknown(tmp_path, monkeypatch):
    """The real reader with stand-ins on PATH: dmesg refused as it is without CAP_SYSLOG, journalctl printing
    the captured Xid lines in its short-monotonic format; then both refused; then a snapshot replays it."""
    from helpers import fake_executable

    from nodecheck.host import LiveHost
    from nodecheck.probes.kernel_log import collect
    from nodecheck.snapshot import RecordingHost, SnapshotHost

    lines = [line.split("] ", 1)[1] for line in need(XID / "gcm-test-xid-31-48.log").read_text().splitlines() if line]
    journal = tmp_path / "journal.txt"
    journal.write_text("".join(f"[ 8312.000001] gpu017 kernel: {line}\n" for line in lines))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_executable(bin_dir / "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1")
    fake_executable(bin_dir / "journalctl", f"cat {journal}")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    recorder = RecordingHost(LiveHost())
    log = collect(recorder, 10)
    assert (log.known, log.source, [(e.pci, e.code) for e in log.events]) == (True, "journalctl",
                                                                             [("000d:00:00.0", 31), ("000d:00:00.0", 48)])
    recorder.write(tmp_path / "snap")
    fake_executable(bin_dir / "journalctl", "echo 'No journal files were opened due to insufficient permissions.' >&2; exit 1")
    unknown = collect(LiveHost(), 10)
    assert not unknown.known and "Operation not permitted" in unknown.why and "insufficient permissions" in unknown.why
    replayed = collect(SnapshotHost(tmp_path / "snap"), 10)
    assert replayed == log


def test_inspect_names_each_gpus_events_with_the_catalog(tmp_path):
    """The XE9680's five Xid 119 on its GPU at 0000:9b:00.0, as inspect prints them; an unread log says why."""
    from helpers import make_gpu, make_report

    from nodecheck.events import KernelLog
    from nodecheck.render.report import kernel_log_lines

    events = parse_kernel_log(need(XID / "gpud-dmesg-xid119-dell-xe9680.log").read_text())
    report = make_report(gpus=[make_gpu(4, pci_bus_id="00000000:9B:00.0")], kernel_log=KernelLog(True, None, "dmesg", events))
    assert kernel_log_lines(report) == ["Kernel log (dmesg): 5 NVIDIA event(s) since boot",
                                        "  gpu4 (0000:9b:00.0): Xid 119 GSP RPC Timeout x5 (drain)"]
    unread = make_report(kernel_log=KernelLog(False, "unknown: the kernel log could not be read (dmesg: ...)"))
    assert kernel_log_lines(unread) == ["Kernel log: unknown: the kernel log could not be read (dmesg: ...)"]
    assert kernel_log_lines(make_report()) == []
