"""What the Report's paths are and what was measured over them: how nodecheck spells a path (its scope, endpoints and
rank count, read in this one place) and a Measurement, one test on one path against that path's spec. The Report
(model.py) holds both; its documentation is docs/report-schema.md."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from nodecheck.core.typed_json import ESSENTIAL

# How nodecheck spells paths, read in this one place: (pattern, scope, endpoint groups, ranks group).
# A measurement from another node carries its node's name first ("node2/gpu0:host").
_PATHS = [  # digits bounded: a hostile Report's 5,000-digit rank count is no path, not int()'s ValueError
    (re.compile(r"gpu(\d{1,4}):host"), "host-link"),
    (re.compile(r"gpu(\d{1,4}):(?:memory|compute)"), "gpu"),  # the GPU itself: its memory, its compute
    (re.compile(r"gpu(\d{1,4})(?::|->|<->)gpu(\d{1,4})"), "gpu-pair"),
    (re.compile(r"nic:(.+)"), "nic"),
    (re.compile(r"(?:allreduce|nccl-tests):node-(\d{1,4})-gpus"), "node"),
    (re.compile(r"allreduce:(\d{1,7})-ranks"), "cluster"),
]


def measured_on(path: str) -> str | None:
    """The other node a measurement's path names ("node5" of "node5/gpu0:host": rank 0's Report of a job holds every
    node's in-node figures so), or None for the node whose Report it is."""
    return path.split("/", 1)[0] if "/" in path else None


def path_identity(path: str) -> tuple[str | None, list[str], int | None]:
    """(scope, endpoints, ranks) of a path: host-link (gpu0:host), gpu (gpu0:memory, gpu0:compute: the GPU itself), gpu-pair
    (gpu0:gpu1, gpu0->gpu1, gpu0<->gpu1), nic (nic:eth0), node (an all-reduce inside one node) or cluster (across
    nodes)."""
    bare = path.rsplit("/", 1)[-1]
    for pattern, scope in _PATHS:
        match = pattern.fullmatch(bare)
        if match is None:
            continue
        if scope == "host-link":
            return scope, [f"gpu{match[1]}", "host"], None
        if scope == "gpu":
            return scope, [f"gpu{match[1]}"], None
        if scope == "gpu-pair":
            return scope, [f"gpu{match[1]}", f"gpu{match[2]}"], None
        if scope == "nic":
            return scope, [match[1]], None
        return scope, [], int(match[1])
    return None, [], None


@dataclass
class Measurement:
    """One bandwidth test on one path, compared with that path's theoretical unidirectional spec."""

    path: str = field(metadata=ESSENTIAL)  # allreduce:3-ranks, gpu0:host ...
    test: str = field(metadata=ESSENTIAL)  # one of BENCH_TESTS
    ok: bool = field(metadata=ESSENTIAL)  # False: the test failed (error says why); no figure
    bytes_per_second: float | None  # busbw for collectives
    spec_bytes_per_second: float | None
    ratio: float | None  # measured / spec
    payload_bytes: int | None
    method: str  # how it was measured
    direction: str  # unidirectional, bidirectional, busbw
    details: dict = field(default_factory=dict)  # sweep rows, per-node figures ...
    error: str | None = None
    scope: str | None = None  # host-link, gpu-pair, node, cluster: from the path when not given
    ranks: int | None = None  # all-reduce: the ranks it ran over
    flops_per_second: float | None = None  # a test of compute (gemm): its figure, where bytes_per_second is None
    spec_flops_per_second: float | None = None  # the GPU model's dense throughput at the test's precision

    def __post_init__(self) -> None:
        if self.scope is None:
            self.scope, _, ranks = path_identity(self.path)
            self.ranks = self.ranks if self.ranks is not None else ranks

    @classmethod
    def measured(cls, path: str, test: str, rate: float, spec: float | None, payload: int | None, method: str,
                 direction: str, details: dict | None = None) -> "Measurement":
        if not math.isfinite(rate):  # a NaN passes every threshold: a figure that is none is a failed test
            failed = cls.failed(path, test, method, direction, f"measured no finite rate ({rate!r} B/s)")
            failed.details.update(details or {})
            return failed
        return cls(path, test, True, rate, spec, rate / spec if spec else None, payload, method, direction, details or {})

    @classmethod
    def computed(cls, path: str, test: str, flops: float, spec: float | None, payload: int | None, method: str,
                 direction: str, details: dict | None = None) -> "Measurement":
        """A test of compute: floating-point operations per second against the model's dense figure."""
        measured = cls.measured(path, test, flops, spec, payload, method, direction, details)
        if measured.ok:
            measured.flops_per_second, measured.spec_flops_per_second = measured.bytes_per_second, measured.spec_bytes_per_second
            measured.bytes_per_second = measured.spec_bytes_per_second = None
        return measured

    @property
    def figure(self) -> float | None:
        """What was measured, in its own unit: FLOP/s for a test of compute, bytes/s for the rest."""
        return self.flops_per_second if self.flops_per_second is not None else self.bytes_per_second

    @property
    def spec_figure(self) -> float | None:
        return self.spec_flops_per_second if self.flops_per_second is not None else self.spec_bytes_per_second

    @classmethod
    def failed(cls, path: str, test: str, method: str, direction: str, error: str) -> "Measurement":
        return cls(path, test, False, None, None, None, None, method, direction, error=error)
