"""A rank stopped in the middle of a collective is named (issue 26, item 1): the first GPU run saw rank 0
end with "the worker did not finish within 45 s and was killed", naming no rank. Real gloo workers on
loopback, a real TCPStore; the stopped process is stopped with SIGSTOP once its own file says it is in
the timed all-reduce calls, so the stop always lands mid-collective."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import free_port, wait_until

from nodecheck.bench.heartbeat import Step, beat_step, judge, sidecar, where_it_was
from nodecheck.bench.results import run_worker
from nodecheck.core.errors import NodecheckError

pytest.importorskip("torch", reason="needs torch (sh deploy/install.sh bench)")

MiB = 1 << 20


def worker_argv(rank: int, tmp: Path, timeout: float) -> list[str]:
    """A gloo rank that would all-reduce 8 MiB for hours: the stop cannot come after it finished."""
    return [sys.executable, "-m", "nodecheck.bench.worker", "--backend", "gloo", "--sizes", str(8 * MiB), "--warmup", "1",
            "--iters", "1000000", "--timeout", str(timeout), "--node", f"host-{rank}", "--out", str(tmp / f"rank{rank}.json")]


def run_stopping(tmp_path: Path, stopped: int, timeout: float, limit: float) -> tuple[str, int]:
    """Ranks 0 and 1; rank `stopped` runs apart and is SIGSTOPped in its timed calls; the other runs under
    run_worker with time limit `limit`. Returns the other's error and the stopped worker's pid."""
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    watched = 1 - stopped
    apart = subprocess.Popen(worker_argv(stopped, tmp_path, timeout), env=dict(env, RANK=str(stopped)),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    stop = threading.Thread(target=_stop_in_timed_calls, args=(apart, tmp_path / f"rank{stopped}.json"), daemon=True)
    stop.start()
    try:
        with pytest.raises(NodecheckError) as error:
            run_worker(worker_argv(watched, tmp_path, timeout), tmp_path / f"rank{watched}.json", limit,
                       env=dict(env, RANK=str(watched)))
    finally:
        os.killpg(apart.pid, signal.SIGKILL)
        apart.wait(timeout=30)
        stop.join(timeout=5)
    return str(error.value), apart.pid


def _stop_in_timed_calls(proc: subprocess.Popen, out: Path) -> None:
    wait_until(lambda: "timed call" in beat_step(out), 120, "the rank's timed calls", pause=0.05)
    os.kill(proc.pid, signal.SIGSTOP)


def test_a_rank_stopped_mid_collective_is_named_with_the_collectives_own_error(tmp_path):
    """gloo's time-out (12 s) ends rank 0's all-reduce; before the worker writes that error, its beat thread
    has named rank 1, whose beat stopped."""
    message, pid = run_stopping(tmp_path, stopped=1, timeout=12, limit=120)
    assert message.startswith("RuntimeError: ") and "Timed out waiting 12000ms" in message, message
    assert f"rank 1 (host-1, pid {pid}) at 'all-reduce of 8 MiB: " in message, message  # its last beat's step
    assert "stopped beating in the job's store: its process is stopped, frozen or gone" in message
    assert "it was at" not in message  # the worker's own error says where; only a killed one is located


def test_a_worker_killed_at_its_time_limit_says_where_it_was_and_who_stopped(tmp_path):
    """The first GPU run's case: the runner's limit comes before the collective's time-out (here 45 s against
    300 s), so the worker is killed and writes nothing. Its beat thread's file says where it was and that
    rank 1 stopped. (45 s: the reading starts 10 s into the stall, or 8 s before the limit, whichever comes
    first, and takes 5 s; the stop comes once both ranks imported torch, which a loaded machine takes long for.)"""
    message, pid = run_stopping(tmp_path, stopped=1, timeout=300, limit=45)
    assert message.startswith("the worker did not finish within 45 s and was killed; it was at 'all-reduce of 8 MiB: "
                              "timed call "), message
    assert f"rank 1 (host-1, pid {pid}) at 'all-reduce of 8 MiB: " in message, message  # its last beat's step


def test_a_stopped_rank_0_is_named_as_the_store_that_stopped_answering(tmp_path):
    """Rank 0 serves the job's store: stopped, it takes the store along, and torch's store client then waits
    for ever. Rank 1's watch thread, which never calls the store, names it."""
    message, _ = run_stopping(tmp_path, stopped=0, timeout=300, limit=45)  # 45 s: as above
    assert "was killed; it was at 'all-reduce of 8 MiB: timed call " in message, message
    assert "the job's store stopped answering (no answer within 5 s): it lives in rank 0's process" in message, message


BEATS = {0: {"n": 7, "node": "a", "pid": 10, "step": "all-reduce of 1024 MiB: timed call 2 of 5"},
         1: {"n": 7, "node": "b", "pid": 11, "step": "all-reduce of 1024 MiB: timed call 2 of 5"},
         2: {"n": 9, "node": "c", "pid": 12, "step": "all-reduce of 1024 MiB: warm-up call 1 of 2"}}


