"""NCCL Inspector's Prometheus output (NCCL_INSPECTOR_PROM_DUMP=1; NVIDIA/nccl plugins/profiler/inspector,
inspector_prom.cc and README "Current Metric Format Examples"): one file per GPU, `nccl_inspector_metrics_<UUID>.prom`,
rewritten every dump interval (30 s or more) with the latest snapshot, a line per metric and bucket:

    nccl_bus_bandwidth_gbs{version="v5.1",slurm_job_id="unknown",node="nvl72004-T01",gpu="GPU0",comm_name="DP Group 0",
        n_nodes="1",nranks="4",collective="AllReduce",message_size="4-5GB",algo_proto="Ring_ll"} 678.263
    nccl_collective_exec_time_microseconds{...same labels...} 9498.47
    nccl_p2p_bus_bandwidth_gbs{..., p2p_operation="Send", message_size="512-513MB"} 464.9

The bus bandwidth is the geometric mean of the bucket's operations since the last dump. A bucket written twice (the
file appended within an interval) keeps its last value. Bounded: MAX_LINE per line, MAX_SAMPLES per file; a line that
is not one of these metrics is counted, never a crash. Raises only ParseError (no Inspector metric at all)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from nodecheck.core.errors import ParseError
from nodecheck.core.units import to_int

MAX_LINE = 4096  # the plugin's label buffer is 1 KiB
MAX_SAMPLES = 200_000  # per file: 8 communicators on a GPU make some 24 KB
METRICS = ("nccl_bus_bandwidth_gbs", "nccl_collective_exec_time_microseconds", "nccl_p2p_bus_bandwidth_gbs",
           "nccl_p2p_exec_time_microseconds")
_LINE = re.compile(r"^(nccl_[a-z0-9_]{1,60})\{(.{0,%d})\}[ \t]+(\S{1,40})(?:[ \t]+-?\d{1,20})?$" % MAX_LINE)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]{0,60})="((?:[^"\\]|\\.){0,512})"(?:,|$)')
_HEAD = re.compile(r"^nccl_(?:p2p_)?(?:bus_bandwidth_gbs|collective_exec_time_microseconds|exec_time_microseconds)\{", re.MULTILINE)


@dataclass
class PromSample:
    """One bucket of one GPU: a communicator's collective (or p2p operation) of one size class."""

    job: str
    node: str
    gpu: str  # as the plugin names it: GPU<cuda index>
    comm_name: str
    nranks: int | None
    n_nodes: int | None
    op: str  # the collective, or the p2p operation
    p2p: bool
    message_size: str  # the bucket, e.g. 4-5GB
    algo_proto: str | None
    busbw: float | None = None  # GB/s
    exec_us: float | None = None


def is_inspector_prom(text: str) -> bool:
    return _HEAD.search(text[:1 << 14]) is not None


def parse_inspector_prom(text: str) -> tuple[list[PromSample], int]:
    """The samples, and how many lines were not read."""
    samples: dict[tuple, PromSample] = {}
    skipped = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = _LINE.match(line[:MAX_LINE + 200]) if len(line) <= MAX_LINE + 200 else None
        value = _number(found[3]) if found else None
        labels = _labels(found[2]) if found and found[1] in METRICS else None
        if labels is None or value is None or len(samples) >= MAX_SAMPLES:
            skipped += 1
            continue
        p2p = found[1].startswith("nccl_p2p_")
        op = labels.get("p2p_operation" if p2p else "collective", "unknown")
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "version")) + (("p2p", p2p),)
        sample = samples.get(key)
        if sample is None:
            sample = samples[key] = PromSample(labels.get("slurm_job_id", "unknown")[:64], labels.get("node", "unknown")[:255],
                                               labels.get("gpu", "unknown")[:16], labels.get("comm_name", "unknown")[:128],
                                               _count(labels.get("nranks")), _count(labels.get("n_nodes")), op[:40], p2p,
                                               labels.get("message_size", "unknown")[:24], labels.get("algo_proto"))
        if found[1].endswith("bandwidth_gbs"):
            sample.busbw = value
        else:
            sample.exec_us = value
    if not samples:
        raise ParseError("no NCCL Inspector metric (nccl_bus_bandwidth_gbs{...} lines, NCCL_INSPECTOR_PROM_DUMP=1)")
    return list(samples.values()), skipped


def _labels(text: str) -> dict[str, str] | None:
    labels, at = {}, 0
    while at < len(text):
        found = _LABEL.match(text, at)
        if found is None:
            return None
        labels[found[1]] = found[2].replace('\\"', '"').replace("\\\\", "\\")
        at = found.end()
    return labels


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _count(text: str | None) -> int | None:
    value = to_int(text)
    return value if value is not None and 0 <= value < 10**9 else None
