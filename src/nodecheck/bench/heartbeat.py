"""Which rank hung: every rank of an all-reduce beats in the job's store, and a rank whose own step stalls
names the ranks that stopped beating.

A hung collective says nothing of why. PyTorch's NCCL watchdog names only this rank's timed-out
operation, gloo says a recv timed out, and when the bench's own time limit comes first the worker is
killed saying nothing at all (issue 26, the first GPU run: a SIGSTOPped rank 1 left rank 0 with "did
not finish within 45 s and was killed"). So each rank, from a thread of its own (torch and NCCL release
the GIL while they wait), puts a counter and its current step in the store every BEAT_S. A stopped or
frozen process, or one whose node fell off the network, stops beating. When this rank's step has not
moved for `suspect_after` seconds (or its time limit nears), it reads every rank's beat twice,
STALE_AFTER_S apart by its own clock (node clocks differ), and names the ranks whose counter did not
move. A second thread, which never touches the store, writes what this rank is doing and what it found
to a file beside its --out file each beat; the runner reads it whatever ends the worker (an exception,
the watchdog's abort, the time limit). It is also the one to notice a store that stopped answering:
torch's store client waits for ever on a stopped server (check, get, wait and add did, past their
timeout, with torch 2.13), so a store call still pending after STORE_TIMEOUT_S names the store's host.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from nodecheck.core import typed_json
from nodecheck.core.units import first_of

BEAT_S = 1.0
STALE_AFTER_S = 5.0  # a counter unchanged this long is a rank that stopped: 5 beats missed, not one late
STORE_TIMEOUT_S = 5.0  # a store call pending this long: the store's host (rank 0 or torchrun) is gone
MAX_BEAT = 4096  # bytes of one rank's beat read from the store (another host's words)
SHOWN = 8  # ranks named in one sentence; the rest are counted
EVERY_RANK_READS = 64  # up to this world every rank names who stopped; past it rank 0 and each node's first rank


def suspect_after(collective_timeout: float) -> float:
    """Seconds a step may last before this rank asks who stopped: early enough that the answer (another
    STALE_AFTER_S) is written before the collective's own time-out aborts the process."""
    return max(2.0, min(10.0, collective_timeout / 4))


class Step:
    """What this rank's main thread is doing, and since when (monotonic)."""

    def __init__(self) -> None:
        self.text, self.since = "starting", time.monotonic()

    def __call__(self, text: str) -> None:
        self.text, self.since = text, time.monotonic()


step = Step()  # the worker's one main thread sets it; the beat thread reads it


def sidecar(out: str | Path) -> Path:
    """The file beside a worker's --out that says what it was doing (and who stopped, once known)."""
    return Path(f"{out}.step")


def _key(rank: int) -> str:
    return f"nodecheck/beat/{rank}"


