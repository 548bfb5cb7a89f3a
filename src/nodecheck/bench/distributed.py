"""All-reduce across nodes: the same entry point on every node, launched by torchrun or srun.

The runner never imports torch: it starts one worker process (nodecheck.bench.worker) with the job's
torch.distributed environment and a hard time limit that kills the worker's process group, so a rank
that never joins or a hung collective becomes a failed measurement that names the path, never a hang.
The spec is the slowest NIC on the path: each node's traffic NIC at its expected speed from config,
else its negotiated speed.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from nodecheck.assemble.rails import fabric_nics, rail_rates, rank_nvlink, rank_rails
from nodecheck.bench.bounds import calibration, slowest_pair
from nodecheck.bench.common import ABOVE_RING_BOUND, NVLS_NOTE, local_rank, staged_if_shm
from nodecheck.bench.identity import rank_gpu
from nodecheck.bench.nccl_debug import attach, debug_env, read_debug_files, read_topology
from nodecheck.bench.results import run_worker
from nodecheck.core.errors import NodecheckError
from nodecheck.core.ifnames import gloo_selection, nccl_selection
from nodecheck.core.pairing import one_nvlink_domain
from nodecheck.core.units import to_int
from nodecheck.host.commands import run_until
from nodecheck.report.model import Measurement, Report, from_json

MiB = 1 << 20
# Payloads past saturation (seed 002: small messages are latency-bound). gloo on CPUs saturates a few
# Gbit/s with 32 MiB; NCCL over NVLink or 400G InfiniBand needs hundreds of MiB (nccl-tests captures).
LEVELS = {
    "gloo": {"quick": {"sizes": [32 * MiB], "warmup": 1, "iters": 3},
             "full": {"sizes": [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB], "warmup": 2, "iters": 5}},
    "nccl": {"quick": {"sizes": [1024 * MiB], "warmup": 2, "iters": 5},
             "full": {"sizes": [1 * MiB, 16 * MiB, 128 * MiB, 1024 * MiB, 4096 * MiB], "warmup": 3, "iters": 10}},
}
INIT_TIMEOUT = 120.0  # seconds for the ranks to meet in the store, apart from the collectives' --timeout
METHOD = "torch.distributed {backend} all_reduce of float32, slowest rank's time; busbw = algbw x 2(n-1)/n"


@dataclass
class DistEnv:
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    error: str | None = None  # the launch environment is wrong: the across-nodes test fails saying so

    @property
    def across_nodes(self) -> bool:
        """Only a world of more than one rank (or a broken launch) is a test across nodes; torchrun
        --nproc-per-node 1 or a one-task srun leaves the in-node tests as they are."""
        return self.error is not None or self.world_size > 1


def distributed_env(environ: dict[str, str]) -> DistEnv | None:
    """torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or srun's SLURM_PROCID/SLURM_NTASKS (+ MASTER_ADDR);
    None when not launched. An sbatch script's batch step (SLURM_PROCID=0 and the job's SLURM_NTASKS, but no
    step of srun's: no SLURM_STEP_ID) is one process, not rank 0 of a launch. Never raises: a wrong
    environment is carried in .error."""
    srun_step = "SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ
    rank = environ.get("RANK", environ.get("SLURM_PROCID") if srun_step else None)
    world = environ.get("WORLD_SIZE", environ.get("SLURM_NTASKS") if srun_step else None)
    if rank is None or world is None:
        return None
    rank_n, world_n = to_int(rank), to_int(world)
    if rank_n is None or world_n is None or not 0 <= rank_n < world_n:
        return DistEnv(0, 0, "", 0, f"rank {rank!r} of world size {world!r}: expected whole numbers with rank < world size")
    master = environ.get("MASTER_ADDR", "")
    port = environ.get("MASTER_PORT", "29500")
    error = None
    if world_n > 1 and not master:
        error = ("MASTER_ADDR is not set: export the address of rank 0's node (under srun: the first host of "
                 "SLURM_JOB_NODELIST; deploy/slurm/nodecheck-allreduce sets it)")
    elif not 0 < (to_int(port) or 0) < 65536:
        error = f"MASTER_PORT {port!r} is not a TCP port"
    return DistEnv(rank_n, world_n, master, to_int(port) or 0, error)


LOOPBACK = "lo"  # every Linux host has it; the Report leaves it out of its NICs


def traffic_nic(report: Report, env: DistEnv, environ: dict[str, str]):
    """The NIC the library's variable selects (GLOO_SOCKET_IFNAME: exact names; NCCL_SOCKET_IFNAME:
    NCCL's prefix, `^` and `=` syntax), the first of them in the node's order; without either, the
    NIC whose subnet holds MASTER_ADDR. None for loopback (what one-node multi-rank runs use: it has no
    rate to judge, and the Report lists only real NICs) or when nothing says."""
    names = [n.name for n in report.nics] + [LOOPBACK]
    for variable, select in (("GLOO_SOCKET_IFNAME", gloo_selection), ("NCCL_SOCKET_IFNAME", nccl_selection)):
        spec = environ.get(variable)
        if spec:
            chosen = select(spec, names)
            if not chosen:
                raise NodecheckError(f"NIC {spec!r} (from {variable}) matches no interface on this node "
                                     f"({', '.join(names)}): it does not exist here")
            return next((n for n in report.nics if n.name == chosen[0]), None)
    try:
        master = ipaddress.ip_address(env.master_addr)
    except ValueError:
        return None  # a host name: resolving it is the proximity check's job (issue 5)
    for nic in report.nics:
        for entry in nic.addresses:
            if master in ipaddress.ip_network(f"{entry['address']}/{entry['prefixlen']}", strict=False):
                return nic
    return None


def run_allreduce(report: Report, config, env: DistEnv, level: str, timeout: float, environ: dict[str, str],
                  node_results: list[dict] | None = None) -> Measurement:
    """node_results: this node's own measurements (the in-node tests), handed to every rank with the
    all-reduce's results so that rank 0's Report holds every node's."""
    path = f"allreduce:{env.world_size}-ranks"
    backend = "nccl" if report.gpus else "gloo"  # NCCL on GPU nodes (one GPU per rank: LOCAL_RANK)
    plan = LEVELS[backend][level]
    if env.error:
        return _failed(f"allreduce:{env.world_size or '?'}-ranks", backend, f"the launch environment is wrong: {env.error}")
    try:
        nic = traffic_nic(report, env, environ)
    except NodecheckError as error:
        return _failed(path, backend, str(error))
    nic_path = report.path_spec(f"nic:{nic.name}") if nic else None
    kind, fabric_basis = (nic_path.kind if nic_path else None), None
    local = local_rank(environ)
    gpu, ordinal, gpu_how = rank_gpu(report.gpus, environ, local) if backend == "nccl" else (None, None, "")
    fabric = fabric_nics(report, environ) if backend == "nccl" else []
    rails = rail_rates(report, [nic], config) if nic else []
    if fabric:  # NCCL's data goes over the RDMA rails; the socket NIC only carries bootstrap
        rails = rail_rates(report, rank_rails(report, gpu, fabric), config)
        kind = "infiniband"
        fabric_basis = (f"ring bound: per node, the distinct rails nearest the GPUs its ranks use (local rank {local}: "
                        f"{'gpu' + str(gpu.index) if gpu else 'GPU unknown'} -> {','.join(r['name'] for r in rails)}), "
                        "summed; the slowest node's")
    unknown = [r["name"] for r in rails if not r["rate"]]
    if unknown:  # no spec for the job: a bound without this rail would judge against too little
        rails, fabric_basis = [], f"no spec: the rate of {unknown[0]} is unknown (set [nics.{unknown[0]}] speed_mbps)"
    nvlink = rank_nvlink(report, gpu, environ) if backend == "nccl" else None
    if nvlink:  # GB200 NVL72: NCCL takes NVLink to the GPUs of its domain (the worker bounds the job: pairing.job_bound)
        kind = "nvlink"
    address = next((a["address"] for a in (nic.addresses if nic else []) if a["family"] == "inet"), None)
    child_env = dict(environ, MASTER_ADDR=env.master_addr, MASTER_PORT=str(env.master_port),
                     RANK=str(env.rank), WORLD_SIZE=str(env.world_size),
                     LOCAL_RANK=environ.get("LOCAL_RANK", environ.get("SLURM_LOCALID", "0")))
    if nic is not None:  # else gloo may advertise 127.0.0.1, and NCCL bootstrap a wrong interface
        child_env.setdefault("GLOO_SOCKET_IFNAME", nic.name)
        child_env.setdefault("NCCL_SOCKET_IFNAME", nic.name)
    with tempfile.TemporaryDirectory(prefix="nodecheck-bench-") as tmp:
        if backend == "nccl":  # what NCCL chose (network, HCAs, GPUDirect RDMA), in files read below
            child_env = debug_env(child_env, tmp)
        out = Path(tmp) / "allreduce.json"
        mine = Path(tmp) / "node-results.json"
        mine.write_text(json.dumps(node_results or []))
        argv = [sys.executable, "-m", "nodecheck.bench.worker", "--backend", backend,
                "--sizes", ",".join(str(s) for s in plan["sizes"]), "--warmup", str(plan["warmup"]),
                "--iters", str(plan["iters"]), "--timeout", str(timeout), "--out", str(out),
                "--threshold", str(config.ratio_for("allreduce", kind, "busbw") if config else 0.8),  # the verdict's own
                "--node", report.node.get("hostname") or "?", "--nic", nic.name if nic else "",
                "--address", address or "", "--rails", json.dumps(rails), "--node-results", str(mine),
                "--init-timeout", str(min(timeout, INIT_TIMEOUT))]
        if nvlink:
            argv += ["--nvlink", json.dumps({"domain": nvlink["domain"], "rate": nvlink["rate"]})]
        if gpu is not None and gpu.uuid:
            argv += ["--gpu-uuid", gpu.uuid]
        if ordinal is not None:
            argv += ["--gpu-ordinal", str(ordinal)]
        try:
            result = run_worker(argv, out, timeout + 15, env=child_env)  # the worker's own timeout goes first
        except NodecheckError as error:
            return attach(_failed(path, backend, f"all-reduce over {env.world_size} ranks via {env.master_addr}:{env.master_port} "
                                                 f"failed: {error}"), read_debug_files(tmp), read_topology(tmp))
        nccl = read_debug_files(tmp) if backend == "nccl" else None
        topology = read_topology(tmp) if backend == "nccl" else None
    one_node = _on_one_node(result, report)
    if one_node:  # the traffic never left the node: the NICs bound nothing, the node's own paths do
        result = dict(result, spec_bytes_per_second=one_node[0])
        kind, fabric = one_node[1], []
        if backend == "nccl":  # one GPU a rank: the in-node all-reduce's path, judged and joined to signals as that
            path = f"allreduce:node-{env.world_size}-gpus"
    measurement = attach(measurement_from_worker(path, result), nccl, topology)
    measurement.details["path_kind"] = kind
    if backend == "nccl":
        measurement.details["gpu"] = {"index": gpu.index if gpu else None, "ordinal": ordinal, "how": gpu_how}
    if one_node:  # over SHM between GPUs that NVLink links, a staged path, as in the node's own all-reduce
        measurement.details["note"] = one_node[2]
        measurement = staged_if_shm(measurement)
    if nvlink and not one_node:
        measurement.details["fabric"] = measurement.details["note"] = _nvlink_domain_basis(result, nvlink)
    elif fabric:
        measurement.details["fabric"] = fabric_basis
        if measurement.ratio and measurement.ratio > 1:
            measurement.details["note"] = ABOVE_RING_BOUND
    return measurement