def test_what_two_readings_say():
    moved = {r: dict(b, n=b["n"] + 5) for r, b in BEATS.items()}
    mine = "all-reduce of 1024 MiB: timed call 2 of 5"
    # rank 2's counter stood still: it stopped, whatever its step
    still = {**moved, 2: BEATS[2]}
    said_of = judge(BEATS, still, 0, mine, 12, world=3)
    assert said_of.startswith("rank 2 (c, pid 12) at 'all-reduce of 1024 MiB: warm-up call 1 of 2' stopped beating"), said_of
    # every rank beats, rank 2 at another step than the other two: its own work is stuck
    said_of = judge(BEATS, moved, 0, mine, 12, world=3)
    assert said_of.startswith("every rank still beats; 2 wait at 'all-reduce of 1024 MiB: timed call 2 of 5' (12 s here) "
                              "while rank 2 (c, pid 12) at 'all-reduce of 1024 MiB: warm-up call 1 of 2': that rank is stuck"), said_of
    # the one apart may be this rank: named as the others are
    said_of = judge(BEATS, moved, 2, "all-reduce of 1024 MiB: waiting for the warm-up to finish", 12, world=3)
    assert "while rank 2 (c, pid 12) at 'all-reduce of 1024 MiB: waiting for the warm-up to finish'" in said_of, said_of
    # all at one step (the numbers aside: pairs of one exchange round, calls one apart): the collective itself
    pairs = {r: dict(b, step=f"pair exchange round 0: timed send from rank {r - r % 2} to rank {r - r % 2 + 1}")
             for r, b in moved.items()}
    assert "the collective itself is stalled" in judge(BEATS, pairs, 0, pairs[0]["step"], 12, world=3)
    same = {r: dict(b, step=mine) for r, b in moved.items()}
    assert "the collective itself is stalled" in judge(BEATS, same, 0, mine, 12, world=3)
    # a rank that never beat is named so, never called stopped; this rank is never its own suspect
    said_of = judge({0: BEATS[0]}, {0: BEATS[0]}, 0, mine, 3, world=3)
    assert said_of == "ranks 1, 2 never beat in the job's store: not started, or stuck before its first beat", said_of
    assert "stopped" not in judge({0: BEATS[0]}, {0: BEATS[0]}, 0, mine, 3, world=1)
    # nor one whose beats carry no counter (another version's, or garbage): nothing says it stopped
    countless = {1: {"node": "b", "step": mine}}
    assert "stopped" not in judge(countless, countless, 0, mine, 3, world=2)


def test_many_stopped_ranks_are_counted_past_eight():
    first = {r: {"n": 1, "node": f"n{r}", "pid": r, "step": "x"} for r in range(40)}
    second = {**first, 0: {"n": 2, "node": "n0", "pid": 0, "step": "x"}}
    text = judge(first, second, 0, "x", 10)
    assert text.count("rank ") == 8 and "and 31 more stopped beating" in text, text


def test_a_garbled_or_missing_step_file_says_nothing(tmp_path):
    out = tmp_path / "rank0.json"
    assert where_it_was(out, killed=True) is None
    sidecar(out).write_bytes(b"\xff{NaN" * 5000)
    assert where_it_was(out, killed=True) is None
    sidecar(out).write_text('{"step": "x", "for_s": 3, "diagnosis": null}')
    assert where_it_was(out, killed=True) == "it was at 'x' for 3 s" and where_it_was(out, killed=False) is None


def test_a_step_records_when_it_began():
    current = Step()
    current("a")
    before = current.since
    time.sleep(0.01)
    current("b")
    assert current.text == "b" and current.since > before


def test_beats_are_read_from_a_real_store_whatever_some_ranks_left_there():
    """Ranks 0 and 2 beat, rank 1 never did, rank 3 left garbage: the reading holds 0 and 2 (one multi_get
    when every key is there; multi_get would wait for ever on rank 1's missing key)."""
    import datetime

    import torch.distributed as dist

    from nodecheck.bench.heartbeat import read_beats

    store = dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=10))
    store.set("nodecheck/beat/0", '{"n": 3, "node": "a", "pid": 1, "step": "x"}')
    store.set("nodecheck/beat/2", '{"n": 5, "node": "c", "pid": 2, "step": "y"}')
    store.set("nodecheck/beat/3", "NaN")
    assert read_beats(store, 4) == {0: {"n": 3, "node": "a", "pid": 1, "step": "x"}, 2: {"n": 5, "node": "c", "pid": 2, "step": "y"}}
    store.set("nodecheck/beat/1", '{"n": 1}')
    assert sorted(read_beats(store, 4)) == [0, 1, 2]


def test_a_rank_that_does_not_read_never_waits_to_explain(tmp_path):
    """Past 64 ranks only rank 0 and each node's first rank read the others' beats (1024 readers of 1024 beats
    would load rank 0's store when every rank stalls at once): the others beat, and explain nothing."""
    from nodecheck.bench.heartbeat import Heartbeat

    quiet = Heartbeat(lambda: None, 5, 128, "n", tmp_path / "out.json", 2.0, current=Step(), reads=False)
    assert quiet.explain() is None and not quiet.urgent.is_set()  # it asked its beat thread for nothing
    quiet.step.since -= 3600  # stalled an hour: still no reading
    assert not quiet._stalled()


def test_a_rank_has_beaten_once_its_heartbeat_started(tmp_path):
    """The first beat goes at once and start() waits for it: a rank then always beats before its first collective.
    (Before, it went a second in: a rank stopped in its first second of collectives read as one that "never beat",
    once in the suite's runs.) A real TCPStore on loopback."""
    import datetime

    import torch.distributed as dist

    from nodecheck.bench.heartbeat import Heartbeat, said

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10))
    current = Step()
    current("all-reduce of 8 MiB: warm-up call 1 of 1")

    def connect():
        return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))

    beat = Heartbeat(connect, 1, 2, "host-1", tmp_path / "rank1.json", 2.0, current=current).start()
    try:
        assert server.check(["nodecheck/beat/1"])  # no sleep before: start() returned after the first beat
        assert beat.last_beat["step"] == "all-reduce of 8 MiB: warm-up call 1 of 1" and beat.last_beat["n"] == 1
        wait_until(lambda: said(tmp_path / "rank1.json"), 10, "the step file")
        assert said(tmp_path / "rank1.json")["beat"]["step"] == "all-reduce of 8 MiB: warm-up call 1 of 1"
    finally:
        beat.stop()
