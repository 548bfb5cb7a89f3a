"""`nodecheck serve` on a bad day: a live host whose nvidia-smi hangs (killed at the probe's timeout)
and whose lstopo prints garbage, probed every second, under N concurrent scrapers for S seconds.
Prints scrapes answered, failed scrapes (goal: 0) and scrapes per second.
Run: .venv/bin/python benchmarks/bench_serve_faults.py [--clients 200] [--seconds 30]
(tests/system/test_serve.py runs the same scenario, short.)"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import free_port  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exporter import wait_ready  # noqa: E402


def hostile_bin(directory: Path) -> Path:
    """A PATH entry with a hung nvidia-smi and an lstopo that prints garbage."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in (("nvidia-smi", "sleep 60"), ("lstopo-no-graphics", "echo '<html>not xml'")):
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)
    return directory


def scrape_load(url: str, clients: int, seconds: float) -> tuple[int, list[bytes]]:
    """`clients` threads scrape `url` back to back for `seconds`; (successes, failures' first bytes)."""
    failures, successes, lock = [], [0], threading.Lock()
    deadline = time.monotonic() + seconds

    def scraper():
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    body = response.read()
                    ok = response.status == 200 and b"nodecheck_probe_success" in body
            except Exception as error:  # any failed scrape is what is counted
                ok, body = False, repr(error).encode()
            with lock:
                if ok:
                    successes[0] += 1
                else:
                    failures.append(body[:200])

    threads = [threading.Thread(target=scraper, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 15)
    return successes[0], failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PATH=f"{hostile_bin(Path(tmp) / 'bin')}:{os.environ['PATH']}")
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "nodecheck", "serve", "--listen", f"127.0.0.1:{port}",
                                 "--interval", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            wait_ready(url)
            ok, failed = scrape_load(url, args.clients, args.seconds)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
    print(f"{args.clients} clients x {args.seconds:g} s, nvidia-smi hung, lstopo garbage, probing every 1 s")
    print(f"  scrapes answered {ok}, failed {len(failed)} (goal 0), {ok / args.seconds:.0f} scrapes/s")
    for body in failed[:3]:
        print(f"  failure: {body!r}")


if __name__ == "__main__":
    main()
