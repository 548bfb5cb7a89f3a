"""nodecheck's state file (src/nodecheck/host/state.py, src/nodecheck/probes/history.py): acknowledgements kept for one boot, a broken
or hostile file forgotten rather than fatal, concurrent writers never losing each other's entries, and
`nodecheck clear` end to end on the real kernel log."""

import json
import random
import threading
from pathlib import Path

import pytest
from helpers import cli, may_write_the_real_kernel_log, raised_as_unit_user

from nodecheck.host.state import STATE_FILE, acknowledge, boot_id, read_state
from nodecheck.probes.history import history_from
from nodecheck.report.events import Acknowledgement


def ack(subject: str = "gpu3", usec: int | None = 5) -> Acknowledgement:
    return Acknowledgement("gpu_xid", subject, usec, 1, "ops", 1.0)


def test_acknowledgements_hold_for_this_boot_only(tmp_path):
    acknowledge(ack(), tmp_path)
    raw = {"boot_id": boot_id(), "state": read_state(tmp_path)}
    assert [a.subject for a in history_from(raw).acknowledgements] == ["gpu3"]
    rebooted = dict(raw, boot_id="another-boot")
    assert history_from(rebooted).acknowledgements == []
    assert history_from(rebooted).boot_id == "another-boot"


@pytest.mark.parametrize("content", [b"", b"{", b"[]", b"\xff\xfe", b'{"boot_id": 1, "acknowledgements": 5}',
                                     b'{"acknowledgements": [{"kind": "gpu_xid"}, "x", null]}'])
def test_a_broken_state_file_is_forgotten_not_fatal(tmp_path, content):
    (tmp_path / STATE_FILE).write_bytes(content)
    history = history_from({"boot_id": boot_id(), "state": read_state(tmp_path)})
    assert history.acknowledgements == []
    acknowledge(ack(), tmp_path)  # and the next write starts it afresh
    assert len(history_from({"boot_id": boot_id(), "state": read_state(tmp_path)}).acknowledgements) == 1


def test_one_broken_entry_costs_itself_only(tmp_path):
    good = {"kind": "gpu_xid", "subject": "gpu1", "upto_usec": 9, "count": 1, "by": "ops", "at": 1.0}
    state = {"boot_id": "b", "acknowledgements": [{"kind": "gpu_xid", "subject": 7}, good, {"nonsense": True}]}
    assert [a.subject for a in history_from({"boot_id": "b", "state": state}).acknowledgements] == ["gpu1"]


