"""The kernel's ring buffer overwrites its oldest messages: a drain-now Xid must not scroll out of the verdict.
/dev/kmsg numbers its records from 0 at boot, so a first record past 0 says what was lost; the journal is read
then, and what earlier runs of this boot read is remembered in the state file (src/nodecheck/assemble/open_events.py). The log
lines are the real ones of ../shared/captures/public/health/xid, written as /dev/kmsg records and journal
lines under a host root, read by the real probes and judged by the real rules."""

import json
import os

import pytest
from helpers import PUBLIC, fake_executable, may_write_the_real_kernel_log, need

from nodecheck.config import Config
from nodecheck.host.live import LiveHost
from nodecheck.host.state import STATE_FILE, boot_id, record_round, remember_round
from nodecheck.probes import PROBES
from nodecheck.probes.kernel_log import collect
from nodecheck.report.events import REMEMBERED_EVENTS, REMEMBERED_PER_CODE, XidEvent

XID = PUBLIC / "health" / "xid"
BOOT = boot_id() or "4b9a4f2c-6f0e-4d3a-9a51-2f4f7d1a0c11"  # this machine's: `nodecheck clear` writes on its boot
ONLY_THE_LOG = Config(disabled_probes=[p.name for p in PROBES if p.name not in ("kernel_log", "history")])


def real_lines(name: str) -> list[str]:
    return [line.split("] ", 1)[1] for line in need(XID / name).read_text().splitlines() if "] " in line]


def host_root(tmp_path, uptime_s: float):
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(BOOT + "\n")
    (root / "proc/uptime").write_text(f"{uptime_s:.2f} 1.00\n")
    return root


def write_kmsg(root, first_seq: int, first_usec: int, lines: list[str]) -> None:
    """Records as /dev/kmsg hands them, one second apart, numbered from first_seq (0: nothing lost since boot)."""
    (root / "dev/kmsg").write_text("".join(f"4,{first_seq + n},{first_usec + n * 1_000_000},-;{line}\n"
                                           for n, line in enumerate(lines)))


def judge(root):
    from nodecheck.pipeline import build_report

    return build_report(LiveHost(root), ONLY_THE_LOG)


def xid_findings(report) -> list[tuple[str, str, str]]:
    return [(f.severity, f.subject, f.measured) for f in report.findings if f.kind == "gpu_xid"]


BOOT_LINES = ["Linux version 6.8.0-52-generic (buildd@lcy02-amd64-046)", "Command line: BOOT_IMAGE=/vmlinuz ro quiet"]
NOISE = [f"mlx5_core 0000:{n % 200:02x}:00.0: port module event: module 0, Cable plugged" for n in range(6)]


