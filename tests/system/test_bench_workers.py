"""Bench workers report their own exception (type and message), not the last line of stderr; ranks
on one node share the in-node tests; only rank 0 prints the job's Report."""

import json
import os
import subprocess
import sys

import pytest
from helpers import nodecheck

from nodecheck.bench.plan import local_rank
from nodecheck.bench.results import guarded, own_error, run_worker
from nodecheck.core.errors import NodecheckError

torch = pytest.importorskip("torch", reason="needs torch (sh deploy/install.sh bench)")


def test_guarded_writes_the_exception_not_a_traceback_line(tmp_path):
    out = tmp_path / "out.json"
    assert guarded(str(out), lambda: {"rows": [1]}) == 0 and json.loads(out.read_text()) == {"rows": [1]}

    def fails():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    assert guarded(str(out), fails) == 1
    assert own_error(out) == "RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU node the NCCL worker would run")
def test_an_nccl_worker_without_cuda_names_torchs_error(tmp_path):
    out = tmp_path / "rank0.json"
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0", LOCAL_RANK="0")
    with pytest.raises(NodecheckError) as error:
        run_worker([sys.executable, "-m", "nodecheck.bench.worker", "--backend", "nccl", "--sizes", "1024",
                    "--out", str(out)], out, 120, env=env)
    message = str(error.value)
    assert message.split(":")[0] in ("AttributeError", "AssertionError", "RuntimeError", "AcceleratorError"), message
    assert "exited with" not in message  # the worker's own exception, not run_command's summary


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU node CUDA is there")
def test_the_gpu_worker_names_missing_cuda(tmp_path):
    out = tmp_path / "copy.json"
    with pytest.raises(NodecheckError, match=r"^RuntimeError: CUDA is not available to torch"):
        run_worker([sys.executable, "-m", "nodecheck.bench.gpu_worker", "copy", "--device", "0", "--cpus", "",
                    "--sizes", "1024", "--out", str(out)], out, 120)


def test_a_gpu_worker_whose_gpus_are_hidden_says_by_what(tmp_path):
    """NVML names the node's GPUs, CUDA sees none: the worker's error names CUDA_VISIBLE_DEVICES (on a GPU node too)."""
    out = tmp_path / "copy.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    with pytest.raises(NodecheckError, match=r"CUDA_VISIBLE_DEVICES='' hides every GPU from this process"):
        run_worker([sys.executable, "-m", "nodecheck.bench.gpu_worker", "copy", "--device", "0", "--cpus", "",
                    "--sizes", "1024", "--out", str(out)], out, 120, env=env)


