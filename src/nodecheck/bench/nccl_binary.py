"""nccl-tests' all_reduce_perf, when installed (on PATH) or configured ([bench] nccl_tests): run it
over every GPU of the node with a hard time limit and parse its table (nccl_tests.parse_nccl_log)."""

from __future__ import annotations

import shutil
import sys
import tempfile

from nodecheck.assemble.rails import fabric_nics, nic_rate, rail_rates, ring_bound
from nodecheck.bench.bounds import calibration, peer_access, slowest_pair
from nodecheck.bench.collective_rows import collective_of, ranks_from_rows
from nodecheck.bench.common import ABOVE_RING_BOUND, NVLS_NOTE, staged_if_shm
from nodecheck.bench.lifeline import environment
from nodecheck.bench.nccl_debug import TOPOLOGY_FILE, attach, debug_env, debug_run, read_topology
from nodecheck.bench.nccl_mnnvl import ran_mnnvl_across_nodes
from nodecheck.bench.nccl_tests import failed_check, parse_nccl_log
from nodecheck.bench.nccl_tests_job import not_one_job
from nodecheck.core.errors import NodecheckError
from nodecheck.core.units import format_size
from nodecheck.host.commands import run_command
from nodecheck.report.model import Measurement, Report
from nodecheck.verdicts.bandwidth import PARTIAL_MESH

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
    with tempfile.TemporaryDirectory(prefix="nodecheck-nccl-tests-") as tmp:
        env["NCCL_TOPO_DUMP_FILE"] = f"{tmp}/{TOPOLOGY_FILE}"  # NCCL's picture of the node, as the job's ranks see it
        try:  # under a lifeline: a C binary does not notice that the bench which started it was killed
            text = run_command([sys.executable, "-m", "nodecheck.bench.lifeline", *argv], timeout, env=env, what=BINARY)
            log = parse_nccl_log(text)
        except NodecheckError as error:
            return _failed(path, method, str(error))
        topology = read_topology(tmp)
    try:
        measurement = measurement_from_log(log, report, path, method, name=BINARY)
    except NodecheckError as error:
        return _failed(path, method, str(error))
    measurement = measurement or _failed(path, method, f"{BINARY} printed no out-of-place result")
    return staged_if_shm(attach(measurement, debug_run(text), topology))  # NCCL's debug lines come mixed into the table


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
                         nodes: int | None = None, name: str | None = None) -> Measurement | None:
    """The largest out-of-place busbw of an nccl-tests log, compared with what bounds its collective on this node
    (collective_bound): inside the node, the slowest GPU pair (or a partial mesh's NVLink); across nodes, its
    rails. The rank count comes from the device lines, else from the rows (busbw/algbw); run: what NCCL's own lines in
    the log say, which may name its hosts; nodes: how many the operator says it spanned; name: the file's name, which
    may name the collective (alltoall_perf.txt). None when the log holds no out-of-place row. NodecheckError when
    `nodes` contradicts the hosts the log names."""
    rows = [r for r in log.rows if r.out_of_place]
    if not rows:
        return None
    largest = max(rows, key=lambda r: r.size_bytes)
    if why := not_one_job(log):
        if not (check := failed_check(log)):
            raise NodecheckError(why)
        # wrong data is wrong in any run: judged alone, the speed not at all
        return Measurement.measured(path, "nccl_tests", largest.out_of_place.busbw_gbytes * 1e9, None, largest.size_bytes,
                                    method, "busbw", {"rows": len(log.rows), "issues": log.issues, "devices": log.devices,
                                                      "data_check": check, "spec_basis": f"no spec: {why}"})
    collective, how = collective_of(log, name)
    inferred = ranks_from_rows(log, collective)
    span = _rank_span(log, inferred)
    ranks = span[0] or None  # at least this many
    details = {"avg_busbw_gbytes": log.avg_busbw_gbytes, "rows": len(log.rows), "issues": log.issues, "devices": log.devices,
               "collective": collective, "collective_basis": how, "ranks_from_rows": list(inferred) if inferred else None}
    if check := failed_check(log):  # wrong data is wrong at any speed
        details["data_check"] = check
    across = _across_nodes(log, run, report, nodes, span)
    if across:
        over_nvlink = run is not None and ran_mnnvl_across_nodes(run)
        spanned = _nodes_of(log, run, nodes)
        ranks = _job_ranks(span, spanned, len(report.gpus))
        spec, kind, basis = _network_bound(report, config, collective, ranks, spanned, over_nvlink, span)
        details.update(path_kind=kind, spec_basis=basis, across_nodes=across)
    else:
        spec, kind, basis, assumed = _node_bound(report, collective, run)
        details.update(path_kind=kind, spec_basis=basis)
        if ranks and (variant := calibration(report, ranks, kind)):
            details["calibration"] = variant
        if assumed:
            details["path_assumed"] = assumed
    floor, where, levels_off, (earlier, share) = PLATEAU["across nodes" if across else "pcie" if str(kind).startswith("pcie")
                                                         else "in node"]
    if largest.size_bytes < floor:  # a run to a small -e, or a paste cut mid-table
        details["payload_below_plateau"] = (f"its largest message is {format_size(largest.size_bytes)}, below the {format_size(floor)} "
                                            f"where a healthy run's busbw stops climbing {where} ({levels_off})")
        if largest.size_bytes >= earlier:
            details["plateau_share"] = {"size_bytes": earlier, "share": share}
    measurement = Measurement.measured(path, "nccl_tests", largest.out_of_place.busbw_gbytes * 1e9, spec, largest.size_bytes,
                                       method, "busbw", details)
    nvswitch = kind == "nvlink" and not str(basis).startswith(PARTIAL_MESH)
    if measurement.ratio is not None and measurement.ratio > 1 and (across or nvswitch):
        measurement.details["note"] = ABOVE_RING_BOUND if across else NVLS_NOTE  # PCIe has no switch that reduces
    if across:
        measurement.scope, measurement.ranks = "cluster", ranks
    return measurement


