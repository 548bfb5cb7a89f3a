"""/metrics latency (p50, p99) at 50 concurrent clients, resident memory and idle CPU of
`nodecheck serve` on this machine (live, live while probing every second, and an 8-GPU snapshot), side by side with Debian's prometheus-node-exporter measured in
the same run. Goals: nodecheck p99 <= 5 ms; RSS <= 1.5x node_exporter's.
Needs wrk and prometheus-node-exporter (apt). Run: .venv/bin/python benchmarks/bench_exporter.py"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import free_port  # noqa: E402


def wait_ready(url: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} never answered")


def rss_mib(pid: int) -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{pid}/status").read())[1]) / 1024


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url: str, seconds: int, clients: int) -> dict:
    out = subprocess.run(["wrk", "-t", "2", "-c", str(clients), "-d", f"{seconds}s", "--latency", url],
                         capture_output=True, text=True, timeout=seconds + 30).stdout
    pct = dict(re.findall(r"^\s+(50|99)(?:\.000)?%\s+(\S+)\s*$", out, re.M))
    if not pct:
        raise SystemExit(f"wrk printed no latency distribution:\n{out}")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"p50": pct.get("50"), "p99": pct.get("99"), "rps": re.search(r"Requests/sec:\s+(\S+)", out)[1],
            "non2xx": int(errors[1]) if errors else 0, "socket_errors": re.search(r"Socket errors: (.*)", out)}


def measure(name: str, argv: list[str], url: str, args) -> dict:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_ready(url)
        time.sleep(2)  # first probe round done
        before = cpu_seconds(proc.pid)
        time.sleep(args.idle)
        idle = (cpu_seconds(proc.pid) - before) / args.idle
        size = len(urllib.request.urlopen(url, timeout=5).read())
        load = wrk(url, args.seconds, args.clients)
        return {"name": name, "rss_mib": rss_mib(proc.pid), "idle_cpu": idle, "kib": size / 1024, **load}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU sampling")
    args = parser.parse_args()
    for tool in ("wrk", "prometheus-node-exporter"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt install wrk prometheus-node-exporter)")
    from helpers import hgx_nvml, make_snapshot  # the 8-GPU snapshot the tests use

    entry = str(Path(sys.executable).parent / "nodecheck")
    port_nc, port_busy, port_hgx, port_ne = free_port(), free_port(), free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        hgx = make_snapshot(Path(tmp) / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
        rows = [
            measure("nodecheck serve (live, --interval 60)", [entry, "serve", "--listen", f"127.0.0.1:{port_nc}"],
                    f"http://127.0.0.1:{port_nc}/metrics", args),
            measure("nodecheck serve (live, probing every 1 s)", [entry, "serve", "--listen", f"127.0.0.1:{port_busy}", "--interval", "1"],
                    f"http://127.0.0.1:{port_busy}/metrics", args),
            measure("nodecheck serve --from 8-GPU snapshot", [entry, "serve", "--listen", f"127.0.0.1:{port_hgx}", "--from", str(hgx)],
                    f"http://127.0.0.1:{port_hgx}/metrics", args),
            measure("prometheus-node-exporter (Debian)",
                    ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port_ne}"], f"http://127.0.0.1:{port_ne}/metrics", args),
        ]
    print(f"{args.clients} concurrent clients, {args.seconds} s of wrk; idle CPU over {args.idle:g} s")
    print(f"{'exporter':40} {'body KiB':>8} {'p50':>9} {'p99':>9} {'req/s':>9} {'non-2xx':>8} {'RSS MiB':>8} {'idle CPU':>9}")
    for r in rows:
        print(f"{r['name']:40} {r['kib']:8.1f} {r['p50']:>9} {r['p99']:>9} {r['rps']:>9} {r['non2xx']:>8} {r['rss_mib']:8.1f} {r['idle_cpu']:9.2%}")
    print(f"RSS ratio nodecheck (live) / node_exporter: {rows[0]['rss_mib'] / rows[-1]['rss_mib']:.2f}")


if __name__ == "__main__":
    main()