class Heartbeat:
    """A rank's two threads: one beats in the job's store (and, stalled, reads the others' beats) through a client
    of its own that connect() opens (the main thread's may be blocked inside the process group); the other
    writes the sidecar and judges a store call that never returns."""

    def __init__(self, connect: Callable, rank: int, world: int, node: str, out: str | Path, suspect_s: float,
                 deadline: float | None = None, current: Step = step, reads: bool = True) -> None:
        self.connect, self.rank, self.world, self.node = connect, rank, world, node
        self.reads = reads  # whether this rank reads the others' beats when it stalls (every rank beats)
        self.path, self.suspect_s, self.deadline, self.step = sidecar(out), suspect_s, deadline, current
        self.store = None
        self.store_error: str | None = None
        self.diagnosis: str | None = None
        self.diagnosed_since: float | None = None  # the step (its start) the diagnosis is about
        self.pinned: str | None = None  # the diagnosis of the step that failed: it stays, whatever step follows
        self.first: tuple[float, float, dict] | None = None  # (step's start, when read, beats) of a pending diagnosis
        self.urgent = threading.Event()
        self.armed = threading.Event()  # set once the ranks met: before, the ready step names who did not come
        self.saying = threading.Lock()  # the watch thread and explain() both rewrite the sidecar
        self.diagnosed = threading.Event()
        self.stopped = threading.Event()
        self.count = 0
        self.beaten = threading.Event()  # the first beat reached the store
        self.last_beat: dict | None = None  # what this rank's last beat put in the store (the sidecar repeats it)
        self.calling_since: float | None = None  # when the pending store call began (monotonic)
        self.threads = [threading.Thread(target=self._run, name="nodecheck-heartbeat", daemon=True),
                        threading.Thread(target=self._watch, name="nodecheck-heartbeat-watch", daemon=True)]

    def start(self) -> "Heartbeat":
        """Start both threads and wait (at most STORE_TIMEOUT_S) for the first beat: a rank then always beats before
        its first collective, so no rank in the collectives reads as one that never beat."""
        for thread in self.threads:
            thread.start()
        self.beaten.wait(STORE_TIMEOUT_S)
        return self

    def stop(self) -> None:
        """Both threads end within a beat, unless a store call hangs (its thread is a daemon: it dies with the worker)."""
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=2 * BEAT_S)

    def explain(self) -> str | None:
        """After a failed collective, in the main thread: wait (at most STALE_AFTER_S and a few beats) for the
        beat thread to name who stopped, so the runner finds it beside the error."""
        since = self.step.since
        if not self.reads or not self.armed.is_set():
            return None
        self.diagnosed.clear()  # before the check: an answer landing between the two still ends the wait
        if self.diagnosed_since != since:
            self.urgent.set()
            self.diagnosed.wait(STALE_AFTER_S + 3 * BEAT_S + STORE_TIMEOUT_S)
        if self.diagnosed_since == since:
            self.pinned = self.diagnosis
            self._say()  # now: the worker may end before the watch thread's next beat
        return self.pinned

    def _run(self) -> None:
        """The beat thread: the only one to call the store; it beats at once, then every BEAT_S."""
        while not self.store_error:
            self.count += 1
            self._beat()
            if self._stalled():
                self._diagnose()
            if self.stopped.wait(BEAT_S):
                break

    def _watch(self) -> None:
        """The sidecar's writer, and the judge of a store call that never returns."""
        while not self.stopped.wait(BEAT_S):
            calling = self.calling_since
            if calling is not None and time.monotonic() - calling > STORE_TIMEOUT_S and not self.store_error:
                self.store_error = f"no answer within {STORE_TIMEOUT_S:g} s"
            if self.store_error and self.diagnosed_since != self.step.since:
                self._found(self.step.since, store_gone(self.store_error, self.rank))
            self._say()

    def _call(self, call: Callable):
        self.calling_since = time.monotonic()
        try:
            return call()
        finally:
            self.calling_since = None

    def _beat(self) -> None:
        try:
            if self.store is None:
                self.store = self._call(self.connect)
            beat = {"n": self.count, "node": self.node, "pid": os.getpid(), "step": self.step.text[:200],
                    "for_s": round(time.monotonic() - self.step.since, 1)}
            self._call(lambda: self.store.set(_key(self.rank), json.dumps(beat)))
            self.last_beat = beat
            self.beaten.set()
        except Exception as error:  # the store's host is gone (stopped, killed, unreachable)
            self.store_error = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"

    def arm(self) -> None:
        """From now on a stalled step is read out: the ranks met, and every one beats."""
        self.armed.set()

    def _stalled(self) -> bool:
        if not self.reads or not self.armed.is_set() or self.diagnosed_since == self.step.since:
            return False  # not yet in the collectives, or this step has its answer
        if self.urgent.is_set():
            return True
        near_end = self.deadline is not None and time.time() >= self.deadline - STALE_AFTER_S - 3 * BEAT_S
        return near_end or time.monotonic() - self.step.since >= self.suspect_s

    def _diagnose(self) -> None:
        since = self.step.since
        if self.first and self.first[0] != since:
            self.first = None  # the step moved on while the first reading waited
        try:
            beats = self._call(lambda: read_beats(self.store, self.world))
        except Exception as error:
            self.store_error = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
            return  # the watch thread says so
        now = time.monotonic()
        if self.first is None:
            self.first = (since, now, beats)
        elif now - self.first[1] >= STALE_AFTER_S:
            self._found(since, judge(self.first[2], beats, self.rank, self.step.text, now - since, self.world))

    def _found(self, since: float, diagnosis: str) -> None:
        self.diagnosis, self.diagnosed_since, self.first = diagnosis, since, None
        self.urgent.clear()
        self.diagnosed.set()

    def _say(self) -> None:
        """Rewrite the sidecar (whole, by rename: the runner may read it at any moment)."""
        said = {"step": self.step.text[:200], "for_s": round(time.monotonic() - self.step.since, 1), "rank": self.rank,
                "beat": self.last_beat,  # what the other ranks last read of this one
                "diagnosis": self.pinned or (self.diagnosis if self.diagnosed_since == self.step.since else None)}
        try:
            with self.saying:
                partial = self.path.with_name(self.path.name + ".new")
                partial.write_text(json.dumps(said))
                partial.replace(self.path)
        except OSError:
            pass  # the runner's directory is gone: it is ending this worker anyway