@pytest.fixture
def no_journal(tmp_path, monkeypatch):
    """journalctl and dmesg refuse, as they do for a user without the journal's group or CAP_SYSLOG."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_executable(bin_dir / "journalctl", "echo 'No journal files were opened due to insufficient permissions.' >&2; exit 1")
    fake_executable(bin_dir / "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def test_a_wrapped_ring_buffer_reads_the_journal_which_reaches_back_to_boot(tmp_path, no_journal):
    xid119 = real_lines("gpud-dmesg-xid119-dell-xe9680.log")
    root = host_root(tmp_path, 90_000)
    write_kmsg(root, 48_211, 80_000_000_000, NOISE)  # the Xids of 8312 s are gone from the ring buffer
    whole = "".join(f"[{8312 + n:>6}.000001] gpu017 kernel: {line}\n" for n, line in enumerate(xid119))
    journal = tmp_path / "journal.txt"
    journal.write_text("".join(f"[    0.000000] gpu017 kernel: {line}\n" for line in BOOT_LINES) + whole)
    fake_executable(no_journal / "journalctl", f"cat {journal}")
    log = collect(LiveHost(root), 10)
    assert (log.source, log.lost_before_usec, [e.code for e in log.events]) == ("journalctl", None, [119] * 5)

    # a journal whose own oldest lines were rotated away, but older than the ring buffer's: the further back wins
    journal.write_text(whole)
    log = collect(LiveHost(root), 10)
    assert (log.source, log.lost_before_usec) == ("journalctl", 8312_000_001)
    # no journal: the ring buffer, saying from when it holds the log
    fake_executable(no_journal / "journalctl", "echo 'No journal files were opened due to insufficient permissions.' >&2; exit 1")
    log = collect(LiveHost(root), 10)
    assert (log.known, log.source, log.events, log.lost_before_usec) == (True, "/dev/kmsg", [], 80_000_000_000)
    # a ring buffer numbered from 0 reaches back to boot: the journal is not asked
    write_kmsg(root, 0, 0, BOOT_LINES + xid119)
    fake_executable(no_journal / "journalctl", f"touch {tmp_path / 'asked'}; exit 1")
    log = collect(LiveHost(root), 10)
    assert (log.source, log.lost_before_usec, len(log.events)) == ("/dev/kmsg", None, 5)
    assert not (tmp_path / "asked").exists()


def test_a_drain_now_xid_the_ring_buffer_overwrote_still_fails_the_node(tmp_path, monkeypatch, no_journal):
    """Run 1 reads the real Xid 119 lines in a whole log; by run 2 the ring buffer holds only later noise, and
    no journal can be read: the Xid is judged from nodecheck's memory, and the log is still whole from boot
    because run 1 read up to a time the ring buffer still holds. A clear holds for the remembered events."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    xid119 = real_lines("gpud-dmesg-xid119-dell-xe9680.log")
    root = host_root(tmp_path, 9_000)
    write_kmsg(root, 0, 0, BOOT_LINES + xid119)
    first = judge(root)
    assert xid_findings(first) == [("error", "pci:0000:9b:00.0", "Xid 119 GSP RPC timeout")]

    root = host_root(tmp_path, 90_000)
    write_kmsg(root, 48_211, 8_500_000_000, NOISE)  # from 8500 s: run 1 read up to 9000 s, no gap
    second = judge(root)
    assert xid_findings(second) == xid_findings(first)
    assert second.kernel_log.lost_before_usec is None
    assert [(e.code, e.remembered) for e in second.kernel_log.events] == [(119, True)] * 5
    (finding,) = [f for f in second.findings if f.kind == "gpu_xid"]
    assert "x5 since boot (5 remembered by nodecheck: the kernel's ring buffer no longer holds them)" in finding.message
    from nodecheck.render.kernel_log import kernel_log_lines

    assert "5 of them remembered from earlier runs" in kernel_log_lines(second)[0]
    assert [e.remembered for e in first.kernel_log.events] == [False] * 5

    from nodecheck.cli.signals import _clear_events

    cleared = _clear_events(second, ONLY_THE_LOG, "gpu_xid", "pci:0000:9b:00.0", "ops")  # what `nodecheck clear` does
    assert [line.split(" (by")[0] for line in cleared] == ["cleared pci:0000:9b:00.0: 5 event(s), codes 119"]
    assert xid_findings(judge(root)) == []


def test_a_gap_between_runs_is_said_and_what_was_read_before_it_still_counts(tmp_path, monkeypatch, no_journal):
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    xid119 = real_lines("gpud-dmesg-xid119-dell-xe9680.log")
    root = host_root(tmp_path, 9_000)
    write_kmsg(root, 0, 0, BOOT_LINES + xid119)
    judge(root)
    root = host_root(tmp_path, 90_000)
    write_kmsg(root, 48_211, 50_000_000_000, NOISE)  # from 50000 s: what happened between 9000 s and then is lost
    report = judge(root)
    assert report.kernel_log.lost_before_usec == 50_000_000_000
    assert xid_findings(report) == [("error", "pci:0000:9b:00.0", "Xid 119 GSP RPC timeout")]
    from nodecheck.render.kernel_log import kernel_log_lines

    assert any("from 13 h 53 min after boot" in line for line in kernel_log_lines(report)), kernel_log_lines(report)
    # the next run reads from 50000 s on, after this one: whole from 50000 s, not from boot
    write_kmsg(root, 60_000, 60_000_000_000, NOISE)
    assert judge(root).kernel_log.lost_before_usec == 50_000_000_000


