"""nccl-tests' all_reduce_perf, when installed (on PATH) or configured ([bench] nccl_tests): run it
over every GPU of the node with a hard time limit and parse its table (nccl_tests.parse_nccl_log)."""

from __future__ import annotations

import shutil
import sys

from nodecheck.bench.gpu import slowest_pair, staged_if_shm
from nodecheck.bench.lifeline import environment
from nodecheck.bench.nccl_debug import attach, debug_env, debug_run
from nodecheck.bench.nccl_tests import parse_nccl_log
from nodecheck.errors import NodecheckError
from nodecheck.host import run_command
from nodecheck.model import Measurement, Report
from nodecheck.rails import fabric_nics, nic_rate, ring_bound

BINARY = "all_reduce_perf"
SIZES = {"quick": ("1G", "2G"), "full": ("8", "8G")}  # quick: payloads past saturation (nccl-tests captures)
METHOD = "nccl-tests all_reduce_perf -b {low} -e {high} -f 2 -g {gpus}; busbw of the largest out-of-place row"


def full_sweep_end(report: Report) -> str:
    """-e of the --full sweep: 8G, or less where the smallest GPU could not hold it (all_reduce_perf keeps a send
    and a receive buffer of that size, and NCCL needs room of its own): a quarter of its memory, as a power of 2."""
    known = [g.memory_bytes for g in report.gpus if g.memory_bytes]
    if not known:
        return "8G"
    fits = max(64 << 20, min(8 << 30, min(known) // 4))
    size = 1 << (fits.bit_length() - 1)
    return f"{size >> 30}G" if size >= 1 << 30 else f"{size >> 20}M"


def find_binary(config, environ: dict[str, str]) -> str | None:
    if config is not None and config.nccl_tests:
        return config.nccl_tests
    return shutil.which(BINARY, path=environ.get("PATH"))


def run_nccl_tests(report: Report, config, level: str, timeout: float, environ: dict[str, str]) -> Measurement:
    gpus = len(report.gpus)
    low, high = SIZES[level]
    if level == "full":
        high = full_sweep_end(report)
    method = METHOD.format(low=low, high=high, gpus=gpus)
    path = f"nccl-tests:node-{gpus}-gpus"
    binary = find_binary(config, environ)
    if binary is None:
        return _failed(path, method, f"{BINARY} is not installed (not on PATH; set [bench] nccl_tests in the config)")
    if gpus < 2:
        return _failed(path, method, f"all_reduce_perf inside the node needs at least two GPUs (found {gpus})")
    argv = [binary, "-b", low, "-e", high, "-f", "2", "-g", str(gpus)]
    env = dict(debug_env(standalone(environ)), **environment(None, timeout))
    try:  # under a lifeline: a C binary does not notice that the bench which started it was killed
        text = run_command([sys.executable, "-m", "nodecheck.bench.lifeline", *argv], timeout, env=env, what=BINARY)
        log = parse_nccl_log(text)
    except NodecheckError as error:
        return _failed(path, method, str(error))
    measurement = measurement_from_log(log, report, path, method) or _failed(path, method, f"{BINARY} printed no out-of-place result")
    return staged_if_shm(attach(measurement, debug_run(text)))  # NCCL's debug lines come mixed into the table


# What a launcher gives its ranks: an MPI-built all_reduce_perf that sees them joins the job's MPI world (or
# waits for it) instead of running alone on this node's GPUs.
LAUNCH_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "SLURM_STEP", "TORCHELASTIC_")
LAUNCH_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASK_PID",
                    "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_CPU_BIND", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                    "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def standalone(environ: dict[str, str]) -> dict[str, str]:
    """The environment without the launcher's rank and step variables. CUDA_VISIBLE_DEVICES stays: it may be
    what keeps the binary off another job's GPUs."""
    return {k: v for k, v in environ.items() if not k.startswith(LAUNCH_PREFIXES) and k not in LAUNCH_VARIABLES}


def measurement_from_log(log, report: Report, path: str, method: str, config=None, run=None,
                         nodes: int | None = None) -> Measurement | None:
    """The largest out-of-place busbw of an nccl-tests log, compared with what bounds it on this node: the slowest
    GPU pair for a collective inside the node, the ring bound of its rails for one across nodes (run: what NCCL's
    own lines in the log say, which may name its hosts; nodes: how many the operator says it spanned, where the
    log does not say); None when the log holds no out-of-place row. NodecheckError when `nodes` contradicts the
    hosts the log names."""
    rows = [r for r in log.rows if r.out_of_place]
    if not rows:
        return None
    largest = max(rows, key=lambda r: r.size_bytes)
    details = {"avg_busbw_gbytes": log.avg_busbw_gbytes, "rows": len(log.rows), "issues": log.issues, "devices": log.devices}
    across = _across_nodes(log, run, report, nodes)
    if across:
        spec, kind, basis = _network_bound(report, config, _ranks_per_node(log, nodes))
        details.update(path_kind=kind, spec_basis=basis, across_nodes=across)
    else:
        pair = slowest_pair(report)
        spec = pair.bytes_per_second if pair else None
        details.update(path_kind=pair.kind if pair else None, spec_basis=pair.basis if pair else None)
    measurement = Measurement.measured(path, "nccl_tests", largest.out_of_place.busbw_gbytes * 1e9, spec, largest.size_bytes,
                                       method, "busbw", details)
    if across:
        measurement.scope, measurement.ranks = "cluster", log.ranks
    return measurement


def _across_nodes(log, run, report: Report, nodes: int | None = None) -> str | None:
    """Why the log's job spanned nodes, or None when nothing says so: its device lines name several hosts, or (where
    they do not name every rank: a paste keeps a few) a rank past this node's GPUs, or NCCL's lines name several
    hosts, or the operator's --nodes. A log whose lines name every rank on one host is that host's, however many
    GPUs this node has now."""
    if nodes is not None:
        named = max(len(log.hosts), len(run.nodes) if run is not None else 0)
        if named > 1 and named != nodes:
            raise NodecheckError(f"--nodes {nodes}, but the log's lines name {named} hosts")
        if log.ranks and nodes > log.ranks:
            raise NodecheckError(f"--nodes {nodes}, but the log has {log.ranks} rank(s)")
        if nodes == 1:
            return None
        return f"its lines name {named} hosts" if named > 1 else f"--nodes {nodes} (said; the log does not name its hosts)"
    if len(log.hosts) > 1:
        return f"its device lines name {len(log.hosts)} hosts"
    if not _names_every_rank(log) and log.ranks and report.gpus and log.ranks > len(report.gpus):
        return f"its device lines name rank {log.ranks - 1}: {log.ranks} ranks or more, where this node has {len(report.gpus)} GPUs"
    if run is not None and len(run.nodes) > 1:
        return f"NCCL's lines name {len(run.nodes)} hosts"
    return None


def _ranks_per_node(log, nodes: int | None = None) -> int | None:
    """Ranks per node where the device lines name every rank on several hosts, evenly, or the ranks spread evenly
    over the --nodes the operator said; else None (unknown)."""
    if nodes and nodes > 1 and log.ranks and log.ranks % nodes == 0 and len(log.hosts) < 2:
        return log.ranks // nodes
    hosts = len(log.hosts)
    if hosts < 2 or not _names_every_rank(log) or log.ranks % hosts:
        return None
    return log.ranks // hosts


def _names_every_rank(log) -> bool:
    """Whether the log's device lines name each of its ranks (a paste may keep only a few of them)."""
    return bool(log.ranks) and len(log.devices) >= log.ranks


def _network_bound(report: Report, config, per_node: int | None) -> tuple[float | None, str | None, str]:
    """(spec, path kind, basis) of a collective across nodes judged on this node: the ring bound of its rails, as
    `bench` bounds its own all-reduce across nodes (with fewer ranks per node than rails, as many rails as ranks, a
    rank's traffic leaving by its GPU's rail: the slowest of them); none in a multi-node NVLink domain, whose jobs
    take NVLink inside the domain and the network between domains."""
    if report.in_nvlink_domain():
        return None, "nvlink", ("no spec: this node is in a multi-node NVLink domain (its GPUs' fabric names a cluster), "
                                "where a job across nodes takes NVLink inside the domain and the network between domains")
    rails = fabric_nics(report, {})
    if not rails:
        return None, None, "no spec: a job across nodes is bounded by the node's RDMA rails, and none is up on this node"
    if per_node and per_node < len(rails):
        rails = sorted(rails, key=lambda nic: nic_rate(report, nic, config) or 0)[:per_node]
    total, basis = ring_bound(report, rails, config)
    basis = f"{per_node} rank(s) per node; {basis}" if per_node else basis
    return total, "infiniband", basis if total else f"no spec: {basis}"


def _failed(path: str, method: str, error: str) -> Measurement:
    return Measurement.failed(path, "nccl_tests", method, "busbw", error)
