"""Which bandwidth tests apply to this node, and running them into Report measurements."""

from __future__ import annotations

import sys
from importlib.util import find_spec
from pathlib import Path

from nodecheck.bench.common import local_rank
from nodecheck.core import typed_json
from nodecheck.core.errors import NodecheckError, TimedOut, install_extra
from nodecheck.host.commands import run_command
from nodecheck.report.model import Measurement, Report, from_json, measured_on


def applicable(report: Report, across_nodes: bool, nccl_tests_installed: bool = False) -> list[str]:
    tests = ["h2d", "d2h", "hbm", "gemm"] if report.gpus else []
    if len(report.gpus) >= 2:
        tests.append("p2p")
    if across_nodes or len(report.gpus) >= 2:  # one GPU alone moves no data: `--tests allreduce` still checks NCCL
        tests.append("allreduce")
    if nccl_tests_installed and len(report.gpus) >= 2:
        tests.append("nccl_tests")
    return tests


def run(report: Report, config, tests: list[str], level: str, timeout: float, environ: dict[str, str], env) -> list[Measurement]:
    """Run `tests`; each failure becomes a failed Measurement that says why, never an exception.
    `allreduce` runs across the nodes of the job when launched by torchrun/srun (env), else in the node."""
    from nodecheck.bench import distributed, gpu, gpu_itself, nccl_binary

    out: list[Measurement] = []
    across = env is not None and env.across_nodes
    # all_reduce_perf -g N drives every GPU of the node itself: once per node (local rank 0), after the other
    # in-node tests, never 8 copies at once on the same GPUs
    nccl_tests = "nccl_tests" in tests and not (across and local_rank(environ) != 0)
    nccl_tests = nccl_tests and not any(g.mig_enabled for g in report.gpus)  # -g N drives CUDA devices 0..N-1: not MIG's
    tests = [t for t in tests if t != "nccl_tests"]
    if not tests:  # a binary of its own: needs no torch
        return [nccl_binary.run_nccl_tests(report, config, level, timeout, environ)] if nccl_tests else []
    if find_spec("torch") is None:  # a GPU test on a node without a GPU says so first: torch would not help
        no_gpu = f"no GPU to test: {report.gpus_absent_reason or 'no NVIDIA GPU found'}" if not report.gpus else None
        out = [_failed("gpus", t, no_gpu) if no_gpu and t in GPU_ONLY else
               _failed("bench", t, f"torch is not installed: {install_extra('bench')}") for t in tests]
        return out + ([nccl_binary.run_nccl_tests(report, config, level, timeout, environ)] if nccl_tests else [])
    wanted = set(tests)
    in_node = wanted & {"h2d", "d2h", "p2p", "hbm", "gemm"} | ({"allreduce"} if "allreduce" in wanted and not across else set())
    if across and local_rank(environ) != 0:
        in_node = set()  # N ranks on a node: the first one measures the node, every rank joins the all-reduce
    report, in_node = without_mig_gpus(report, in_node)
    if in_node and not report.gpus:
        reason = report.gpus_absent_reason or "no NVIDIA GPU found"
        out += [_failed("gpus", t, f"no GPU to test: {reason}") for t in sorted(in_node)]
    else:
        if in_node & {"hbm", "gemm"}:  # first, every GPU at once: before the copies over links warm them
            out += gpu_itself.gpu_tests(report, in_node, level, timeout)
        if in_node & {"h2d", "d2h"}:  # local rank 0 only: N ranks copying at once would share each link
            out += gpu.copy_tests(report, config, in_node, level, timeout)
        for test in sorted(in_node & {"p2p", "allreduce"}):
            if test == "p2p" and len(report.gpus) < 2:
                out.append(_failed("gpus", test, f"p2p needs at least two GPUs (found {len(report.gpus)})"))
            elif test == "p2p":
                out += gpu.p2p_tests(report, level, timeout)
            else:  # one GPU: a world of one rank, NCCL completing or not, no figure (NCCL refuses two ranks on one GPU)
                out.append(distributed.node_allreduce(report, level, timeout, environ))
    if nccl_tests:
        out.append(nccl_binary.run_nccl_tests(report, config, level, timeout, environ))
    if across and "allreduce" in wanted:
        from dataclasses import asdict

        allreduce = distributed.run_allreduce(report, config, env, level, timeout, environ,
                                              node_results=[asdict(m) for m in out])
        out.append(allreduce)
        if env.rank == 0:  # the job's Report: every other node's own measurements too, named by node
            out += distributed.other_nodes_results(allreduce, env.rank)
        allreduce.details.pop("node_results", None)  # carried once, as measurements
    return out