def _nvlink_domain_basis(result: dict, nvlink: dict) -> str:
    """What bounds a job of a rank in a multi-node NVLink domain, said: the NVLink rate where every rank shares
    the domain, else why nothing does."""
    domain = one_nvlink_domain(result.get("nodes") or [])
    if domain is None:
        return ("no spec: the job's ranks sit in several multi-node NVLink domains, or partly outside one (this "
                f"rank's: {nvlink['domain']}): it takes NVLink inside each and the network between them, and neither "
                "bounds it alone")
    if not result.get("spec_bytes_per_second"):
        return (f"no spec: every rank's GPU is in one multi-node NVLink domain ({domain}), and a rank's NVLink rate is "
                f"unknown (this rank's: {nvlink['basis']})")
    return (f"NVLink bound: every rank's GPU is in one multi-node NVLink domain ({domain}), where NCCL carries the "
            f"job over NVLink, not the rails: the slowest GPU's NVLink rate (this rank's: {nvlink['basis']})")


def _on_one_node(result: dict, report: Report) -> tuple[float | None, str | None, str] | None:
    """(spec, path kind, note) when every rank of the job ran on one node (torchrun --nnodes 1 --nproc-per-node 8),
    else None. Such a job's all-reduce never touches a NIC: judged against the NIC it read as the NIC's multiple
    ("above the ring bound"), and a slow NVLink passed. Its bound is the in-node all-reduce's, the node's slowest
    GPU pair; none for gloo (host memory has no spec here)."""
    from nodecheck.core.pairing import node_key

    nodes = result.get("nodes") or []
    boots = {n.get("boot_id") for n in nodes}
    if len(nodes) < 2 or len({node_key(n) for n in nodes}) != 1 or len(boots) != 1 or None in boots:
        return None  # a rank elsewhere, or nothing to confirm one machine (one host name can name two containers)
    if result.get("backend") != "nccl":
        return None, None, f"{ONE_NODE}: no spec (gloo moves host memory)"
    pair = slowest_pair(report)
    if pair is None:
        return None, None, f"{ONE_NODE}: no spec (the node's GPU pairs have none)"
    return pair.bytes_per_second, pair.kind, f"{ONE_NODE}: judged against its slowest GPU pair ({pair.path})"


