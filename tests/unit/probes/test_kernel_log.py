"""The kernel-log Xid parser (issue 23's first source) on real logs: the answer key of
../shared/captures/public/health/xid (every `NVRM: Xid` line as [pci, xid], derived there mechanically), the
same real lines as /dev/kmsg records, journalctl and monotonic dmesg print them, and the fallen-off-the-bus
and NVSwitch SXid forms as NVIDIA's driver prints them (quoted from gpud's parser, the lines its tests use)."""

import json
import subprocess
import sys

import pytest
from helpers import PUBLIC, may_write_the_real_kernel_log, need, raised_as_unit_user

from nodecheck.core.xid_catalog import listed_codes, source, xid_entry
from nodecheck.probes.kernel_log import parse_kernel_log

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


def test_the_same_lines_as_dmesg_h_and_dmesg_d_print_them():
    """`dmesg -H` / `--reltime` stamps a minute's first record "[Oct14 14:56] " and the next ones "[  +0.000012] " (the
    time since the record before), `dmesg -d` adds "<    0.000012>" (util-linux sys-utils/dmesg.c: "%b%e %H:%M",
    "[  %+8.06f] ", "[%5ld.%06ld <%12.06f>] "). Read only bare, such a paste held no kernel-log line at all. As pasted
    in rwth-i6/returnn#1500: "[  +0.000844] nvidia 0000:03:00.0: AER: can't recover ..."."""
    from nodecheck.probes.kernel_lines import has_kernel_line, kernel_message

    lines = [line.split("] ", 1)[1] for line in need(XID / "gcm-test-xid-31-48.log").read_text().splitlines() if line]
    human = "\n".join([f"[Oct14 14:56] {lines[0]}", *[f"[  +0.{i:06d}] {line}" for i, line in enumerate(lines[1:], 12)]])
    delta = "\n".join(f"[ 8312.{i:06d} <    0.{i:06d}>] {line}" for i, line in enumerate(lines))
    ctime_delta = "\n".join(f"[Fri Oct 14 14:56:49 2022 <    0.{i:06d}>] {line}" for i, line in enumerate(lines))
    for text in (human, delta, ctime_delta, human.replace("[Oct14 ", "[Oct 4 ")):
        assert has_kernel_line(text)
        assert [(e.pci, e.code) for e in parse_kernel_log(text)] == [("000d:00:00.0", 31), ("000d:00:00.0", 48)]
    assert [e.usec for e in parse_kernel_log(delta)] == [8312000000, 8312000001]
    assert [e.usec for e in parse_kernel_log(human)] == [None, None]  # neither stamp is the time since boot
    assert kernel_message("[  +0.000844] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)") == (
        "nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)", None, True)


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


# NVIDIA/NVSentinel#155: `dmesg` on a node whose GPU fell off the bus at probe (driver 570.158.01), verbatim. The
# driver prints the message as one record of three lines (open-gpu-kernel-modules, rm_is_supported_device); dmesg
# prints the further lines unstamped, indented to the message's column.
NVSENTINEL_155 = """\
[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0
               NVRM: (PCI ID: 10de:26b5) installed in this system has
               NVRM: fallen off the bus and is not responding to commands.
[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).
[ 1843.439669] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  (dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025
"""


def _as_printed(record: list[str], first: str) -> str:
    """One multi-line record as dmesg and journalctl print it: the first line after its prefix, the others
    indented to the message's column."""
    return "\n".join([first + record[0]] + [" " * len(first) + line for line in record[1:]]) + "\n"