def test_concurrent_writers_keep_every_acknowledgement(tmp_path):
    threads = [threading.Thread(target=acknowledge, args=(ack(f"gpu{n}"), tmp_path)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    subjects = {a["subject"] for a in json.loads((tmp_path / STATE_FILE).read_text())["acknowledgements"]}
    assert subjects == {f"gpu{n}" for n in range(16)}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and p.name != ".lock"] == []  # no temporary left


def test_an_unwritable_state_directory_is_a_clear_message(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    from nodecheck.core.errors import NodecheckError

    with pytest.raises(NodecheckError, match="STATE_DIRECTORY"):
        acknowledge(ack(), blocker / "state")


def test_a_directory_root_made_is_a_clear_message_to_a_user_who_may_open_its_lock():
    """Found on the lent GPU machine: `inspect` as root made /var/lib/nodecheck (and its .lock, which anyone may
    open); the same `inspect` under the unit's uid then raised PermissionError from the state file's temporary, a
    traceback. Writing the state now fails as opening the lock does: a NodecheckError, which the run keeps in memory."""
    import os
    import shutil
    import tempfile

    from nodecheck.host.state import record_round
    from nodecheck.report.events import CounterSample

    if os.geteuid() != 0:
        pytest.skip("needs root (to drop to the units' user)")
    directory = Path(tempfile.mkdtemp(prefix="nodecheck-state-", dir="/tmp"))  # a folder the unit's user can reach
    try:
        directory.chmod(0o755)
        record_round(CounterSample(100.0, {"gpu/0000:00:06.0/pcie_replays": 0}), 10.0, None, "boot", directory)  # as root
        said = raised_as_unit_user(lambda: record_round(CounterSample(200.0, {"gpu/0000:00:06.0/pcie_replays": 0}), 10.0,
                                                        None, "boot", directory))
        assert said.startswith(f"NodecheckError: cannot write nodecheck's state in {directory} (Permission denied)"), said
    finally:
        shutil.rmtree(directory)


def test_clear_acknowledges_a_real_kernel_event_and_a_new_one_fails_again(tmp_path, monkeypatch):
    """As root: a watched Xid written into the real /dev/kmsg at an address no machine has is a gpu_xid
    finding; `nodecheck clear` acknowledges it (who, when, in $STATE_DIRECTORY); the same event again is a
    finding again."""
    may_write_the_real_kernel_log()
    address = f"00fe:{random.randrange(256):02x}:{random.randrange(32):02x}"  # noqa: S311 - a name, not a secret
    subject = f"pci:{address}.0"

    def write_xid():
        try:
            with open("/dev/kmsg", "w") as kmsg:
                kmsg.write(f"<4>NVRM: Xid (PCI:{address}): 13, nodecheck-test Graphics Exception\n")
        except OSError as error:
            pytest.skip(f"/dev/kmsg refuses writes here ({error})")

    def findings():
        result = cli("inspect", "--json")
        return [f for f in json.loads(result.stdout)["findings"] if f["kind"] == "gpu_xid" and f["subject"] == subject]

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    write_xid()
    assert [f["severity"] for f in findings()] == ["warning"]
    cleared = cli("clear", "gpu_xid", "--gpu", address)
    assert cleared.returncode == 0 and f"cleared {subject}: 1 event(s), codes 13" in cleared.stdout, cleared.stdout
    (entry,) = [a for a in json.loads((tmp_path / STATE_FILE).read_text())["acknowledgements"] if a["subject"] == subject]
    assert entry["by"] and entry["at"] > 0
    assert findings() == []
    assert "nothing to clear" in cli("clear", "gpu_xid", "--gpu", address).stdout
    write_xid()
    assert [f["severity"] for f in findings()] == ["warning"]
    assert cli("clear", "ecc_disabled").returncode == 2


def test_samples_keep_the_newest_one_old_enough_for_a_rate(tmp_path):
    from nodecheck.host.state import record_round
    from nodecheck.report.events import CounterSample

    def kept():
        return [s["uptime_s"] for s in json.loads((tmp_path / STATE_FILE).read_text())["samples"]]

    for uptime in (100.0, 150.0, 155.0, 158.0):
        record_round(CounterSample(uptime, {"k": int(uptime)}), 10.0, None, "boot", tmp_path)
    assert kept() == [100.0, 150.0, 155.0, 158.0]  # 100 is the newest at least 10 s before 158
    record_round(CounterSample(165.0, {"k": 165}), 10.0, None, "boot", tmp_path)
    assert kept() == [155.0, 158.0, 165.0]  # now 155 is
    history = history_from({"boot_id": "boot", "state": read_state(tmp_path)})
    assert [s.counters["k"] for s in history.samples] == [155, 158, 165]
    record_round(CounterSample(5.0, {"k": 1}), 10.0, None, "rebooted", tmp_path)
    assert [s["uptime_s"] for s in json.loads((tmp_path / STATE_FILE).read_text())["samples"]] == [5.0]


def test_without_a_writable_state_directory_a_daemon_keeps_its_samples_in_memory(tmp_path, monkeypatch):
    """serve's host lives across rounds: where the state file cannot be written, the previous round's
    counters come from memory, so its rates still work."""
    from nodecheck.host.live import LiveHost
    from nodecheck.report.events import CounterSample

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("STATE_DIRECTORY", str(blocker / "state"))
    host = LiveHost()
    assert "STATE_DIRECTORY" in host.remember(CounterSample(100.0, {"k": 1}), 10.0)
    history = history_from(host.history())
    assert [(s.uptime_s, s.counters) for s in history.samples] == [(100.0, {"k": 1})]
    assert history_from(LiveHost().history()).samples == []  # another process has none