ONE_NODE = "every rank ran on this node, so the traffic never left it"


WORLD_OF_ONE = ("a world of one rank moves no data (on an H100, NCCL took ~40 us per call for 1 MiB and for 4 GiB "
                "alike): the collective completing is the result; no bandwidth is reported and no spec compared")


def other_nodes_results(allreduce: Measurement, own_rank: int) -> list[Measurement]:
    """The in-node measurements the other nodes handed over with the all-reduce, each path prefixed
    with its node's name ("node2/gpu0:host")."""
    out = []
    for node in allreduce.details.get("node_results", []):
        if node.get("rank") == own_rank:
            continue
        for raw in node.get("results", []):
            try:
                m = from_json(Measurement, raw)
            except ValueError:
                continue  # not a measurement as this version reads one: not this Report's to interpret
            m.path = f"{node.get('node') or 'rank' + str(node.get('rank'))}/{m.path}"
            m.details = dict(m.details or {}, node=node.get("node"), rank=node.get("rank"))
            out.append(m)
    return out


def measurement_from_worker(path: str, result: dict) -> Measurement:
    rows = result["rows"]
    largest = max(rows, key=lambda r: r["size_bytes"])
    nodes = [{k: v for k, v in n.items() if k != "results"} for n in result["nodes"]]
    node_results = [{"rank": n.get("rank"), "node": n.get("node"), "results": n.get("results", [])} for n in result["nodes"]]
    details = {"rows": rows, "nodes": nodes, "pair_exchanges": result.get("pair_exchanges", []),
               "node_results": node_results}
    if isinstance(result.get("data_check"), dict):
        details["data_check"] = result["data_check"]
    method = METHOD.format(backend=result.get("backend", "gloo"))
    if result.get("world_size") == 1:  # a figure here would be a no-op's: 1.5 Pbit/s at 4 GiB on an H100
        details.update(note=WORLD_OF_ONE, seconds_per_call=largest["seconds"])
        return Measurement(path, "allreduce", True, None, None, None, largest["size_bytes"], method, "none", details)
    return Measurement.measured(path, "allreduce", largest["busbw"], result.get("spec_bytes_per_second"), largest["size_bytes"],
                                method, "busbw", details)