def test_the_driver_s_multi_line_fallen_off_the_bus_as_every_reader_prints_it():
    record = [line.strip().split("] ", 1)[-1] for line in NVSENTINEL_155.splitlines()[:3]]
    texts = {
        "dmesg": NVSENTINEL_155,
        "dmesg --ctime": _as_printed(record, "[Mon Jun  2 13:20:11 2025] "),
        "journalctl -k": _as_printed(record, "Jun 02 13:20:11 gpu-b3 kernel: "),
        "journalctl -k -o short-monotonic": _as_printed(record, "[ 1843.308145] gpu-b3 kernel: "),
        "/dev/kmsg": "3,1571,1843308145,-;" + "\\x0a".join(record) + "\n",  # the kernel escapes inner newlines
    }
    for name, text in texts.items():
        (event,) = parse_kernel_log(text)
        assert (event.pci, event.code, event.implied) == ("0000:b3:00.0", 79, True), name
        assert "\\x0a" not in event.message, name
    assert parse_kernel_log(texts["dmesg"])[0].usec == 1843308145  # the stamp of the message's first line
    assert parse_kernel_log(texts["journalctl -k -o short-monotonic"])[0].usec == 1843308145
    # an indented line continues only the NVRM line right above it: after another message it is no kernel line
    apart = NVSENTINEL_155.splitlines()
    assert parse_kernel_log("\n".join([apart[0], "[ 1843.309000] usb 1-1: new device", *apart[1:3]])) == []


def test_nvswitch_sxid_and_a_sympathetic_xid():
    (sxid,) = parse_kernel_log("[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up")
    assert (sxid.kind, sxid.switch, sxid.pci, sxid.code, sxid.message) == ("sxid", 0, "0000:05:00.0", 20034,
                                                                          "Fatal, Link 30 LTSSM Fault Up")
    assert sxid.link == 30
    line = need(XID / "gcm-test-xid-31-48.log").read_text().splitlines()[1]
    (event,) = parse_kernel_log(line.replace(": 48,", ": 45,") + " (caused by previous Xid 48)")
    assert (event.code, event.caused_by) == (45, 48) and xid_entry(45).sympathetic


def test_the_catalog_drains_what_the_issue_lists_and_watches_the_rest():
    """Issue 23's lists, and every row NVIDIA's catalog resolves by a GPU reset, a reboot, a VM restart or a look at
    the mechanicals (RESET_GPU, RESTART_BM, RESTART_VM, CHECK_MECHANICALS in gpud's mirror @4a8de33a3f: 46, 54, 109,
    110, 136, 151, 155, 156, 158), which were watched as Xids nodecheck had no row for."""
    catalog_reset = [46, 54, 109, 110, 136, 151, 155, 156, 158]
    drain = [48, 62, 64, 74, 79, 92, 95, 119, 120, 140, 143, *range(144, 151), *catalog_reset, 167, 169, 171, 172]
    watch = [13, 31, 43, 45, 63, 94, 121, 137, 154]
    assert [xid_entry(code).action for code in drain] == ["drain"] * len(drain)
    assert [xid_entry(code).action for code in watch] == ["watch"] * len(watch)
    assert sorted(drain + watch) == listed_codes()
    assert xid_entry(79).name == "GPU has fallen off the bus" and xid_entry(119).name == "GSP RPC Timeout"
    unknown = xid_entry(999)
    assert (unknown.action, unknown.listed) == ("watch", False) and "999" in unknown.name
    assert "docs.nvidia.com" in source()["catalog"]


def test_a_log_past_its_bound_is_refused_and_a_flood_is_capped():
    from nodecheck.core.errors import ParseError
    from nodecheck.core.limits import MAX_COMMAND_OUTPUT
    from nodecheck.probes import kernel_log

    with pytest.raises(ParseError):
        parse_kernel_log("x" * (MAX_COMMAND_OUTPUT + 1))
    flood = "NVRM: Xid (PCI:0000:18:00): 31, pid=1, fault\n" * (kernel_log.MAX_EVENTS + 50)
    last = "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"
    kept = parse_kernel_log(flood + last)
    assert len(kept) == kernel_log.MAX_EVENTS and kept[-1].code == 79  # the newest are kept: the last one counts most