def test_the_memory_is_bounded_and_keeps_the_acknowledgements(tmp_path):
    """A node that logs an Xid flood: the state file keeps the newest events per device and code and in all,
    each message cut, well inside the 1 MiB it may hold, so the operators' acknowledgements are never lost."""
    from nodecheck.host.state import acknowledge, read_state
    from nodecheck.report.events import Acknowledgement, LogMemory

    acknowledge(Acknowledgement("gpu_xid", "gpu3", 10, 1, "ops", 1.0), tmp_path)  # on this machine's boot
    flood = [XidEvent("xid", f"0000:{n % 40:02x}:00.0", 13 if n % 2 else 31, "x" * 200, n, 1000 + n) for n in range(10_000)]
    record_round(None, 10.0, LogMemory(flood, None, 20_000), BOOT, tmp_path)
    size = (tmp_path / STATE_FILE).stat().st_size
    kept = read_state(tmp_path)["kernel_log"]["events"]
    per_code = {}
    for e in kept:
        per_code[(e["pci"], e["code"])] = per_code.get((e["pci"], e["code"]), 0) + 1
    assert len(kept) == REMEMBERED_EVENTS and max(per_code.values()) <= REMEMBERED_PER_CODE
    assert kept[-1]["usec"] == 1000 + 9_999 and max(len(e["message"]) for e in kept) == 120 and size < 256 * 1024
    assert [a["subject"] for a in read_state(tmp_path)["acknowledgements"]] == ["gpu3"]


@pytest.mark.parametrize("memory", [
    "not an object", {"events": "x"}, {"events": [None, 3, [], {"kind": "xid"}]},
    {"events": [{"kind": "xid", "pci": "0000:9b:00.0", "code": "119", "message": "m", "line": 1, "usec": 5}]},
    {"events": [{"kind": "xid", "pci": "0000:9b:00.0", "code": 119, "message": "m", "line": 1, "usec": None}]},
    {"events": [{"kind": "nvlink", "pci": "0000:9b:00.0", "code": 119, "message": "m", "line": 1, "usec": 5}]},
    {"events": [], "from_usec": True, "upto_usec": "9000"},
])
def test_a_remembered_log_not_of_its_shape_costs_only_itself(tmp_path, memory):
    from nodecheck.probes.history import history_from

    good = {"kind": "xid", "pci": "0000:9b:00.0", "code": 119, "message": "m", "line": 1, "usec": 7}
    state = {"boot_id": BOOT, "acknowledgements": [], "samples": [], "kernel_log": memory}
    history = history_from({"boot_id": BOOT, "state": state})
    assert history.kernel_log.events == [] and history.kernel_log.upto_usec is None
    if isinstance(memory, dict) and isinstance(memory.get("events"), list):
        memory["events"].append(good)
        assert [e.usec for e in history_from({"boot_id": BOOT, "state": state}).kernel_log.events] == [7]


def test_a_daemon_that_cannot_write_its_state_remembers_the_log_in_memory(tmp_path, monkeypatch, no_journal):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("STATE_DIRECTORY", str(blocker / "state"))
    from nodecheck.pipeline import build_report

    xid119 = real_lines("gpud-dmesg-xid119-dell-xe9680.log")
    root = host_root(tmp_path, 9_000)
    write_kmsg(root, 0, 0, BOOT_LINES + xid119)
    host = LiveHost(root)
    build_report(host, ONLY_THE_LOG)
    write_kmsg(root, 48_211, 8_500_000_000, NOISE)
    assert xid_findings(build_report(host, ONLY_THE_LOG)) == [("error", "pci:0000:9b:00.0", "Xid 119 GSP RPC timeout")]
    assert xid_findings(build_report(LiveHost(root), ONLY_THE_LOG)) == []  # another process remembers nothing