def read_beats(store, world: int) -> dict[int, dict]:
    """Every rank's last beat that the store holds (a rank that never beat is absent), in one round trip when
    every rank has beaten (multi_get waits for a missing key, so the present ones are found first). Raises
    when the store does not answer."""
    keys = [_key(rank) for rank in range(world)]
    present = list(range(world)) if store.check(keys) else [r for r in range(world) if store.check([keys[r]])]
    values = store.multi_get([keys[r] for r in present]) if present else []
    beats = {}
    for rank, value in zip(present, values, strict=True):
        try:
            beat = typed_json.loads(bytes(value[:MAX_BEAT]))
        except ValueError:
            continue  # not a beat as this version writes one
        if isinstance(beat, dict):
            beats[rank] = beat
    return beats


def judge(first: dict[int, dict], second: dict[int, dict], me: int, my_step: str, waited: float,
          world: int | None = None) -> str:
    """What two readings STALE_AFTER_S apart say: the ranks whose counter did not move; else the ranks that never
    beat (of `world`); else the ranks at another step than most (this one among them, maybe), their own work stuck;
    else that every rank beats and waits at one step: the collective itself stalled."""
    stopped = [r for r in sorted(second) if r != me and r in first and isinstance(second[r].get("n"), int)
               and first[r].get("n") == second[r].get("n")]  # a beat without a counter says nothing either way
    if stopped:
        return (f"{_named(stopped, second, with_step=True)} stopped beating in the job's store: "
                f"{'its process is' if len(stopped) == 1 else 'their processes are'} stopped, frozen or gone "
                f"(SIGSTOP, a debugger, memory pressure, a crash) or {'its' if len(stopped) == 1 else 'their'} node unreachable")
    never = [r for r in range(world or 0) if r != me and r not in second]
    if never:
        return f"{ranks_text(never)} never beat in the job's store: not started, or stuck before its first beat"
    beats = {**second, me: {**second.get(me, {}), "step": my_step}}
    shapes = {r: _shape(b.get("step")) for r, b in beats.items()}
    counts = Counter(shapes.values())
    if len(counts) == 1:
        return (f"every rank still beats and waits at '{my_step}' ({waited:.0f} s here): the collective itself is "
                "stalled (the network between the nodes, or NCCL), not one rank")
    usual = counts.most_common(1)[0][0]
    apart = sorted(r for r, shape in shapes.items() if shape != usual)
    example = next(beats[r].get("step") for r, shape in shapes.items() if shape == usual)
    return (f"every rank still beats; {counts[usual]} wait at '{str(example)[:200]}' ({waited:.0f} s here) while "
            f"{_named(apart, beats, with_step=True)}: {'that rank is' if len(apart) == 1 else 'those ranks are'} stuck "
            "in their own work (the GPU, or a call that never returns)")


def _shape(step) -> str:
    """A step with its numbers blanked: ranks of one pair exchange round, or one call apart, are at one step."""
    return re.sub(r"\d+", "#", str(step))


def ranks_text(ranks: list[int]) -> str:
    return f"rank {first_of(ranks, 16)}" if len(ranks) == 1 else f"ranks {first_of(ranks, 16)}"


def _named(ranks: list[int], beats: dict[int, dict], with_step: bool) -> str:
    parts = []
    for r in ranks[:SHOWN]:
        beat = beats.get(r, {})
        where = f" at '{str(beat.get('step'))[:200]}'" if with_step and beat.get("step") else ""
        parts.append(f"rank {r} ({str(beat.get('node', '?'))[:100]}, pid {beat.get('pid', '?')}){where}")
    more = f" and {len(ranks) - SHOWN} more" if len(ranks) > SHOWN else ""
    return ", ".join(parts) + more


def store_gone(error: str, me: int) -> str:
    if me == 0:
        return f"the job's store, which this rank serves, stopped answering ({error})"
    return (f"the job's store stopped answering ({error}): it lives in rank 0's process (under torchrun, in its agent on "
            "rank 0's node), which is stopped, frozen or gone, or its node unreachable")


def said(out: str | Path) -> dict | None:
    """In the runner: what the worker last wrote beside its --out file, or None."""
    try:
        with open(sidecar(out), "rb") as file:
            found = typed_json.loads(file.read(MAX_BEAT))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def beat_step(out: str | Path) -> str:
    """The step a worker's last beat put in the store, as its step file repeats it ("" before its first)."""
    beat = (said(out) or {}).get("beat")
    return str(beat.get("step", "")) if isinstance(beat, dict) else ""


def where_it_was(out: str | Path, killed: bool) -> str | None:
    """The worker's last step (when it was killed or aborted: its own error says where otherwise) and who
    stopped, as one clause for the failure's message; None when it said nothing."""
    found = said(out)
    if not found:
        return None
    parts = []
    if killed and found.get("step"):
        parts.append(f"it was at '{str(found['step'])[:200]}' for {found.get('for_s', '?')} s")
    if found.get("diagnosis"):
        parts.append(str(found["diagnosis"])[:1500])
    return "; ".join(parts) or None
