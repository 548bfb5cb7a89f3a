"""What a huge kernel log costs nodecheck: parse time and peak memory of the kernel-log parser on logs at the
size bound (16 MiB: what /dev/kmsg, journalctl or dmesg may hand over), each beside its reference: the same
log's bytes read and split into lines by Python alone (the least any reader pays). Logs: the real XE9680
Xid 119 log (../shared/captures/public/health/xid) repeated to the bound, the same with every line an Xid,
every line an SXid event's "Severity" line from eight switches in turn (each folds into its event: the
parser looks back a few lines for it), and one hostile 16 MiB line. Then what remembering the log costs a run
(src/nodecheck/assemble/open_events.py, src/nodecheck/host/state.py) at its bounds: a log of 10,000 events merged with 500 remembered ones it
no longer holds, beside sorting the log's events alone; and the state file's write of that round, beside the
write of the counters alone (what a run wrote before it remembered the log).
Run: .venv/bin/python benchmarks/bench_kernel_log.py"""

from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAPTURE = REPO.parent / "shared/captures/public/health/xid/gpud-dmesg-xid119-dell-xe9680.log"


def measure(fn, text: str) -> tuple[float, float, object]:
    tracemalloc.start()
    started = time.perf_counter()
    result = fn(text)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return seconds, peak, result


def _sxid_lines(size: int) -> str:
    """The driver's second line of an SXid event (as gpud's README quotes it), eight switches taking turns."""
    lines = "".join(f"[6781753.404848] nvidia-nvswitch{k}: SXid (PCI:0000:0{k}:00.0): 20034, Severity 1 Engine "
                    f"instance 60 Sub-engine instance 00\n" for k in range(8))
    return lines * (size // len(lines))


def main() -> None:
    from nodecheck.core.limits import MAX_COMMAND_OUTPUT
    from nodecheck.probes.kernel_log import MAX_EVENTS, parse_kernel_log

    if not CAPTURE.exists():
        sys.exit(f"{CAPTURE} is absent: this benchmark replays a real log")
    real = CAPTURE.read_text()
    xid_line = next(line for line in real.splitlines() if "NVRM: Xid" in line) + "\n"
    logs = {
        "real log repeated to 16 MiB": (real * (MAX_COMMAND_OUTPUT // len(real)))[:MAX_COMMAND_OUTPUT],
        "every line an Xid, 16 MiB": (xid_line * (MAX_COMMAND_OUTPUT // len(xid_line))),
        "every line an SXid, 16 MiB": _sxid_lines(MAX_COMMAND_OUTPUT),
        "one hostile 16 MiB line": "NVRM: Xid (PCI:0000:9b:00): " + "9" * (MAX_COMMAND_OUTPUT - 40) + "\n",
    }
    print(f"bound: {MAX_COMMAND_OUTPUT >> 20} MiB of log, {MAX_EVENTS} events kept")
    print(f"{'log':32} {'parse s':>8} {'peak MiB':>9} {'events':>7} | {'split s':>8} {'peak MiB':>9}  (reference: str.splitlines)")
    for name, text in logs.items():
        seconds, peak, events = measure(parse_kernel_log, text)
        ref_seconds, ref_peak, _ = measure(str.splitlines, text)
        print(f"{name:32} {seconds:8.3f} {peak:9.1f} {len(events):7} | {ref_seconds:8.3f} {ref_peak:9.1f}")
    remembering(parse_kernel_log(logs["every line an Xid, 16 MiB"]))


def remembering(log_events: list) -> None:
    """The memory's cost at its bounds, each beside its reference, best of 5 (ms)."""
    import tempfile
    from dataclasses import replace

    from nodecheck.assemble.open_events import with_memory
    from nodecheck.host.state import record_round
    from nodecheck.report.events import REMEMBERED_EVENTS, CounterSample, History, KernelLog, LogMemory

    log_events = [replace(e, usec=1_000_000 * (n + 1)) for n, e in enumerate(log_events)]
    gone = [replace(e, usec=e.usec // 1000, pci=f"0000:{n % 200:02x}:00.0") for n, e in enumerate(log_events[:REMEMBERED_EVENTS])]
    log = KernelLog(True, None, "/dev/kmsg", log_events, 10**13, 500_000)
    history = History("boot", kernel_log=LogMemory(gone, None, 10**12))
    counters = CounterSample(10_000.0, {f"aer/0000:{n:02x}:00.0/correctable": n for n in range(200)})

    def best(fn) -> float:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1000)
        return min(times)

    merged = with_memory(log, history)
    with tempfile.TemporaryDirectory() as memory, tempfile.TemporaryDirectory() as counters_only:
        rows = [
            (f"merge {len(log_events)} + {len(gone)} remembered", best(lambda: with_memory(log, history)),
             "sort the log's events", best(lambda: sorted(log_events, key=lambda e: e.usec))),
            (f"state write, {len(merged.events)} events", best(lambda: record_round(counters, 10.0, LogMemory(merged.events, None, 10**13), "boot", Path(memory))),
             "state write, counters only", best(lambda: record_round(counters, 10.0, None, "boot", Path(counters_only)))),
        ]
        size = (Path(memory) / "state.json").stat().st_size
    print(f"\n{'remembering the log':32} {'ms':>8} | {'reference':28} {'ms':>8}")
    for name, ms, reference, ref_ms in rows:
        print(f"{name:32} {ms:8.1f} | {reference:28} {ref_ms:8.1f}")
    print(f"state file at its bound: {size / 1024:.0f} KiB (the reader's limit: 1024 KiB)")


if __name__ == "__main__":
    main()