def _failed(path: str, backend: str, error: str) -> Measurement:
    return Measurement.failed(path, "allreduce", METHOD.format(backend=backend), "busbw", error)


NCCL_METHOD = "torch.distributed nccl all_reduce of float32, one process per GPU; busbw = algbw x 2(n-1)/n"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def in_node_env(environ: dict[str, str], rank: int, world: int, port: int) -> dict[str, str]:
    """A rank of nodecheck's own in-node group. Under torchrun the job's TORCHELASTIC_* variables must go:
    with TORCHELASTIC_USE_AGENT_STORE the worker would wait for torchrun's store on our private port and
    hang until its time-out (seen on an H100 node under `torchrun --nproc-per-node 1`)."""
    env = {k: v for k, v in environ.items() if not k.startswith("TORCHELASTIC_")}
    return dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def node_allreduce(report: Report, level: str, timeout: float, environ: dict[str, str]) -> Measurement:
    world = len(report.gpus)
    path = f"allreduce:node-{world}-gpus"
    pair = slowest_pair(report)
    spec = pair.bytes_per_second if pair else None
    plan = LEVELS["nccl"][level]
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="nodecheck-nccl-") as tmp:
        def rank(r: int) -> dict:
            env = debug_env(in_node_env(environ, r, world, port), tmp)
            argv = [sys.executable, "-m", "nodecheck.bench.worker", "--backend", "nccl", "--sizes", ",".join(map(str, plan["sizes"])),
                    "--warmup", str(plan["warmup"]), "--iters", str(plan["iters"]), "--timeout", str(timeout),
                    "--spec", str(spec or 0), "--node", report.node.get("hostname") or "?", "--out", f"{tmp}/rank{r}.json"]
            if report.gpus[r].uuid:  # rank r measures NVML's GPU r, whatever order CUDA lists them in (one rule: identity)
                argv += ["--gpu-uuid", report.gpus[r].uuid]
            return run_worker(argv, Path(f"{tmp}/rank{r}.json"), timeout + 15, env=env, what=f"NCCL rank {r}")

        done = run_until({str(r): (lambda r=r: rank(r)) for r in range(world)}, time.monotonic() + timeout + 30, workers=world)
        nccl, topology = read_debug_files(tmp), read_topology(tmp)
    errors = [f"rank {r}: {done[str(r)]}" for r in range(world) if isinstance(done.get(str(r)), BaseException)]
    result = done.get("0") if isinstance(done.get("0"), dict) else None
    if errors or result is None:
        return attach(Measurement.failed(path, "allreduce", NCCL_METHOD, "busbw",
                                         f"NCCL all-reduce over {world} GPUs failed: " + ("; ".join(errors) or "no result")), nccl, topology)
    measurement = measurement_from_worker(path, result)
    measurement.method = NCCL_METHOD
    measurement.details["path_kind"] = pair.kind if pair else None
    if variant := calibration(report, world, pair.kind if pair else None):
        measurement.details["calibration"] = variant
    if measurement.ratio and measurement.ratio > 1:
        measurement.details["note"] = NVLS_NOTE
    return staged_if_shm(attach(measurement, nccl, topology))