def test_read_kmsg_else_journalctl_else_dmesg_else_a_named_unknown(tmp_path, monkeypatch):
    """The real reader: /dev/kmsg records first (a copy under the host's root), then, without it, stand-ins on
    PATH: journalctl printing the captured Xid lines in its short-monotonic format, dmesg refused as it is
    without CAP_SYSLOG; then all refused; and a snapshot replays what was read."""
    from helpers import fake_executable

    from nodecheck.host.live import LiveHost
    from nodecheck.host.snapshot import RecordingHost, SnapshotHost
    from nodecheck.probes.kernel_log import collect

    lines = [line.split("] ", 1)[1] for line in need(XID / "gcm-test-xid-31-48.log").read_text().splitlines() if line]
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "dev/kmsg").write_text("".join(f"4,{n},{8312000001 + n},-;{line}\n" for n, line in enumerate(lines)))
    (root / "proc/uptime").write_text("9000.25 17000.50\n")
    from_kmsg = collect(LiveHost(root), 10)
    assert (from_kmsg.source, [(e.code, e.usec) for e in from_kmsg.events], from_kmsg.uptime_usec) == (
        "/dev/kmsg", [(31, 8312000001), (48, 8312000002)], 9_000_250_000)

    journal = tmp_path / "journal.txt"
    journal.write_text("".join(f"[ 8312.000001] gpu017 kernel: {line}\n" for line in lines))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_executable(bin_dir / "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1")
    fake_executable(bin_dir / "journalctl", f"cat {journal}")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    (root / "dev/kmsg").unlink()
    recorder = RecordingHost(LiveHost(root))
    log = collect(recorder, 10)
    assert (log.known, log.source, [(e.pci, e.code) for e in log.events]) == (True, "journalctl",
                                                                             [("000d:00:00.0", 31), ("000d:00:00.0", 48)])
    recorder.write(tmp_path / "snap")
    fake_executable(bin_dir / "journalctl", "echo 'No journal files were opened due to insufficient permissions.' >&2; exit 1")
    unknown = collect(LiveHost(root), 10)
    assert not unknown.known and "Operation not permitted" in unknown.why and "insufficient permissions" in unknown.why
    # journalctl 252 as a user who may read no journal file: "-- No entries --", exit 0 (as measured here)
    fake_executable(bin_dir / "journalctl", "echo '-- No entries --'; echo 'No journal files were found.' >&2; exit 0")
    unknown = collect(LiveHost(root), 10)
    assert not unknown.known and "journalctl gave no kernel messages" in unknown.why
    replayed = collect(SnapshotHost(tmp_path / "snap"), 10)
    assert replayed == log


def test_the_real_kernel_hands_back_a_written_xid_through_dev_kmsg(tmp_path):
    """As root: a tagged Xid line written into the real /dev/kmsg comes back through the probe as an event
    with its time since boot (at a device address no machine has, in PCI domain 00ff). Unprivileged (as the units run)
    on a kernel that restricts dmesg, /dev/kmsg says it needs CAP_SYSLOG."""
    import uuid

    from nodecheck.host.live import LiveHost
    from nodecheck.probes.kernel_log import collect

    may_write_the_real_kernel_log()
    tag = uuid.uuid4().hex[:12]
    # an address of its own each time: the same one written on every run would repeat into an error that the
    # live-host tests of the next hour would see
    bus, device = int(tag[:2], 16), int(tag[2:4], 16) % 32
    try:
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<4>NVRM: Xid (PCI:00ff:{bus:02x}:{device:02x}): 13, nodecheck-test-{tag} Graphics Exception\n")
    except OSError as error:
        pytest.skip(f"/dev/kmsg refuses writes here ({error})")
    log = collect(LiveHost(), 20)
    mine = [e for e in log.events if tag in e.message]
    assert log.source == "/dev/kmsg" and len(mine) == 1
    assert (mine[0].pci, mine[0].code) == (f"00ff:{bus:02x}:{device:02x}.0", 13) and mine[0].usec is not None
    assert log.uptime_usec is not None and mine[0].usec <= log.uptime_usec + 5_000_000
    if open("/proc/sys/kernel/dmesg_restrict").read().strip() == "1":
        assert "needs CAP_SYSLOG" in raised_as_unit_user(lambda: LiveHost().kernel_messages(5))