def test_what_hides_gpus_from_cuda_is_said_only_when_set():
    from nodecheck.bench.gpu_worker import hidden_by_environment

    assert hidden_by_environment({}) == ""
    assert "hides every GPU" in hidden_by_environment({"CUDA_VISIBLE_DEVICES": "-1"})
    assert hidden_by_environment({"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == (
        " (CUDA_VISIBLE_DEVICES='GPU-abc': check that it names this node's GPUs)")


def test_pinned_blocks_are_counted_where_torch_counts_them():
    from nodecheck.bench.gpu_worker import pinned_blocks_created

    counting = type("T", (), {"cuda": type("C", (), {"host_memory_stats": staticmethod(lambda: {"num_host_alloc": 4})})})()
    older = type("T", (), {"cuda": object()})()
    assert pinned_blocks_created(counting) == 4 and pinned_blocks_created(older) is None
    assert callable(torch.cuda.host_memory_stats)  # the call the worker reaches for exists in this torch


def test_the_lifeline_runs_a_program_and_passes_its_status_on():
    """python -m nodecheck.bench.lifeline PROGRAM: what all_reduce_perf runs under; its output and exit status pass
    through, a signal as 128 + N, a missing program as 127 with the reason."""
    def lifeline(*argv):
        return subprocess.run([sys.executable, "-m", "nodecheck.bench.lifeline", *argv], capture_output=True, text=True, timeout=60)

    ran = lifeline("sh", "-c", "echo 'out of place busbw'; exit 3")
    assert (ran.returncode, ran.stdout) == (3, "out of place busbw\n")
    assert lifeline("sh", "-c", "kill -9 $$").returncode == 137
    missing = lifeline("/nonexistent/all_reduce_perf")
    assert missing.returncode == 127 and "/nonexistent/all_reduce_perf: No such file or directory" in missing.stderr
    assert lifeline().returncode == 2


def test_a_rank_that_never_joins_is_the_workers_own_error(tmp_path):
    """gloo, world of 2, rank 1 never starts: the store times out and the worker says so by name."""
    from helpers import free_port

    out = tmp_path / "rank0.json"
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with pytest.raises(NodecheckError) as error:
        run_worker([sys.executable, "-m", "nodecheck.bench.worker", "--backend", "gloo", "--sizes", "1024", "--timeout", "3",
                    "--out", str(out)], out, 120, env=env)
    assert "exited with" not in str(error.value) and ":" in str(error.value), str(error.value)


def test_an_in_node_rank_under_torchrun_does_not_wait_for_torchruns_store(tmp_path):
    """Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) a worker of nodecheck's own in-node group, on a
    port of its own, waited for torchrun's store until its time-out: `torchrun --nproc-per-node 1
    nodecheck bench --tests allreduce` hung 120 s on an H100 node. gloo shows it on any machine."""
    from helpers import free_port

    from nodecheck.bench.distributed import in_node_env, measurement_from_worker

    out = tmp_path / "rank0.json"
    job = dict(os.environ, TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="none", RANK="0", WORLD_SIZE="1")
    env = in_node_env(job, 0, 1, free_port())
    result = run_worker([sys.executable, "-m", "nodecheck.bench.worker", "--backend", "gloo", "--sizes", "1048576",
                         "--timeout", "20", "--out", str(out)], out, 120, env=env)
    m = measurement_from_worker("allreduce:node-1-gpus", result)
    assert m.ok and m.direction == "none" and m.bytes_per_second is None and m.details["seconds_per_call"] > 0


def test_torchs_hints_are_not_the_error():
    """What torch raised on an H100 node for a rank past the GPUs: the drain reason keeps the error."""
    from nodecheck.bench.results import essential

    raised = ("CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough GPUs?\n"
              "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
              "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
              "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
    assert essential(raised) == "CUDA error: invalid device ordinal; GPU device may be out of range, do you have enough GPUs?"
    # two ranks on one GPU, as torch 2.11 raised it there: NCCL's own words first
    duplicate = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with "
                 "NCCL_DEBUG=WARN for details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects invalid usage "
                 "of NCCL library.\nLast error:\nDuplicate GPU detected : rank 0 and rank 1 both on CUDA device 60")
    assert essential(duplicate) == ("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60 "
                                    "(ncclInvalidUsage, NCCL 2.28.9)")


def test_a_rank_past_the_nodes_gpus_is_named():
    from nodecheck.bench.worker import own_gpu

    assert own_gpu(0, 1) == 0 and own_gpu(7, 8) == 7
    assert own_gpu(5, 1) == 0  # srun --gpus-per-task=1: local rank 5 sees its one GPU as ordinal 0 (issue 20, 7)
    with pytest.raises(RuntimeError, match=r"local rank 5 has no GPU of its own: this process sees 4 CUDA device"):
        own_gpu(5, 4)


def test_a_ranks_gpu_is_the_one_it_sees_by_uuid():
    """Issue 20 (7): under srun --gpus-per-task=1 each task sees one GPU, named by UUID or index in
    CUDA_VISIBLE_DEVICES: local ranks 1-7 have a GPU (before: "no GPU of its own"), the right one."""
    from nodecheck.bench.identity import rank_gpu
    from nodecheck.report.model import Gpu

    gpus = [Gpu(index=i, uuid=f"GPU-{i}c1752cd-3f0e-9a4b-2b7c-{i}8e5b1d2f6a0") for i in range(8)]
    third = gpus[3].uuid
    gpu, ordinal, how = rank_gpu(gpus, {"CUDA_VISIBLE_DEVICES": third}, 3)
    assert (gpu.index, ordinal) == (3, 0) and "by UUID" in how
    gpu, ordinal, _ = rank_gpu(gpus, {"CUDA_VISIBLE_DEVICES": third[:12]}, 3)  # CUDA takes a UUID's prefix
    assert (gpu.index, ordinal) == (3, 0)
    gpu, ordinal, _ = rank_gpu(gpus, {"CUDA_VISIBLE_DEVICES": "6"}, 6)
    assert (gpu.index, ordinal) == (6, 0)
    gpu, ordinal, _ = rank_gpu(gpus, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 1)
    assert (gpu.index, ordinal) == (5, 1)
    gpu, ordinal, _ = rank_gpu(gpus, {}, 7)
    assert (gpu.index, ordinal) == (7, 7)
    gpu, ordinal, how = rank_gpu(gpus, {"CUDA_VISIBLE_DEVICES": "0,1"}, 5)
    assert gpu is None and ordinal is None and "local rank 5 has no GPU of its own: it sees 2" in how
    gpu, ordinal, how = rank_gpu(gpus, {"CUDA_VISIBLE_DEVICES": "MIG-4f1e3a2b-0000-0000-0000-000000000000"}, 0)
    assert gpu is None and ordinal == 0 and "MIG" in how


def test_a_rank_that_fails_its_own_checks_is_named_by_rank_0(tmp_path):
    """Issue 20 (7): every rank puts "ready" or its own error in the store before the first collective, and
    rank 0 names the failing rank at once (before: each rank timed out on its own, rank 0 saying only
    that). On a CPU machine the one real pre-flight failure is a rank without CUDA: rank 1 asks for NCCL."""
    import subprocess

    from helpers import free_port

    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    outs = [tmp_path / "rank0.json", tmp_path / "rank1.json"]

    def argv(backend: str, out) -> list[str]:
        return [sys.executable, "-m", "nodecheck.bench.worker", "--backend", backend, "--sizes", "1024", "--timeout", "100",
                "--init-timeout", "100", "--node", f"host-{backend}", "--out", str(out)]

    other = subprocess.Popen(argv("nccl", outs[1]), env=dict(env, RANK="1", LOCAL_RANK="0", CUDA_VISIBLE_DEVICES=""),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(NodecheckError) as error:
            run_worker(argv("gloo", outs[0]), outs[0], 200, env=dict(env, RANK="0"))
    finally:
        other.wait(timeout=200)
    message = str(error.value)
    assert "rank 1 (host-nccl): CUDA is not available to torch" in message, message
    assert "never reported ready" not in message


def test_a_rank_that_never_comes_is_named_after_the_ready_wait(tmp_path):
    from helpers import free_port

    out = tmp_path / "rank0.json"
    env = dict(os.environ, RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with pytest.raises(NodecheckError) as error:
        run_worker([sys.executable, "-m", "nodecheck.bench.worker", "--backend", "gloo", "--sizes", "1024", "--timeout", "600",
                    "--init-timeout", "2", "--out", str(out)], out, 120, env=env)
    assert "ranks 1, 2 of 3 never reported ready within 2 s" in str(error.value), str(error.value)


def test_local_rank_from_torchrun_or_srun():
    assert local_rank({"LOCAL_RANK": "3"}) == 3 and local_rank({"SLURM_LOCALID": "1"}) == 1 and local_rank({}) == 0


@pytest.mark.parametrize("as_json", [True, False])
def test_only_rank_0_prints_the_jobs_report(as_json):
    """Rank 1 of a broken 2-rank launch: it measures (here: fails the all-reduce), prints no second Report
    (JSON or table) into the job's standard output, and exits 0 (issue 20, item 8: a rank exiting 1 made
    torchrun kill rank 0 before it printed the job's Report); one line on stderr says where the verdict is."""
    run = nodecheck("bench", "--tests", "allreduce", *(["--json"] if as_json else []),
                    env={"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": ""})
    assert run.returncode == 0 and run.stdout == "", run.stdout[:300]
    assert "rank 1 of 2: the job's Report is rank 0's" in run.stderr


# What a rank printed when PyTorch's watchdog ended a hung collective (published in a DeepSpeed issue thread,
# PyTorch 2.5): the cause, then the abort's C++ stack, whose last line used to be the Report's error.
WATCHDOG_STDERR = """\
[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=268435456, NumelOut=268435456, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.
[rank0]:[E1218 20:27:21.484903450 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 0]  failure detected by watchdog at work sequence id: 1 PG status: last enqueued work: 1, last completed work: 0
terminate called after throwing an instance of 'c10::DistBackendError'
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f1c6f96c446 in /usr/lib/python3/dist-packages/torch/lib/libc10.so)
frame #5: <unknown function> + 0x94ac3 (0x7f1cb2094ac3 in /lib/x86_64-linux-gnu/libc.so.6)
frame #6: clone + 0x44 (0x7f1cb2125a04 in /lib/x86_64-linux-gnu/libc.so.6)
"""


def test_a_collective_the_watchdog_aborted_is_named_by_its_watchdog_line(tmp_path):
    """Issue 20 (11): a hung NCCL collective ends in PyTorch's watchdog and SIGABRT; the worker writes no
    result, and the error was stderr's last line, "frame #6: clone + 0x44". A stand-in worker replays the
    published stderr and aborts (no NCCL here to hang)."""
    out = tmp_path / "rank0.json"
    script = tmp_path / "worker.py"
    script.write_text(f"import os, sys\nsys.stderr.write({WATCHDOG_STDERR!r})\nsys.stderr.flush()\nos.abort()\n")
    with pytest.raises(NodecheckError) as error:
        run_worker([sys.executable, str(script)], out, 60)
    message = str(error.value)
    assert "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE" in message, message
    assert "clone" not in message and "the collective hung" in message


def test_a_worker_killed_after_the_watchdog_spoke_keeps_the_watchdogs_line(tmp_path):
    """Measured on the lent H100 (benchmarks/stopped_peer.py, 2026-11-28): with a peer stopped, PyTorch's watchdog
    says its line at the process group's timeout (20 s, 30 s), but the rank ends (SIGABRT) only 65 s later, so
    nodecheck's runner (the worker's --timeout + 15 s) always killed it first, and the line was lost. A stand-in
    says the published line and hangs; the runner's limit ends it."""
    out = tmp_path / "rank0.json"
    script = tmp_path / "worker.py"
    script.write_text(f"import sys, time\nsys.stderr.write({WATCHDOG_STDERR.splitlines()[0] + chr(10)!r})\n"
                      "sys.stderr.flush()\ntime.sleep(300)\n")
    with pytest.raises(NodecheckError) as error:
        run_worker([sys.executable, str(script)], out, 10)  # time enough to start and speak on a loaded machine
    message = str(error.value)
    assert message.startswith("the worker did not finish within 10 s and was killed; it had said: [Rank 0] Watchdog caught"), message
    assert "Timeout(ms)=600000" in message and "the collective hung" in message


def test_a_worker_killed_in_silence_says_only_that(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("import sys, time\nsys.stderr.write('loading\\n')\nsys.stderr.flush()\ntime.sleep(300)\n")
    with pytest.raises(NodecheckError) as error:
        run_worker([sys.executable, str(script)], tmp_path / "out.json", 3)
    assert str(error.value) == "the worker did not finish within 3 s and was killed", str(error.value)
