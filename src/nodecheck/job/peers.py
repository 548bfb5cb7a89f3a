"""A node or GPU below its peers, from NCCL Inspector's Prometheus snapshots (job/inspector_prom.py): the rule of
deploy/prometheus/nccl-inspector-rules.yml (NcclNodeBelowPeers) applied to the files themselves, for a job whose
metrics no Prometheus kept.

Buckets of one shape (job, collective, message size class, ranks and nodes per communicator) run the same work on
every GPU that holds one; a GPU whose bucket's bus bandwidth is below 0.8 of the median of the shape's GPUs (the
project's 80% rule), with three or more nodes holding that shape, is below its peers. A communicator that waits for
one late rank is low on every *other* rank, so the late one stands above them and nobody falls below the median: the
rule names what is slow, not what waited. Buckets under 1 MB are latency-bound (nccl-tests' bus bandwidth climbs
until some MB) and are not judged."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from nodecheck.job.inspector_prom import PromSample
from nodecheck.job.ranks import MIN_PEERS, SLOW_RATIO, Named

LARGE = ("MB", "GB", "TB")  # message size buckets judged


def judge_peers(samples: list[PromSample]) -> tuple[list[Named], list[str]]:
    shapes: dict[tuple, dict[tuple[str, str], list[float]]] = defaultdict(lambda: defaultdict(list))
    small = 0
    for sample in samples:
        if sample.p2p or not sample.busbw:
            continue
        if not sample.message_size.endswith(LARGE):
            small += 1
            continue
        shape = (sample.job, sample.op, sample.message_size, sample.nranks, sample.n_nodes)
        shapes[shape][(sample.node, sample.gpu)].append(sample.busbw)
    notes = [f"{small} bucket(s) under 1 MB: latency-bound, not compared"] if small else []
    slow: dict[tuple[str, str], list[tuple[tuple, float, int]]] = defaultdict(list)
    gpus_of: dict[tuple, set] = {}
    few = 0
    for shape, by_gpu in shapes.items():
        nodes = {node for node, _ in by_gpu}
        if len(nodes) < MIN_PEERS:
            few += 1
            continue
        rates = {gpu: math.exp(statistics.fmean(math.log(r) for r in values)) for gpu, values in by_gpu.items()}
        median = statistics.median(rates.values())
        gpus_of[shape] = set(rates)
        for gpu, rate in rates.items():
            if median > 0 and rate < SLOW_RATIO * median:
                slow[gpu].append((shape, rate / median, len(nodes)))
    if few:
        notes.append(f"{few} shape(s) held by fewer than {MIN_PEERS} nodes: too few peers to compare")
    return _named(slow, gpus_of), notes


def _named(slow: dict, gpus_of: dict) -> list[Named]:
    """One entry per slow GPU, or one per node when every GPU it holds in those shapes is slow."""
    by_node: dict[str, dict[str, list]] = defaultdict(dict)
    for (node, gpu), shapes in slow.items():
        by_node[node][gpu] = shapes
    named = []
    for node, gpus in sorted(by_node.items()):
        held = {gpu for shapes in gpus.values() for shape, _, _ in shapes for n, gpu in gpus_of[shape] if n == node}
        groups = [(None, [s for shapes in gpus.values() for s in shapes])] if held <= set(gpus) and len(held) > 1 else sorted(gpus.items())
        for gpu, shapes in groups:
            worst = min(shapes, key=lambda s: s[1])
            (job, coll, size, nranks, n_nodes), ratio, peers = worst
            where = f"{node} {gpu}" if gpu else f"{node} (all its GPUs: {', '.join(sorted(gpus))})"
            named.append(Named("below_peers", node, None, None, [], sorted({s[0][1] for s in shapes}), ratio, len(shapes),
                               gpu=gpu.removeprefix("GPU") if gpu else None,
                               message=f"{where}: {coll} {size} ({nranks} ranks, {n_nodes} node(s) a communicator) at {ratio:.2f} of "
                                       f"the median bus bandwidth of {peers} nodes' GPUs, in {len(shapes)} shape(s) of job {job}"))
    return named