def test_the_suite_writes_no_fake_xid_into_the_hosts_kernel_log(monkeypatch):
    """Three tests write Xid lines into the real /dev/kmsg (and one floods it). On any machine, with or without an NVIDIA
    driver, a fake Xid there is read as real (nodecheck's daemon remembers it for the boot; DCGM, NPD, a site's NHC),
    so they run only when asked for by NODECHECK_TESTS_WRITE_KMSG=1, never by default."""
    import os

    monkeypatch.delenv("NODECHECK_TESTS_WRITE_KMSG", raising=False)
    with pytest.raises(pytest.skip.Exception, match="only with NODECHECK_TESTS_WRITE_KMSG=1"):
        may_write_the_real_kernel_log()
    if os.geteuid() != 0 or not os.path.exists("/dev/kmsg"):
        pytest.skip("needs root and /dev/kmsg")
    monkeypatch.setenv("NODECHECK_TESTS_WRITE_KMSG", "1")
    may_write_the_real_kernel_log()  # asked for: runs




def test_inspect_names_each_gpus_events_with_the_catalog(tmp_path):
    """The XE9680's five Xid 119 on its GPU at 0000:9b:00.0, as inspect prints them; an unread log says why."""
    from helpers import make_gpu, make_report

    from nodecheck.render.kernel_log import kernel_log_lines
    from nodecheck.report.events import KernelLog

    events = parse_kernel_log(need(XID / "gpud-dmesg-xid119-dell-xe9680.log").read_text())
    report = make_report(gpus=[make_gpu(4, pci_bus_id="00000000:9B:00.0")], kernel_log=KernelLog(True, None, "dmesg", events))
    assert kernel_log_lines(report) == ["Kernel log (dmesg): 5 NVIDIA event(s) since boot",
                                        "  gpu4 (0000:9b:00.0): Xid 119 GSP RPC Timeout x5 (drain)"]
    unread = make_report(kernel_log=KernelLog(False, "unknown: the kernel log could not be read (dmesg: ...)"))
    assert kernel_log_lines(unread) == ["Kernel log: unknown: the kernel log could not be read (dmesg: ...)"]
    assert kernel_log_lines(make_report()) == []


def test_the_real_journalctl_with_no_journal_it_may_read_is_unknown_not_empty(tmp_path, monkeypatch):
    """journalctl exits 0 printing "-- No entries --" when it finds no journal file it may read (here: this
    machine keeps no journal): the kernel log is unknown, never read-and-clean."""
    import shutil

    from helpers import fake_executable

    from nodecheck.host.live import LiveHost
    from nodecheck.probes.kernel_log import collect

    journalctl = shutil.which("journalctl")
    if journalctl is None:
        pytest.skip("journalctl is not installed")
    probe = subprocess.run([journalctl, "-k", "-b", "--no-pager", "--lines", "5"], capture_output=True, text=True, timeout=30)
    if probe.stdout.strip() != "-- No entries --":
        pytest.skip("this machine keeps a journal with kernel messages")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "journalctl").symlink_to(journalctl)
    fake_executable(bin_dir / "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1")
    monkeypatch.setenv("PATH", str(bin_dir))
    log = collect(LiveHost(tmp_path / "root-without-kmsg"), 20)
    assert not log.known and "journalctl gave no kernel messages" in log.why