def without_mig_gpus(report: Report, tests: set[str]) -> tuple[Report, set[str]]:
    """The node as its in-node tests see it: a GPU in MIG mode has no NVLink and no peer-to-peer, and a MIG slice
    owns a share of the copy engines, so no in-node test can be judged against its paths. Those GPUs are left out
    (their gpu_mig_mode finding says so), and a test left with too few GPUs is not run rather than failed; run()
    skips nccl-tests' all_reduce_perf on such a node."""
    if not any(g.mig_enabled for g in report.gpus):
        return report, tests
    from dataclasses import replace

    testable = [g for g in report.gpus if not g.mig_enabled]
    kept = {t for t in tests if (t in ("h2d", "d2h", "hbm", "gemm") and testable) or (t in ("p2p", "allreduce") and len(testable) >= 2)}
    return replace(report, gpus=testable), kept


def _failed(path: str, test: str, error: str) -> Measurement:
    return Measurement.failed(path, test, "-", "-", error)


GPU_ONLY = ("h2d", "d2h", "p2p", "hbm", "gemm")  # tests with nothing to measure without a GPU (allreduce runs on CPUs with gloo)
CLOCK_SKEW_S = 300  # a bench on this node wrote the file: its clock is this one's, give or take NTP


def read_measurements_file(path, this_host: str | None = None) -> tuple[list[Measurement], float | None]:
    """The measurements of a file `bench --json` (a Report) or `bench --measure-only` wrote, and when they were
    taken: what `serve --measurements FILE` publishes: this node's own (a job's Report also holds its other nodes'
    in-node figures, which are theirs). NodecheckError naming the file when it is neither, or when the Report
    names a node other than `this_host` (a path shared by every node: another node's figures)."""
    import time

    from nodecheck.core.limits import MAX_JSON_DOCUMENT
    from nodecheck.host.files import read_user_file, untrusted_why

    if why := untrusted_why(Path(path)):  # its figures become findings, conditions and taints: root's alone
        raise NodecheckError(f"{path}: not trusted: {why} (make it root's alone: chown root: and chmod go-w)")
    try:
        document = typed_json.loads(read_user_file(path, MAX_JSON_DOCUMENT, "measurements"))
        measurements = [from_json(Measurement, m) for m in document["measurements"]]
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise NodecheckError(f"{path}: not the output of `nodecheck bench --json` ({str(error)[:200]})") from None
    node = document.get("node")
    written_on = node.get("hostname") if isinstance(node, dict) else None
    if this_host and isinstance(written_on, str) and written_on and written_on != this_host:
        raise NodecheckError(f"{path}: written by `nodecheck bench` on {written_on[:100]!r}, not on this node ({this_host!r}): "
                             "another node's figures are not this node's (is the path shared?)")
    when = document.get("measured_at")
    when = float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else None
    if when is not None and when > time.time() + CLOCK_SKEW_S:  # 1e12 silenced the stale-bandwidth alert for good
        raise NodecheckError(f"{path}: measured_at {when:.0f} lies in the future: not read")
    # a job's other nodes' figures are theirs to publish; so is a job's slow all-reduce its exchanges blamed on them
    measurements = [m for m in measurements if measured_on(m.path) is None and not blames_other_nodes(m, written_on)]
    for m in measurements:  # where a figure came from, in the Report and its findings' details
        m.details["source"] = f"file {str(path)[:200]}"
    return measurements, when


def blames_other_nodes(m: Measurement, host: str | None) -> bool:
    """Whether a job's all-reduce across nodes was slow and its pair exchanges named slow nodes (verdicts.slow_nodes,
    at the threshold it was judged by), `host` not among them: the job's verdict (rank 0's Report names them), not
    the node's whose Report it is. Published there, its alert, condition and taint would fall on a node the
    exchanges cleared."""
    from nodecheck.verdicts.bandwidth import slow_nodes

    threshold = (m.details or {}).get("threshold") if isinstance(m.details, dict) else None
    if not host or m.scope != "cluster" or m.ratio is None or not isinstance(threshold, (int, float)) or m.ratio >= threshold:
        return False
    named = slow_nodes(m, threshold)
    return bool(named) and not any(name.startswith(f"{host} (") for name, _, _ in named)


def run_in_subprocess(argv_tail: list[str], timeout: float, env: dict[str, str] | None = None) -> list[Measurement]:
    """`nodecheck bench --measure-only ARGV_TAIL` in a subprocess killed at `timeout` (the daemon and the
    prolog never import torch): the measurements alone, for the caller to judge (verdicts.with_measurements);
    any failure becomes a failed Measurement that says why."""
    argv = [sys.executable, "-m", "nodecheck", "bench", "--measure-only", *argv_tail]
    try:
        out = run_command(argv, timeout, env=env, what="nodecheck bench")
        document = typed_json.loads(out)
        if not isinstance(document, dict) or not isinstance(document.get("measurements"), list):
            raise ValueError("nodecheck bench --measure-only printed no measurements")
        return [from_json(Measurement, m) for m in document["measurements"]]
    except TimedOut as error:  # the caller's budget ran out: said so, for it to decide what that means
        failed = Measurement.failed("bench", "bench", "nodecheck bench", "-", str(error))
        failed.details["timed_out"] = True
        return [failed]
    except (NodecheckError, ValueError, KeyError, TypeError) as error:
        return [Measurement.failed("bench", "bench", "nodecheck bench", "-", str(error))]