def test_two_writers_keep_each_others_events(tmp_path):
    """The prolog (root, /dev/kmsg) and the daemon (the journal) share the state file: each run adds to it."""
    from nodecheck.host.state import read_state
    from nodecheck.report.events import LogMemory

    one = XidEvent("xid", "0000:9b:00.0", 119, "a", 3, 8312_000_001)
    two = XidEvent("xid", "0000:18:00.0", 79, "b", 9, 8400_000_000)
    record_round(None, 10.0, LogMemory([one], None, 8_320_000_000), BOOT, tmp_path)
    record_round(None, 10.0, LogMemory([two], 8_000_000_000, 8_500_000_000), BOOT, tmp_path)
    record_round(None, 10.0, LogMemory([one], None, 8_330_000_000), BOOT, tmp_path)  # a slower run, written last
    stored = read_state(tmp_path)["kernel_log"]
    assert [e["code"] for e in stored["events"]] == [119, 79]
    assert (stored["from_usec"], stored["upto_usec"]) == (8_000_000_000, 8_500_000_000)  # the latest read's stretch
    # a burst of one Xid (1 ms apart) read again by every later run stays a burst of two
    burst = [one, XidEvent("xid", "0000:9b:00.0", 119, "a", 4, 8312_001_001)]
    data = {"boot_id": BOOT}
    for upto in (8_400_000_000, 8_500_000_000, 8_600_000_000):
        remember_round(data, None, 10.0, LogMemory(burst, None, upto))
    assert [e["usec"] for e in data["kernel_log"]["events"]] == [8312_000_001, 8312_001_001]


def test_the_real_ring_buffer_says_whether_it_reaches_back_to_boot():
    """On this machine, as root: /dev/kmsg's first record is read here directly; the probe takes the log as
    whole from boot exactly when that record is numbered 0 (or the journal it then reads reaches back)."""
    if os.geteuid() != 0 or not os.path.exists("/dev/kmsg"):
        pytest.skip("needs root and /dev/kmsg")
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        first = os.read(fd, 16384).decode(errors="replace")
    except OSError as error:
        pytest.skip(f"/dev/kmsg cannot be read here ({error})")
    finally:
        os.close(fd)
    seq = int(first.split(",")[1])
    log = collect(LiveHost(), 20)
    if log.source == "/dev/kmsg":
        assert (log.lost_before_usec is None) == (seq == 0), (seq, log.lost_before_usec)
    else:
        assert seq != 0


def test_the_remembered_stretch_reaches_the_metrics_and_json(tmp_path, monkeypatch, no_journal):
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    from nodecheck.prometheus.exposition import exposition

    root = host_root(tmp_path, 90_000)
    write_kmsg(root, 48_211, 50_000_000_000, NOISE)
    report = judge(root)
    assert "\nnodecheck_kernel_log_lost_before_seconds 50000.0\n" in exposition(report).decode()
    assert json.loads(json.dumps(report.to_dict()))["kernel_log"]["lost_before_usec"] == 50_000_000_000
    write_kmsg(root, 0, 0, BOOT_LINES + NOISE)
    assert "\nnodecheck_kernel_log_lost_before_seconds " not in exposition(judge(root)).decode()


def test_one_event_read_from_kmsg_and_from_a_late_stamping_journal_counts_once(tmp_path, monkeypatch, no_journal):
    """systemd 256.1+ stamps kernel lines seconds late in `journalctl -o short-monotonic` (systemd issue 34250:
    7.6 s at boot). A watched Xid logged three times, remembered by a run that read /dev/kmsg, then read by a
    run that has only that journal: three events, a warning, not six and a false drain (5 within an hour)."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    xid31 = [line for line in real_lines("gcm-test-xid-31-48.log") if ": 31," in line]
    burst = xid31 * 3
    root = host_root(tmp_path, 9_000)
    write_kmsg(root, 0, 8_000_000_000, BOOT_LINES + burst)  # Xid 31 at 8002, 8003, 8004 s
    first = judge(root)
    assert xid_findings(first) == [("warning", "pci:000d:00:00.0", "Xid 31 GPU memory page fault")]

    shifted = "".join(f"[{7.636966 + n:12.6f}] gpu017 kernel: {line}\n" for n, line in enumerate(BOOT_LINES))
    shifted += "".join(f"[{8009.6 + n:12.6f}] gpu017 kernel: {line}\n" for n, line in enumerate(burst))
    journal = tmp_path / "journal.txt"
    journal.write_text(shifted)
    fake_executable(no_journal / "journalctl", f"cat {journal}")
    (root / "dev/kmsg").unlink()  # this run may read only the journal
    second = judge(root)
    assert second.kernel_log.source == "journalctl" and second.kernel_log.lost_before_usec is None  # its boot line
    assert [e.code for e in second.kernel_log.events] == [31, 31, 31]
    assert xid_findings(second) == xid_findings(first)


def test_a_snapshot_keeps_what_nodecheck_remembered(tmp_path, monkeypatch, no_journal):
    """`nodecheck snapshot` of a node whose ring buffer has wrapped records the state file beside the log, so
    `inspect --from` on another machine judges the remembered Xid as the node did."""
    from nodecheck.host.snapshot import RecordingHost, SnapshotHost
    from nodecheck.pipeline import build_report

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    root = host_root(tmp_path, 9_000)
    write_kmsg(root, 0, 0, BOOT_LINES + real_lines("gpud-dmesg-xid119-dell-xe9680.log"))
    judge(root)
    write_kmsg(root, 48_211, 8_500_000_000, NOISE)
    recorder = RecordingHost(LiveHost(root))
    live = build_report(recorder, ONLY_THE_LOG)
    recorder.write(tmp_path / "snap")
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "elsewhere"))
    replayed = build_report(SnapshotHost(tmp_path / "snap"), ONLY_THE_LOG)
    assert xid_findings(replayed) == xid_findings(live) == [("error", "pci:0000:9b:00.0", "Xid 119 GSP RPC timeout")]
    assert replayed.kernel_log == live.kernel_log
    assert not (tmp_path / "elsewhere").exists()  # a replay keeps no state


def _first_record(path: str = "/dev/kmsg") -> tuple[int, int]:
    """(sequence number, usec) of the oldest record the real ring buffer still holds."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        prio, seq, usec = os.read(fd, 16384).decode(errors="replace").split(";", 1)[0].split(",")[:3]
    finally:
        os.close(fd)
    return int(seq), int(usec)