def test_an_sxid_events_later_lines_fold_into_it_and_count_alone_only_when_its_first_is_missing():
    """The driver prints one SXid event as up to three lines: "Fatal, Link N ...", "Severity ...", "Data {...}"."""
    first = "[10.000000] nvidia-nvswitch{s}: SXid (PCI:0000:0{s}:00.0): 20034, Fatal, Link {link} LTSSM Fault Up"
    more = ["[10.000100] nvidia-nvswitch{s}: SXid (PCI:0000:0{s}:00.0): 20034, Severity 1 Engine instance {link} Sub-engine instance 00",
            "[10.000200] nvidia-nvswitch{s}: SXid (PCI:0000:0{s}:00.0): 20034, Data {{0x10000000, 0x00000000}}"]
    one = [line.format(s=0, link=30) for line in (first, *more)]
    assert [(e.switch, e.link) for e in parse_kernel_log("\n".join(one))] == [(0, 30)]
    other_switch = [line.format(s=1, link=7) for line in more]  # its first line is not in the log: one event
    assert [(e.switch, e.link) for e in parse_kernel_log("\n".join(one + other_switch))] == [(0, 30), (1, None)]
    far = one[:1] + ["[10.000150] kernel: noise"] * 8 + one[1:2]  # too far from its first line: counted
    assert len(parse_kernel_log("\n".join(far))) == 2


def test_a_context_switch_timeout_drains_as_nvidias_catalog_asks_a_reset():
    """Xid 109 (Context Switch Timeout Error, catalog resolution RESET_GPU), in the line format of the real Xid 48 of
    gcm's log: a drain-now error naming the reset, not the warning an unlisted Xid gets; 136 (NVLink link training,
    ALI) sits on the GPU's NVLink traffic only."""
    from nodecheck.checks.signals import gpu_xids
    from nodecheck.config import Config
    from nodecheck.report.events import KernelLog
    from nodecheck.report.model import Report

    line = need(XID / "gcm-test-xid-31-48.log").read_text().splitlines()[1]
    report = Report.from_dict({})
    report.kernel_log = KernelLog(True, None, "dmesg", parse_kernel_log(line.replace(": 48,", ": 109,")))
    (finding,) = gpu_xids(report, Config())
    assert (finding.severity, finding.measured, finding.expected) == ("error", "Xid 109 context switch timeout", "no Xid")
    assert "drain now" in finding.message and "reset the GPU" in finding.message
    assert xid_entry(136).path == "nvlink" and xid_entry(54).advice("gpu0").startswith("check the GPU board's auxiliary power")


def test_an_xid_a_mig_gpu_attributes_to_an_instance_is_read(tmp_path):
    """On a MIG GPU the driver puts the GPU instance, and the compute instance, in the Xid's parenthesis
    (open-gpu-kernel-modules src/nvidia/src/kernel/gpu/rc/kernel_rc.c, "PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u").
    Read only bare, every Xid of a MIG GPU was lost: a drain-now Xid 48 read as a clean log."""
    from helpers import make_gpu, make_report

    from nodecheck.render.kernel_log import event_record, kernel_log_lines
    from nodecheck.report.events import KernelLog

    # NVIDIA's A100 GPU memory error management guide, its contained error on a MIG GPU
    (contained,) = parse_kernel_log("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). "
                                    "RST: No, D-RST: No")
    assert (contained.pci, contained.code, contained.instance) == ("0000:01:00.0", 94, "GPU-I:05")
    assert contained.message == "pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No"
    # gcm's Xid 48 line as the driver prints it for a compute instance of a MIG GPU
    line = need(XID / "gcm-test-xid-31-48.log").read_text().splitlines()[1].replace("000d:00:00)", "000d:00:00 GPU-I:01 GPU-CI:00)")
    (dbe,) = parse_kernel_log(line)
    assert (dbe.code, dbe.instance, dbe.pci) == (48, "GPU-I:01 GPU-CI:00", "000d:00:00.0")
    assert event_record(dbe)["instance"] == "GPU-I:01 GPU-CI:00" and event_record(dbe)["severity"] == "error"
    report = make_report(gpus=[make_gpu(0, pci_bus_id="0000000D:00:00.0")], kernel_log=KernelLog(True, None, "dmesg", [dbe]))
    assert kernel_log_lines(report)[1].endswith("x1 (drain) on MIG GPU-I:01 GPU-CI:00")
    log = tmp_path / "dmesg.txt"
    log.write_text(line + "\n")
    result = subprocess.run([sys.executable, "-m", "nodecheck", "kernel-log", str(log)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and "Xid 48" in result.stdout, result.stdout + result.stderr