# busbw climbs with the message size until the links, not the latency, bound it: a smaller largest row is no verdict on
# the path, and the faster the path the later it levels off. Published healthy runs (captures/public/nccl): nccl-tests#287's
# 4x RTX 5090 over PCIe reads 26.90 GB/s at 16 MiB and 27.26 at 128 MiB; superbench's 8x A100 SXM4 over NVLink 202 GB/s
# at 128 MiB, 222 at 256 MiB, 235 at 8 GiB; AWS's EKS 2x p5 job 167, 313 and 438 GB/s at 256 MiB, 1 GiB and 2 GiB.
# Below that size a healthy run still reached a known share of its level (the same runs: 24.07 of 27.26 GB/s at 4 MiB,
# 202 of 235 at 128 MiB, 167 of 438 at 256 MiB): a figure that, divided by that share, stays under half the threshold
# is slow whatever the payload (nccl#1453's 24 ranks read 5.3 GB/s at 512 MiB against eight 400G rails).
PLATEAU = {  # the path: (where busbw levels off, said as, the run that shows it, (a smaller size, the share reached there))
    "pcie": (16 << 20, "over PCIe", "nccl-tests#287's healthy 4x RTX 5090: 0.99 of its 128 MiB figure at 16 MiB",
             (4 << 20, 0.88)),
    "in node": (256 << 20, "over NVLink", "superbench's healthy 8x A100: 0.86 of its 8 GiB figure at 128 MiB, 0.95 at 256 MiB",
                (128 << 20, 0.86)),
    "across nodes": (1 << 30, "across nodes", "AWS's healthy EKS 2x p5 job: 0.38 of its 2 GiB figure at 256 MiB, 0.72 at 1 GiB",
                     (256 << 20, 0.38))}


def _rank_span(log, inferred: tuple[int, int] | None) -> tuple[int, int | None]:
    """(least, most) ranks the log allows, most None where nothing bounds it; (0, None) where nothing says. Device lines
    that name every rank settle it; a paste that keeps a few says at least the highest + 1; the rows' busbw/algbw bound it
    both ways, loosely where their figures are small (nccl-tests#176's 128 ranks read as 87 or more at 2.15 GB/s)."""
    if _names_every_rank(log):
        return log.ranks, log.ranks
    least = max(log.ranks or 0, inferred[0] if inferred else 0)
    return least, inferred[1] if inferred and least <= inferred[1] <= NO_JOB_BEYOND else None


# past this many ranks the rows set no upper bound (ranks_from_rows starts from 2**30 where no row bounds it)
NO_JOB_BEYOND = 1 << 20


