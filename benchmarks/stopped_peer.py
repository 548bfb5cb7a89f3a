"""When does a rank whose peer stopped end, and what does it say? Two ranks on this node (two NCCL "nodes" on GPU 0,
each its own NCCL_HOSTID, over NET/Socket on loopback; or gloo on CPUs): both finish one all-reduce, then rank 1
stops itself (SIGSTOP) and rank 0 starts the next. Prints when rank 0's process group timeout came, when PyTorch's
watchdog line (NCCL) or the collective's error (gloo) appeared, when rank 0 ended and how, beside the timeout it
was given, so that nodecheck's runner margin (`--timeout` + 15 s) can be set from a measured figure.

    python3 benchmarks/stopped_peer.py [--backend nccl|gloo] [--timeout 20] [--limit 150]
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

RANK = r"""
import datetime, os, signal, sys, time
import torch, torch.distributed as dist
rank, backend = int(os.environ["RANK"]), sys.argv[1]
device = torch.device("cuda:0") if backend == "nccl" else torch.device("cpu")
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(sys.argv[2])))
x = torch.ones(1 << 22, device=device)
dist.all_reduce(x)
if backend == "nccl":
    torch.cuda.synchronize()
print("ready", flush=True)
if rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
dist.all_reduce(x)
if backend == "nccl":
    torch.cuda.synchronize()
print("finished", flush=True)
"""

WATCHDOG = "Watchdog caught collective operation timeout"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(backend: str, timeout: float) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   NCCL_HOSTID=f"stopped-peer-rank{rank}", NCCL_IB_DISABLE="1", NCCL_SOCKET_IFNAME="lo",
                   GLOO_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, backend, str(timeout)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def follow(proc: subprocess.Popen, lines: list) -> threading.Thread:
    """Each output line of `proc` with the monotonic time it came."""
    def read():
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip()))
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def wait_stopped(proc: subprocess.Popen, limit: float) -> float | None:
    """The time rank 1's process was seen stopped (state T in /proc), None if it never was within `limit`."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return time.monotonic()
        except OSError:
            return None
        time.sleep(0.05)
    return None


def measure(backend: str, timeout: float, limit: float) -> dict:
    procs = launch(backend, timeout)
    lines: list = []
    readers = [follow(procs[0], lines), follow(procs[1], [])]
    out = {"backend": backend, "timeout_s": timeout, "limit_s": limit}
    try:
        stopped = wait_stopped(procs[1], limit)
        if stopped is None:
            out["error"] = "rank 1 never stopped: " + " | ".join(text for _, text in lines[-5:])
            return out
        try:
            code = procs[0].wait(timeout=limit)
        except subprocess.TimeoutExpired:
            code = None
        ended = time.monotonic()
        readers[0].join(timeout=5)
        said = [(when, text) for when, text in lines if when >= stopped and text.strip() and text != "ready"]
        watchdog = next((when for when, text in said if WATCHDOG in text), None)
        # the cause: the watchdog's line, else the last line rank 0 said (a Python exception's)
        cause = next((text for _, text in said if WATCHDOG in text), said[-1][1] if said else None)
        out.update(ended_s=None if code is None else round(ended - stopped, 1), exit=code,
                   watchdog_s=None if watchdog is None else round(watchdog - stopped, 1),
                   first_word_s=round(said[0][0] - stopped, 1) if said else None,
                   cause=cause[:300] if cause else None, finished=any(t == "finished" for _, t in said))
        return out
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)


def table(result: dict) -> str:
    t = result["timeout_s"]
    rows = [("process group timeout given", f"{t:g} s", "-"),
            ("rank 0 first said something after the stop", _s(result.get("first_word_s")), f"~{t:g} s"),
            ("PyTorch's watchdog line (NCCL)", _s(result.get("watchdog_s")), f"~{t:g} s" if result["backend"] == "nccl" else "-"),
            ("rank 0 ended", _s(result.get("ended_s")), f"<= {t + 15:g} s (nodecheck's runner limit)"),
            ("rank 0's exit status", str(result.get("exit")), "non-zero"),
            ("rank 0 finished the all-reduce", str(result.get("finished")), "False")]
    lines = [f"{'figure':<46} {'value':>10}  reference", *(f"{a:<46} {b:>10}  {c}" for a, b, c in rows)]
    if result.get("cause"):
        lines.append(f"    rank 0 said: {result['cause']}")
    if result.get("error"):
        lines.append(f"    FAILED: {result['error']}")
    return "\n".join(lines)


def _s(value) -> str:
    return "never" if value is None else f"{value:g} s"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--timeout", type=float, default=20)
    parser.add_argument("--limit", type=float, default=150)
    args = parser.parse_args(argv)
    result = measure(args.backend, args.timeout, args.limit)
    print(table(result))
    return 0 if result.get("exit") not in (None, 0) and not result.get("finished") else 1


if __name__ == "__main__":
    sys.exit(main())