def test_the_real_ring_buffer_wraps_and_the_xid_read_before_still_counts(tmp_path, monkeypatch):
    """As root, on this machine's kernel: a watched Xid written into /dev/kmsg (an address no machine has) is
    read by a run; then the ring buffer is filled until that record is overwritten (user writes to /dev/kmsg are
    rate-limited by default: printk_devkmsg is set to "on" for the flood and put back). The next run finds
    /dev/kmsg's first record numbered past the Xid's, says the log is not whole (no journal runs here), and
    still judges the Xid, from memory."""
    import random
    import uuid

    from nodecheck.pipeline import build_report

    setting = "/proc/sys/kernel/printk_devkmsg"
    may_write_the_real_kernel_log()
    if not os.access(setting, os.W_OK):
        pytest.skip("needs kernel.printk_devkmsg")
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    tag = uuid.uuid4().hex[:12]
    address = f"00fe:{random.randrange(256):02x}:{random.randrange(32):02x}"  # noqa: S311 - a name, not a secret
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<4>NVRM: Xid (PCI:{address}): 13, nodecheck-test-{tag} Graphics Exception\n")
    live = LiveHost()
    before = build_report(live, ONLY_THE_LOG)
    (mine,) = [e for e in before.kernel_log.events if tag in e.message]
    assert not mine.remembered

    previous = open(setting).read().strip()
    import ctypes

    size = ctypes.CDLL(None).klogctl(10, None, 0)  # SYSLOG_ACTION_SIZE_BUFFER: the ring buffer's bytes
    try:
        try:
            with open(setting, "w") as out:
                out.write("on\n")
        except OSError as error:
            pytest.skip(f"kernel.printk_devkmsg cannot be changed here ({error})")
        line = f"<6>nodecheck-test-flood {tag} " + "x" * 900 + "\n"
        with open("/dev/kmsg", "w") as kmsg:
            for _ in range(8 * max(size, 1 << 17) // len(line)):  # bounded: 8 times the buffer at most
                kmsg.write(line)
                kmsg.flush()
                if _first_record()[1] > mine.usec:
                    break
    finally:
        with open(setting, "w") as out:
            out.write(previous + "\n")
    first_seq, first_usec = _first_record()
    assert first_seq > 0 and first_usec > mine.usec, "the flood did not overwrite the Xid's record"

    after = build_report(live, ONLY_THE_LOG)
    assert after.kernel_log.lost_before_usec is not None and after.kernel_log.lost_before_usec > 0
    (kept,) = [e for e in after.kernel_log.events if tag in e.message]
    assert kept.remembered and (kept.pci, kept.code, kept.usec) == (f"{address}.0", 13, mine.usec)
    assert [f.severity for f in after.findings if f.kind == "gpu_xid" and f.subject == f"pci:{address}.0"] == ["warning"]