def _job_ranks(span: tuple[int, int | None], nodes: int | None, gpus: int) -> int | None:
    """The job's rank count: the log's where it settles it, else the one multiple of its nodes in the span with no
    more ranks per node than this node has GPUs; None where several fit or nothing says."""
    least, most = span
    if least and least == most:
        return least
    if not nodes or not gpus:
        return None
    top = nodes * gpus if most is None else min(most, nodes * gpus)
    fits = range(-(-max(least, 1) // nodes) * nodes, top + 1, nodes)
    return fits[0] if len(fits) == 1 else None


def _ranks_said(span: tuple[int, int | None]) -> str:
    least, most = span
    return (f"{least}" if least == most else f"at least {least}" if most is None
            else f"{least} to {most}") if least else "an unknown number of"


def _nodes_of(log, run, nodes: int | None) -> int | None:
    """How many nodes the job spanned: --nodes, else the hosts its lines name where they name every rank."""
    if nodes:
        return nodes
    named = max(len(log.hosts), len(run.nodes) if run is not None else 0)
    if named > 1 and (_names_every_rank(log) or run is not None and len(run.nodes) > 1):
        return named
    return None


def _node_bound(report: Report, collective: str | None, run) -> tuple[float | None, str | None, str, str | None]:
    """(spec, path kind, basis, why the kind is assumed or None) of a collective inside the node. A log without NCCL's
    transport lines leaves P2P or staged to the node's P2P status or the GPU model; where neither says, the PCIe verdict
    is a note (details["path_assumed"])."""
    if collective not in IN_NODE_BOUNDED:
        return None, None, f"no spec: the collective is {collective or 'unknown'} ({NO_BOUND})", None
    pair = slowest_pair(report)
    if pair is None:
        return None, None, "no spec: no GPU pair, or a pair's spec unknown", None
    kind, assumed = pair.kind, None
    transports = (run.intra_node_transports if run is not None else None) or []
    if kind == "pcie" and not transports:  # staged_if_shm decides from NCCL's own lines where the log has them
        p2p, why = peer_access(report)
        if p2p is False:
            kind = "pcie-staged"
        elif p2p is None:
            assumed = f"judged as peer-to-peer over PCIe: the log has no NCCL transport lines, and {why}"
    return pair.bytes_per_second, kind, pair.basis, assumed


def _across_nodes(log, run, report: Report, nodes: int | None = None, span: tuple[int, int | None] = (0, None)) -> str | None:
    """Why the log's job spanned nodes, or None when nothing says so: its device lines name several hosts, or its
    ranks (the device lines', else what the rows' busbw/algbw give) outnumber this node's GPUs, or NCCL's lines name
    several hosts, or the operator's --nodes. A log whose lines name every rank on one host is that host's, however
    many GPUs this node has now."""
    ranks, most = span[0] or None, span[1]
    if nodes is not None:
        named = max(len(log.hosts), len(run.nodes) if run is not None else 0)
        if named > 1 and named != nodes:
            raise NodecheckError(f"--nodes {nodes}, but the log's lines name {named} hosts")
        if most and nodes > most:
            raise NodecheckError(f"--nodes {nodes}, but the log has {_ranks_said(span)} rank(s)")
        if nodes == 1 and ranks and report.gpus and ranks > len(report.gpus) and named < 2:
            raise NodecheckError(f"--nodes 1, but the log has {_ranks_said(span)} ranks, more than this node's "
                                 f"{len(report.gpus)} GPUs")
        if nodes == 1:
            return None
        return f"its lines name {named} hosts" if named > 1 else f"--nodes {nodes} (said; the log does not name its hosts)"
    if len(log.hosts) > 1:
        return f"its device lines name {len(log.hosts)} hosts"
    if not _names_every_rank(log) and ranks and report.gpus and ranks > len(report.gpus):
        said = f"its device lines name rank {log.ranks - 1}: " if log.ranks and log.ranks >= ranks else "its rows' busbw/algbw give "
        return f"{said}{_ranks_said(span)} ranks, where this node has {len(report.gpus)} GPUs"
    if run is not None and len(run.nodes) > 1 and not run.separate_hosts:
        return f"NCCL's lines name {len(run.nodes)} hosts"
    return None


def _names_every_rank(log) -> bool:
    """Whether the log's device lines name each of its ranks (a paste may keep only a few of them)."""
    return bool(log.ranks) and len(log.devices) >= log.ranks


# the collectives whose busbw a node's slowest GPU pair bounds (nccl-tests' busbw makes each comparable with the
# link rate: doc/PERFORMANCE.md); gather, scatter and hypercube have no bound here
IN_NODE_BOUNDED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv")
RING_BOUNDED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
NO_BOUND = "nodecheck knows what bounds all-reduce, all-gather, reduce-scatter, broadcast, reduce, alltoall and sendrecv"


def _network_bound(report: Report, config, collective: str | None, ranks: int | None, nodes: int | None,
                   run_over_nvlink: bool = False, span: tuple[int, int | None] = (0, None)) -> tuple[float | None, str | None, str]:
    """(spec, path kind, basis) of a collective across nodes judged on this node, from the rails of its ranks per node
    (as many rails as ranks where fewer, a rank's traffic leaving by its GPU's rail: the slowest of them): the ring
    bound (their sum) for all-reduce, all-gather, reduce-scatter, broadcast and reduce; for alltoall one GPU's rail x
    N/(N-1) x (n-1)/n over N nodes (a rank sends (N-1)/N of its data off the node over its own rail: sjeaugey, nccl-tests
    issues 130 and 267); for sendrecv one rail. None in a multi-node NVLink domain whose jobs take NVLink between nodes
    (IMEX ready, or NCCL's lines say so: run_over_nvlink), inside the domain and the network between domains; a
    domain without IMEX takes the rails. None without the ranks per node (say --nodes)."""
    nvlink, why = report.nvlink_across_nodes()
    if nvlink or report.in_nvlink_domain() and run_over_nvlink:
        why = why if nvlink else "NCCL's lines show NVLink between nodes"
        return None, "nvlink", (f"no spec: this node is in a multi-node NVLink domain ({why}), where a job across nodes "
                                "takes NVLink inside the domain and the network between domains")
    if collective not in IN_NODE_BOUNDED:
        return None, None, f"no spec: the collective is {collective or 'unknown'} ({NO_BOUND})"
    rails = fabric_nics(report, {})
    if not rails:
        return None, None, "no spec: a job across nodes is bounded by the node's RDMA rails, and none is up on this node"
    if not nodes:
        return None, "infiniband", (f"no spec: {_ranks_said(span)} ranks across nodes, and the log does not say how "
                                    "many ran on each node: pass --nodes N to judge it against that many ranks' rails")
    if not ranks:
        return None, "infiniband", (f"no spec: {_ranks_said(span)} ranks on {nodes} nodes leaves the ranks per node unsettled "
                                    f"(at most this node's {len(report.gpus)} GPUs each): the log's device lines ('# Rank N "
                                    "... on HOST') settle how many it had")
    if ranks % nodes:
        return None, "infiniband", f"no spec: {ranks} ranks do not split evenly over {nodes} nodes"
    per_node = ranks // nodes
    # a rank's traffic leaves by its GPU's rails: one on an HGX node of 8 GPUs and 8 HCAs, four on a p5 (32 EFA adapters
    # for 8 GPUs, all driven by aws-ofi-nccl: AWS's own 2x p5 job reached 438 GB/s busbw, past 8 adapters' 100 GB/s)
    share = max(1, len(rails) // (len(report.gpus) or per_node))
    if per_node * share < len(rails):
        rails = sorted(rails, key=lambda nic: nic_rate(report, nic, config) or 0)[:per_node * share]
    where = f"{per_node} rank(s) per node on {nodes} nodes" + (f", {share} rails per GPU" if share > 1 else "")
    if collective in RING_BOUNDED:
        total, basis = ring_bound(report, rails, config)
        return total, "infiniband", f"{where}; {basis}" if total else f"no spec: {basis}"
    rates = rail_rates(report, rails, config)
    if any(r["rate"] is None for r in rates):
        return None, "infiniband", f"no spec: the rate of {next(r['name'] for r in rates if r['rate'] is None)} is unknown"
    slowest = min(rates, key=lambda r: r["rate"])
    rail = slowest["rate"] * share  # one GPU's rails, at the slowest one's rate
    what = f"{slowest['name']} {slowest['rate'] * 8 / 1e9:g} Gbit/s" + (f" x {share}" if share > 1 else "")
    if collective == "sendrecv":
        return rail, "infiniband", f"{where}; sendrecv: one GPU's rail, {what}"
    if nodes < 2:
        return None, "infiniband", "no spec: an alltoall across one node"
    bound = rail * nodes / (nodes - 1) * (ranks - 1) / ranks
    return bound, "infiniband", f"{where}; alltoall: one GPU's rail ({what}) x N/(N-1) x (n-1)/n, N={nodes} nodes, n={ranks} ranks"


def _failed(path: str, method: str, error: str) -> Measurement:
    return Measurement.failed(path, "nccl_tests", method, "busbw", error)
