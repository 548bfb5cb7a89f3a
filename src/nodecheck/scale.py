"""`nodecheck scale`: will data-parallel training scale to N GPUs with this cluster's bandwidth?
(seeds 000, 001, 002). Pure arithmetic; the CLI gathers the inputs.

Per optimizer step every GPU all-reduces the gradients. With nccl-tests' convention
busbw = algbw x 2(n-1)/n, the all-reduce of B bytes over n GPUs takes

    Tc = 2(n-1)/n x B / busbw        (0 on one GPU)

and with Ts the compute time of a step (micro-step time x accumulation steps):

    efficiency without overlap  Ts / (Ts + Tc)
    efficiency with full overlap  Ts / max(Ts, Tc)   (communication hidden behind the backward pass)
    speed-up over one GPU  n x efficiency

Inside one node the intra-node busbw applies; across nodes the inter-node busbw (the slowest hop
of a hierarchical all-reduce).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

GRAD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Workload:
    params: float
    grad_dtype: str  # fp32, bf16, fp16
    micro_step_s: float  # compute of one forward+backward on one GPU
    accum: int = 1  # gradient accumulation steps per optimizer step

    @property
    def grad_bytes(self) -> float:
        return self.params * GRAD_BYTES[self.grad_dtype]

    @property
    def step_s(self) -> float:
        return self.micro_step_s * self.accum


@dataclass(frozen=True)
class Fabric:
    gpus_per_node: int
    inter_busbw: float  # bytes/s, all-reduce across nodes
    intra_busbw: float  # bytes/s, all-reduce inside one node
    source: str  # where the figures come from (measured path, spec, by hand)
    nics: int = 1  # the inter-node busbw scales with NICs used (seed 001's second port)
    rails: int | None = None  # NICs per node the inter-node figure already runs over (None: not known)
    # a multi-node NVLink domain (GB200 NVL72): a job of up to domain_gpus GPUs crosses nodes over NVLink, at
    # domain_busbw (None: the in-node figure, NVLink too), and only a larger one over the network
    domain_gpus: int | None = None
    domain_busbw: float | None = None

    def __post_init__(self) -> None:
        # a busbw of 0 (a failed run written as 0) or NaN would read as "communication is free"
        for name, value in (("across nodes", self.inter_busbw), ("inside a node", self.intra_busbw)):
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ValueError(f"all-reduce busbw {value!r} {name}: not a usable bandwidth (must be finite and above 0)")


@dataclass
class Row:
    gpus: int
    nodes: int
    busbw: float | None
    comm_s: float
    step_s: float
    efficiency: float  # no overlap
    efficiency_overlap: float
    speedup: float
    needed_busbw: float | None  # for the target efficiency, without overlap
    needed_busbw_overlap: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def comm_time(gpus: int, grad_bytes: float, busbw: float) -> float:
    return 0.0 if gpus <= 1 else 2 * (gpus - 1) / gpus * grad_bytes / busbw


def needed_busbw(gpus: int, grad_bytes: float, step_s: float, target: float, overlap: bool) -> float | None:
    """The busbw at which efficiency reaches `target` (None on one GPU: nothing to communicate)."""
    if gpus <= 1:
        return None
    allowed = step_s / target if overlap else step_s * (1 / target - 1)  # the Tc that still meets the target
    return 2 * (gpus - 1) / gpus * grad_bytes / allowed if allowed > 0 else float("inf")


def row(work: Workload, fabric: Fabric, gpus: int, target: float) -> Row:
    nodes = max(1, -(-gpus // fabric.gpus_per_node))
    busbw = None if gpus <= 1 else fabric.intra_busbw if nodes == 1 else \
        (fabric.domain_busbw or fabric.intra_busbw) if in_domain(fabric, gpus) else fabric.inter_busbw * fabric.nics
    comm = comm_time(gpus, work.grad_bytes, busbw) if busbw else 0.0
    eff = work.step_s / (work.step_s + comm)
    eff_overlap = work.step_s / max(work.step_s, comm)
    return Row(gpus, nodes, busbw, comm, work.step_s, eff, eff_overlap, gpus * eff,
               needed_busbw(gpus, work.grad_bytes, work.step_s, target, False),
               needed_busbw(gpus, work.grad_bytes, work.step_s, target, True))


def in_domain(fabric: Fabric, gpus: int) -> bool:
    """Whether a job of `gpus` GPUs fits one multi-node NVLink domain (NCCL then crosses its nodes over NVLink)."""
    return bool(fabric.domain_gpus) and gpus <= fabric.domain_gpus


def gpu_counts(gpus_per_node: int, max_nodes: int) -> list[int]:
    """1 GPU, one full node, then 2, 4, 8 ... nodes up to max_nodes (and max_nodes itself)."""
    nodes = [1]
    while nodes[-1] * 2 <= max_nodes:
        nodes.append(nodes[-1] * 2)
    if nodes[-1] != max_nodes:
        nodes.append(max_nodes)
    counts = [1] + [n * gpus_per_node for n in nodes]
    return sorted(set(counts))


def table(work: Workload, fabric: Fabric, max_nodes: int, target: float) -> list[Row]:
    return [row(work, fabric, gpus, target) for gpus in gpu_counts(fabric.gpus_per_node, max_nodes)]


def levers(work: Workload, fabric: Fabric, gpus: int, target: float) -> list[tuple[str, Row]]:
    """Seed 001's levers, each added on top of the previous: bf16 gradients, 2 accumulation steps, a
    second NIC (across nodes only)."""
    steps = [("as given", work, fabric)]
    if work.grad_dtype == "fp32":
        work = replace(work, grad_dtype="bf16")
        steps.append(("+ bf16 gradients (half the bytes)", work, fabric))
    work = replace(work, accum=work.accum * 2)
    steps.append((f"+ {work.accum} accumulation steps (communicate half as often)", work, fabric))
    if gpus > fabric.gpus_per_node and not in_domain(fabric, gpus):  # inside the domain no NIC carries it
        fabric = replace(fabric, nics=fabric.nics * 2)
        steps.append((f"+ {_more_nics(fabric)} (twice the inter-node busbw)", work, fabric))
    return [(label, row(w, f, gpus, target)) for label, w, f in steps]


def _more_nics(fabric: Fabric) -> str:
    """The NIC lever's label: "a second NIC" only where the figure ran over one; an 8-rail node needs 16."""
    if fabric.rails is None:
        return "twice the NICs per node"
    have = fabric.rails * fabric.nics // 2
    return "a second NIC" if have == 1 else f"{have * 2} NICs per node where {have} are"


