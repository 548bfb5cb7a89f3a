"""Fuzz every parser from real captures (tests/fuzz/targets.py), N mutated inputs each, in this one
process capped at --memory-mib of address space and --seconds per input. Prints, per parser, the
inputs tried and every exception other than the parser's own error (the first few in full); exits 1
when there was any. On demand: .venv/bin/python tests/fuzz/run.py --per-parser 10000
(the suite runs a few hundred per parser: tests/system/test_fuzz_captures.py)."""

from __future__ import annotations

import argparse
import random
import resource
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class Slow(Exception):
    """An input took longer than --seconds (quadratic parsing, a loop that never ends)."""


def fuzz(target, count: int, seed: int, seconds: float) -> tuple[int, list[tuple[str, str, str]]]:
    """(inputs tried, [(exception type, message, input excerpt)]) for one target."""
    rng = random.Random(f"{target.name}:{seed}")
    seeds = target.seeds()
    if not seeds:  # the captures are not where SHARED points (NODECHECK_SHARED, else ../shared)
        from fuzz.targets import SHARED

        raise FileNotFoundError(f"no seed captures for {target.name} under {SHARED}")
    escapes = []

    def alarm(*_):
        raise Slow(f"more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        for _ in range(count):
            data = target.mutate(rng.choice(seeds), rng)
            signal.setitimer(signal.ITIMER_REAL, seconds)
            try:
                target.call(data)
            except target.allowed:
                pass
            except (Exception, Slow) as error:  # everything else is what the fuzzer is looking for
                escapes.append((type(error).__name__, str(error)[:200], repr(data)[:300], traceback.format_exc(limit=-3)))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return count, escapes


def main() -> int:
    from fuzz.targets import targets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-parser", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0, help="longest one input may take")
    parser.add_argument("--memory-mib", type=int, default=2048, help="address-space cap of this process")
    parser.add_argument("--only", help="comma-separated target names")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (args.memory_mib << 20, args.memory_mib << 20))
    wanted = set(args.only.split(",")) if args.only else None
    failed = 0
    for target in targets():
        if wanted and target.name not in wanted:
            continue
        started = time.monotonic()
        try:
            tried, escapes = fuzz(target, args.per_parser, args.seed, args.seconds)
        except FileNotFoundError as error:
            print(f"{target.name:14} skipped: {error}")
            continue
        kinds = Counter(kind for kind, *_ in escapes)
        print(f"{target.name:17} {tried:6} inputs  {len(escapes):5} escapes  {time.monotonic() - started:6.1f} s  {dict(kinds) or ''}")
        for kind, message, excerpt, trace in escapes[:3]:
            print(f"    {kind}: {message}\n      input: {excerpt}\n      {trace.strip().splitlines()[-3:]}")
        failed += bool(escapes)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
