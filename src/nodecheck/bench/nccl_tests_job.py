"""Whose job a saved nccl-tests log is: one run of more than one rank (several runs pasted together, or runs of one
rank each, measured no job's links), on GPUs of the node it is judged against."""

from __future__ import annotations

import re

from nodecheck.bench.collective_rows import ROUNDING
from nodecheck.bench.nccl_tests import NcclLog, separate_runs
from nodecheck.core.units import first_of
from nodecheck.report.model import Report

_DEVICE_NAME = re.compile(r"\bdevice \S{1,20}: (.{1,200})$")  # a devices entry's GPU name, as _header_line wrote it
# CUDA's and NVML's name of a board are the driver's one string, spelled "Tesla V100-SXM2-32GB" or "A100-SXM4-40GB" by
# older drivers; an unreleased board is "NVIDIA Graphics Device" to both (CoreWeave's GB200 log): no name to compare
_VENDOR_WORDS = re.compile(r"^(?:nvidia\s+)?(?:tesla\s+)?", re.IGNORECASE)
# a MIG instance is "<board> MIG <profile>" ("NVIDIA A100-SXM4-40GB MIG 1g.5gb" beside "A100-SXM4-40GB" on one machine in
# HTCondor's condor_gpu_discovery manual); NVML names the board
_MIG_SUFFIX = re.compile(r"\s+MIG\s+\S+$", re.IGNORECASE)


def gpu_kinds(names) -> set[str]:
    """The GPU names a log's device lines or a node's GPUs give, compared as one spelling: lower case, without the
    vendor words older drivers put before them or a MIG instance's profile after; an unnamed board ("Graphics
    Device") is none."""
    kinds = {" ".join(_MIG_SUFFIX.sub("", _VENDOR_WORDS.sub("", name.strip())).lower().split())
             for name in names if isinstance(name, str)}
    return {k for k in kinds if k and k != "graphics device"}


def log_gpu_names(log: NcclLog) -> list[str]:
    return [m[1] for d in log.devices if (m := _DEVICE_NAME.search(d))]


def one_rank(log: NcclLog) -> str | None:
    """Why the log's run had a single rank, or None: every row's busbw 0.00 while its algbw is not. busbw is algbw x
    2(n-1)/n for all-reduce and (n-1)/n for all-gather, reduce-scatter and alltoall (nccl-tests doc/PERFORMANCE.md):
    0 only at n = 1, where nothing crosses a link; broadcast's, reduce's and sendrecv's factor is 1 and never 0."""
    timings = [r.out_of_place for r in log.rows if r.out_of_place and r.out_of_place.algbw_gbytes >= 1]
    if not timings or any(t.busbw_gbytes >= ROUNDING for t in timings):
        return None
    return (f"every row's busbw is 0.00 while its algbw reaches {max(t.algbw_gbytes for t in timings):.2f} GB/s: busbw is "
            "algbw x 2(n-1)/n for all-reduce ((n-1)/n for all-gather, reduce-scatter, alltoall), 0 only with one rank")


def other_gpus(log, report: Report, where: str) -> str | None:
    """Why a saved log is not from a node of this one's kind, or None: its device lines name GPUs, and none of them is
    one of the node's. Judged against another board's links, an A100 log reads as a broken NVLink on an H100 node."""
    theirs, ours = gpu_kinds(log_gpu_names(log)), gpu_kinds(g.name for g in report.gpus)
    if not theirs or not ours or theirs & ours:
        return None
    return (f"the log's GPUs are {_listed(log_gpu_names(log))}, {where}'s are {_listed(g.name for g in report.gpus if g.name)}: "
            "a log is judged against a node of its own kind (--from a snapshot of one, `nodecheck snapshot` on such a node)")


def _listed(names) -> str:
    return first_of(sorted(set(names)), 3)


def not_one_job(log) -> str | None:
    """Why the log's speed is no job's to judge, or None: several runs in one file, or a run of one rank."""
    if runs := separate_runs(log):
        return f"{runs}: their rows are no one job's and are not judged together. {SEPARATE_RUNS}"
    if single := one_rank(log):
        return (f"a run of one rank ({single}): it moved no data between GPUs and measured no link. To measure a node, "
                f"run it over the node's GPUs (`-g N`, or N processes of an MPI build). {SEPARATE_RUNS}")
    return None


# what a log of several runs, or of one rank each, usually comes from and what to do
SEPARATE_RUNS = ("Under mpirun or srun, an nccl-tests built without MPI=1 runs a whole test of its own in every process, "
                 "each its own rank 0 (sjeaugey in nccl-tests#182): rebuild it with `make MPI=1` to measure one job across "
                 "the processes; give nodecheck one run per file")