def pick_row(rows: list[dict], grad_bytes: float) -> dict | None:
    """The smallest measured payload at least as large as the gradients (busbw grows with the payload
    until it saturates); gradients past the largest payload take the largest."""
    if not rows:
        return None
    larger = [r for r in rows if r["size_bytes"] >= grad_bytes]
    return min(larger, key=lambda r: r["size_bytes"]) if larger else max(rows, key=lambda r: r["size_bytes"])


def fabric_from_report(report, gpus_per_node: int | None, grad_bytes: float, domain_gpus: int | None = None) -> Fabric:
    """Intra- and inter-node all-reduce busbw from a Report (`nodecheck bench --json`), at the payload
    the gradients give (pick_row over the measured sweep); without measurements, the specs of the
    slowest GPU pair and NIC, said so. On a node of a multi-node NVLink domain, the domain's size (domain_gpus,
    else IMEX's node list) and busbw (bench's all-reduce across its nodes, else the in-node figure)."""
    # a world of one rank carries no figure (bytes_per_second null): it says nothing of any link
    measured = [m for m in report.measurements
                if m.ok and m.bytes_per_second is not None and m.test in ("allreduce", "nccl_tests")]
    over_nvlink = [m for m in measured if m.scope == "cluster" and m.details.get("path_kind") == "nvlink"]
    intra = [m for m in measured if m.scope == "node"]
    inter = [m for m in measured if m.scope == "cluster" and m not in over_nvlink]
    if inter or over_nvlink:
        run = (inter or over_nvlink)[0]
        nodes = {n.get("node") for n in run.details.get("nodes", [])} or {None}
        gpus_per_node = gpus_per_node or max(1, (run.ranks or 1) // len(nodes))
    gpus_per_node = gpus_per_node or len(report.gpus) or 1
    return _with_domain(report, _levels(report, gpus_per_node, grad_bytes, intra, inter), over_nvlink, domain_gpus, grad_bytes)


def _levels(report, gpus_per_node: int, grad_bytes: float, intra: list, inter: list) -> Fabric:
    from nodecheck.core.errors import NodecheckError
    from nodecheck.core.units import format_bytes

    if intra or inter:
        across, inside = (inter or intra)[0], (intra or inter)[0]  # one measured level stands for both
        (across_bw, across_at), (inside_bw, inside_at) = _busbw_at(across, grad_bytes), _busbw_at(inside, grad_bytes)
        return Fabric(gpus_per_node, across_bw, inside_bw, f"measured: {across.path} at {format_bytes(across_at)}, "
                                                           f"{inside.path} at {format_bytes(inside_at)}",
                      rails=_measured_rails(inter[0]) if inter else None)
    nic_specs = [p.bytes_per_second for p in report.paths if p.scope == "nic" and p.bytes_per_second]
    pair_specs = [p.bytes_per_second for p in report.paths if p.scope == "gpu-pair" and p.bytes_per_second]
    rails, basis, count = rail_spec(report, gpus_per_node)
    if rails is None and not nic_specs:
        raise NodecheckError("it holds no all-reduce measurement and no NIC speed: run `nodecheck bench --tests "
                             "allreduce --json` under torchrun/srun and pass that, or give --busbw")
    across = rails or min(nic_specs)
    return Fabric(gpus_per_node, across, min(pair_specs) if pair_specs else across,
                  f"spec, not measured ({basis or 'slowest NIC'}; slowest GPU pair): applications reach ~80% of it",
                  rails=count if rails else 1)


def _with_domain(report, fabric: Fabric, over_nvlink: list, domain_gpus: int | None, grad_bytes: float) -> Fabric:
    """The fabric with its multi-node NVLink domain, where the node is in one (its GPUs' fabric names a cluster)
    or the caller says one's size."""
    from nodecheck.core.units import format_bytes

    if not (report.in_nvlink_domain() or domain_gpus or over_nvlink):
        return fabric
    listed = len(report.imex.nodes) * fabric.gpus_per_node if report.imex and report.imex.nodes else None
    size, said = (domain_gpus, "--nvlink-domain-gpus") if domain_gpus else (listed, "IMEX's node list")
    if not size:
        return replace(fabric, source=f"{fabric.source}; this node is in a multi-node NVLink domain of unknown size: "
                                      "rows across nodes assume the network (say it: --nvlink-domain-gpus N)")
    busbw, how = None, "the in-node figure (NVLink too)"
    if over_nvlink:
        busbw, at = _busbw_at(over_nvlink[0], grad_bytes)
        how = f"measured: {over_nvlink[0].path} at {format_bytes(at)}"
    return replace(fabric, domain_gpus=size, domain_busbw=busbw,
                   source=f"{fabric.source}; inside its multi-node NVLink domain of {size} GPUs ({said}): {how}")


def rail_spec(report, gpus_per_node: int) -> tuple[float | None, str, int]:
    """Across nodes, unmeasured: the bound `bench` judges a job of `gpus_per_node` ranks per node by, the sum of
    the distinct RDMA rails nearest those GPUs (src/nodecheck/assemble/rails.py: NCCL runs a ring over each), its basis and how
    many rails. (None, "", 0) when the node has no active RDMA rail (NCCL would use a socket NIC) or a rail's
    rate is unknown."""
    from nodecheck.assemble.rails import fabric_nics, rank_rails, ring_bound

    fabric = fabric_nics(report, {})
    if not fabric:
        return None, "", 0
    used = {n.name: n for gpu in report.gpus[:gpus_per_node] for n in rank_rails(report, gpu, fabric)} or {n.name: n for n in fabric}
    bound, basis = ring_bound(report, list(used.values()), None)
    return (bound, basis, len(used)) if bound else (None, "", 0)


def _measured_rails(measurement) -> int | None:
    """The most distinct rails any node of a measured all-reduce ran over (bench records each rank's rails, as
    `job_bound` sums them); None when the Report does not say."""
    from nodecheck.core.pairing import node_key

    nodes = (measurement.details or {}).get("nodes")
    per_node: dict[tuple, set] = {}
    for member in nodes if isinstance(nodes, list) else []:
        if isinstance(member, dict) and isinstance(member.get("rails"), list):
            names = {r.get("name") for r in member["rails"] if isinstance(r, dict) and isinstance(r.get("name"), str)}
            per_node.setdefault(node_key(member), set()).update(names)
    most = max((len(names) for names in per_node.values()), default=0)
    return most or None


def _busbw_at(measurement, grad_bytes: float) -> tuple[float, float]:
    rows = [r for r in (measurement.details or {}).get("rows", []) if isinstance(r, dict) and "busbw" in r]
    chosen = pick_row(rows, grad_bytes)
    if chosen is None:
        return measurement.bytes_per_second, measurement.payload_bytes or 0
    return chosen["busbw"], chosen["size_bytes"]


def finite(value):
    """JSON has no NaN or Infinity: a number that is not finite is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def micro_step(step_time, flops, peak_tflops, mfu) -> float:
    """Seconds of one micro-step: --step-time as given, or --flops / (--peak-tflops x --mfu)."""
    from nodecheck.core.units import parse_count

    if (step_time is None) == (flops is None):
        raise ValueError("give one of --step-time SECONDS or --flops N (with --peak-tflops and --mfu)")
    if step_time is not None:
        if not 0 < step_time < math.inf:
            raise ValueError(f"--step-time {step_time:g}: must be above zero (and finite)")
        return step_time
    if not (peak_tflops and 0 < peak_tflops < math.inf) or not 0 < mfu <= 1:
        raise ValueError("--flops needs --peak-tflops above zero (and finite) and --mfu in (0, 1]")
    rate = peak_tflops * 1e12 * mfu  # 1e-320 x 1e-300 is 0.0 in floating point
    seconds = parse_count(flops) / rate if rate > 0 else math.inf
    if not 0 < seconds < math.inf:
        raise ValueError(f"--flops {flops} at {peak_tflops:g} TFLOP/s x {mfu:g} MFU: not a usable step time")
    return seconds
