"""What a huge kernel log costs nodecheck: parse time and peak memory of the kernel-log parser on logs at the
size bound (16 MiB: what /dev/kmsg, journalctl or dmesg may hand over), each beside its reference: the same
log's bytes read and split into lines by Python alone (the least any reader pays). Logs: the real XE9680
Xid 119 log (../shared/captures/public/health/xid) repeated to the bound, the same with every line an Xid,
every line an SXid event's "Severity" line from eight switches in turn (each folds into its event: the
parser looks back a few lines for it), and one hostile 16 MiB line. Run: .venv/bin/python benchmarks/bench_kernel_log.py"""

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
    from nodecheck.limits import MAX_COMMAND_OUTPUT
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


if __name__ == "__main__":
    main()
