"""nodecheck in a real single-node Slurm 22.05 (munge, slurmctld, slurmd), installed through
deploy/slurm's wrapper and slurm.conf snippet: a healthy node runs a job; a node whose config expects
more than it has is drained with a `nodecheck:` reason and the sbatch job is requeued; the health
check resumes it once the fault is gone; an admin's drain stays; a job can skip the prolog."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, fake_executable, free_port, nodecheck
from slurm_cluster import SlurmNode, missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

HEALTHY = "[prolog]\ntimeout_s = 20\n"
FAULTY = HEALTHY + "[gpus]\ncount = 1\n"  # this CPU node has none: the checks must fail


@pytest.fixture(scope="module")
def slurm():
    with SlurmNode() as node:
        yield node


def finished(slurm: SlurmNode, job_id: str) -> bool:
    return slurm.job(job_id).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED")


def test_healthy_node_runs_the_job(slurm, tmp_path):
    slurm.configure(HEALTHY)
    out = tmp_path / "out.txt"
    job = slurm.sbatch("-o", str(out), "--wrap", "echo ran on $SLURMD_NODENAME")
    slurm.wait_for(lambda: finished(slurm, job), 120, f"job {job} to finish")
    assert slurm.job(job)["JobState"] == "COMPLETED", slurm.log("slurmd.log")
    assert out.read_text().strip() == f"ran on {slurm.name}"
    slurm.wait_for(lambda: slurm.node_state() == "idle", 60, "the node to be idle again")  # not drained
    # the prolog (root, as Slurm runs it) remembered this boot's kernel log in the state directory it was given
    state = json.loads((slurm.root / "nodecheck-state/state.json").read_text())
    assert state["kernel_log"]["upto_usec"] > 0


def test_fault_drains_with_the_check_and_requeues_the_job(slurm, tmp_path):
    """A prolog-only fault (a bandwidth test this CPU node cannot run; the health check never runs them,
    so only the job's prolog can find it): the node drains naming the check, the job is requeued and
    held; repaired, the health check resumes the node and the released job runs. The waits are upper
    bounds for a loaded 2-core machine."""
    slurm.configure(HEALTHY + 'bench = ["h2d"]\n')
    job = slurm.sbatch("-o", str(tmp_path / "out.txt"), "--wrap", "echo should not run yet")
    try:
        slurm.wait_for(lambda: slurm.node_state().startswith("drain"), 120, "the node to drain")
        assert slurm.node_reason() == "nodecheck: h2d on gpus failed"
        slurm.wait_for(lambda: slurm.job(job).get("Reason") == "launch_failed_requeued_held", 180, "the job to be requeued")
        info = slurm.job(job)
        assert info["JobState"] == "PENDING" and int(info["Restarts"]) >= 1
        assert not (tmp_path / "out.txt").exists() or "should not run" not in (tmp_path / "out.txt").read_text()

        # the fault is repaired: the health check resumes the node it drained, and the held job then runs
        slurm.configure(HEALTHY)
        slurm.wait_for(lambda: slurm.node_state() == "idle", 120, "the health check to resume the node")
        slurm.run("scontrol", "release", job)
        slurm.run("scontrol", "update", f"jobid={job}", "starttime=now")  # Slurm delays a requeued job ~2 min
        slurm.wait_for(lambda: finished(slurm, job), 120, f"job {job} to run after the release")
        assert slurm.job(job)["JobState"] == "COMPLETED"
    finally:
        slurm.cancel(job)  # a job left behind would meet the next test's prolog
        slurm.configure(HEALTHY)


def test_health_check_drains_a_faulty_node_and_resumes_it_repaired(slurm):
    """No job needed: the health check alone drains the node for a fault the probes see, and lifts its
    own drain once the fault is gone."""
    slurm.configure(FAULTY)
    try:
        slurm.wait_for(lambda: slurm.node_state().startswith("drain"), 120, "the health check to drain the node")
        assert slurm.node_reason() == "nodecheck: GPUs 0 < 1"
    finally:
        slurm.configure(HEALTHY)
    slurm.wait_for(lambda: slurm.node_state() == "idle", 120, "the health check to resume the node")


def test_a_name_with_a_newline_drains_with_one_line_and_is_resumed(slurm):
    """A config (or sysfs, or NVML) naming a NIC with a newline and an escape sequence: the drain reason Slurm keeps
    is one printable line, `scontrol show node --oneliner` stays one line, and the health check still recognises
    its own drain and lifts it once the config is fixed."""
    slurm.configure(HEALTHY + '[nics."eth9\\nState=IDLE\\u001b[2J"]\nstate = "up"\n')
    try:
        slurm.wait_for(lambda: slurm.node_state().startswith("drain"), 120, "the health check to drain the node")
        shown = slurm.run("scontrol", "show", "node", slurm.name, "--oneliner")
        assert len(shown.strip().splitlines()) == 1 and "\x1b" not in shown, shown
        assert slurm.node_reason() == "nodecheck: eth9?State=IDLE?[2J missing"
    finally:
        slurm.configure(HEALTHY)
    slurm.wait_for(lambda: slurm.node_state() == "idle", 120, "the health check to resume the node")


def test_admin_drain_is_never_resumed(slurm):
    slurm.configure(HEALTHY)
    slurm.run("scontrol", "update", f"nodename={slurm.name}", "state=drain", "reason=admin: DIMM replacement")
    try:
        time.sleep(slurm.health_interval * 3 + 1)  # three health-check rounds, all with passing checks
        assert slurm.node_state().startswith("drain") and slurm.node_reason() == "admin: DIMM replacement"
    finally:
        slurm.run("scontrol", "update", f"nodename={slurm.name}", "state=resume")


def test_job_comment_and_partition_skip_the_prolog(slurm, tmp_path):
    """A prolog-only fault (a bandwidth test that cannot run on this CPU node; the health check never
    runs them, so it cannot drain the node meanwhile): jobs that skip the prolog still run."""
    slurm.configure(HEALTHY + 'bench = ["h2d"]\nskip_partitions = ["scratch"]\n')
    dry = subprocess.run([str(Path(sys.executable).parent / "nodecheck"), "prolog", "--dry-run", "--config", str(slurm.nodecheck_config)],
                         capture_output=True, text=True, timeout=60, env=dict(slurm.env, SLURMD_NODENAME=slurm.name))
    assert dry.returncode == 1 and f"would drain {slurm.name}: nodecheck: h2d on gpus failed" in dry.stdout, dry.stdout
    try:
        for args in (["--comment=nodecheck:skip"], ["-p", "scratch"]):
            job = slurm.sbatch("-o", str(tmp_path / "skip.txt"), *args, "--wrap", "echo skipped the prolog")
            try:
                slurm.wait_for(lambda job=job: finished(slurm, job) or slurm.node_state().startswith("drain"), 120, f"job {job}")
                assert slurm.job(job)["JobState"] == "COMPLETED", (args, slurm.node_reason())
            finally:
                slurm.cancel(job)
    finally:
        slurm.configure(HEALTHY)


def test_wrapper_drains_when_nodecheck_itself_hangs(slurm, tmp_path):
    """The last resort: a nodecheck that never returns (stuck in the kernel) is killed by the wrapper's
    timeout, which drains naming that; the health check lifts the drain once the checks pass."""
    slurm.configure(HEALTHY)
    wrapper = tmp_path / "nodecheck-prolog"
    wrapper.write_text((REPO / "deploy/slurm/nodecheck-slurm").read_text())
    wrapper.chmod(0o755)
    stuck = fake_executable(tmp_path / "stuck-nodecheck", "sleep 60\n")
    (tmp_path / "nodecheck.env").write_text(f"NODECHECK={stuck}\nNODECHECK_KILL_AFTER=1\n")
    started = time.monotonic()
    run = subprocess.run([str(wrapper)], env={"SLURMD_NODENAME": slurm.name, "SLURM_CONF": str(slurm.conf)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and time.monotonic() - started < 40 and "killed after 1s" in run.stderr
    assert slurm.node_reason() == "nodecheck: prolog killed after 1s"
    slurm.wait_for(lambda: slurm.node_state() == "idle", 120, "the health check to resume the node")


def test_wrapper_names_a_nodecheck_that_cannot_run(slurm, tmp_path):
    """A half-done install: the command is missing (127) or not executable (126). Slurm drained such a node as
    "Prolog error"; the prolog wrapper drains it naming the command. The health check's wrapper leaves the node
    as it is (it cannot vouch for it either way) and passes the exit status on."""
    slurm.configure(HEALTHY)
    not_executable = tmp_path / "nodecheck-without-x"
    not_executable.write_text("#!/bin/sh\nexit 0\n")
    for command, rc in ((tmp_path / "missing" / "nodecheck", 127), (not_executable, 126)):
        for mode in ("prolog", "healthcheck"):
            wrapper = tmp_path / f"nodecheck-{mode}"
            wrapper.write_text((REPO / "deploy/slurm/nodecheck-slurm").read_text())
            wrapper.chmod(0o755)
            (tmp_path / "nodecheck.env").write_text(f"NODECHECK={command}\n")
            run = subprocess.run([str(wrapper)], env={"SLURMD_NODENAME": slurm.name, "SLURM_CONF": str(slurm.conf)},
                                 capture_output=True, text=True, timeout=60)
            if mode == "prolog":
                assert run.returncode == 1 and f"nodecheck prolog: cannot run {command} (exit {rc})" in run.stderr, run.stderr
                assert slurm.node_reason() == f"nodecheck: prolog cannot run {command} (exit {rc})"
                slurm.run("scontrol", "update", f"nodename={slurm.name}", "state=resume")
            else:
                assert run.returncode == rc and slurm.node_reason() == "", (run.returncode, run.stderr, slurm.node_reason())
    slurm.wait_for(lambda: slurm.node_state() == "idle", 120, "the node to be idle again")


def test_healthcheck_dry_run_leaves_an_admin_drain(slurm):
    slurm.configure(FAULTY)
    slurm.run("scontrol", "update", f"nodename={slurm.name}", "state=drain", "reason=admin: firmware update")
    try:
        run = subprocess.run([str(Path(sys.executable).parent / "nodecheck"), "healthcheck", "--dry-run", "--config",
                              str(slurm.nodecheck_config)], env={"SLURMD_NODENAME": slurm.name, "STATE_DIRECTORY": str(slurm.root / "nodecheck-state")},
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 1  # the checks fail ...
        assert "no change (already drained by someone else (admin: firmware update)" in run.stdout, run.stdout  # ... the reason stays
        assert slurm.node_reason() == "admin: firmware update"
    finally:
        slurm.configure(HEALTHY)
        slurm.run("scontrol", "update", f"nodename={slurm.name}", "state=resume")


def test_a_sweep_writes_each_nodes_report_and_compares_them(slurm, tmp_path):
    """deploy/slurm/nodecheck-sweep in a real job: srun runs `nodecheck inspect --json` on the node into the
    sweep's directory, then `nodecheck fleet` reads it (one node: fewer than 5 peers, nothing judged)."""
    slurm.configure(HEALTHY)
    out, log = tmp_path / "sweep", tmp_path / "sweep.log"
    entry = Path(sys.executable).parent / "nodecheck"
    job = slurm.sbatch("-o", str(log), "--export", f"ALL,NODECHECK={entry}",
                       "--wrap", f"sh {REPO / 'deploy/slurm/nodecheck-sweep'} {out}")
    slurm.wait_for(lambda: finished(slurm, job), 120, f"sweep job {job} to finish")
    assert slurm.job(job)["JobState"] == "COMPLETED", log.read_text()[-2000:] if log.exists() else slurm.log("slurmd.log")
    (report,) = list(out.glob("*.json"))
    assert json.loads(report.read_text())["schema"] == "nodecheck.report"
    assert "fewer than 5 peers each, nothing judged" in log.read_text()


def test_a_sweep_keeps_a_failing_nodes_report_and_names_a_node_that_wrote_none(slurm, tmp_path):
    """`inspect` exits 1 on a node with a failing finding: the sweep took that for "no Report" (`inspect > tmp &&
    mv`), so the nodes it most needed to show were left out of the fleet, each leaving its half-file behind. Its
    Report is kept; a node whose inspect writes none (a broken config: exit 2) or is killed at the time limit
    (after it wrote part of one) is named and leaves no file."""
    slurm.configure(HEALTHY)
    entry = Path(sys.executable).parent / "nodecheck"
    faulty = tmp_path / "faulty.toml"
    faulty.write_text(FAULTY)
    cases = {"failing": (f'"$@" --config {faulty}', None), "broken": (f'"$@" --config {tmp_path}/none.toml', 2),
             "hung": ('"$@"; sleep 30', 124)}  # its Report written, or part of it, then killed at the time limit
    for name, (inspect, exit_code) in cases.items():
        out, log = tmp_path / f"sweep-{name}", tmp_path / f"sweep-{name}.log"
        wrapper = fake_executable(tmp_path / f"nodecheck-{name}",  # for the nodes' inspect; fleet as it is
                                  f'[ "$1" = inspect ] && {{ {entry} {inspect}; exit; }}\nexec {entry} "$@"\n')
        limit = 3 if exit_code == 124 else 120  # the hung one alone is meant to meet the time limit
        job = slurm.sbatch("-o", str(log), "--export", f"ALL,NODECHECK={wrapper},NODECHECK_SWEEP_TIMEOUT={limit}",
                           "--wrap", f"sh {REPO / 'deploy/slurm/nodecheck-sweep'} {out}")
        slurm.wait_for(lambda job=job: finished(slurm, job), 120, f"sweep job {job} to finish")
        text = log.read_text() if log.exists() else ""
        assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [], (name, text[-2000:])  # no half-file
        if exit_code is None:
            (report,) = list(out.glob("*.json"))
            errors = [f for f in json.loads(report.read_text())["findings"] if f["severity"] == "error"]
            assert errors and errors[0]["kind"] == "gpu_count_low", (name, errors)
            assert "fewer than 5 peers each, nothing judged" in text and "wrote no Report" not in text, text[-2000:]
        else:
            assert list(out.glob("*.json")) == [], text[-2000:]
            assert f"nodecheck-sweep: {slurm.name} wrote no Report (nodecheck inspect exited {exit_code})" in text, text[-2000:]


def test_an_allreduce_across_the_allocation_leaves_the_jobs_report(slurm, tmp_path):
    """deploy/slurm/nodecheck-allreduce in a real job: srun starts the ranks (two, on this one node), they meet at the
    first node's NodeAddr, and rank 0's Report, the job's, is written for `inspect --from`. Outside an allocation it
    says so."""
    pytest.importorskip("torch", reason="the all-reduce needs torch (the bench extra)")
    script = REPO / "deploy/slurm/nodecheck-allreduce"
    alone = subprocess.run(["sh", str(script), str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60,
                           env={"PATH": os.environ["PATH"]})
    assert alone.returncode == 2 and "not inside a Slurm allocation" in alone.stderr and not (tmp_path / "x.json").exists()
    slurm.configure(HEALTHY)
    out, log = tmp_path / "allreduce.json", tmp_path / "allreduce.log"
    entry = Path(sys.executable).parent / "nodecheck"
    job = slurm.sbatch("-o", str(log), "-n", "2", "-t", "5", "--export", f"ALL,NODECHECK={entry},MASTER_PORT={free_port()}",
                       "--wrap", f"sh {script} {out} --ntasks-per-node=2")
    slurm.wait_for(lambda: finished(slurm, job), 280, f"all-reduce job {job} to finish")
    text = log.read_text() if log.exists() else ""
    assert slurm.job(job)["JobState"] == "COMPLETED", text[-3000:] or slurm.log("slurmd.log")
    report = json.loads(out.read_text())
    (allreduce,) = [m for m in report["measurements"] if m["test"] == "allreduce"]
    assert allreduce["ok"] and allreduce["ranks"] == 2, allreduce
    assert f"nodecheck-allreduce: the job's Report is in {out}" in text and not list(tmp_path.glob(".nodecheck-allreduce.*"))
    shown = nodecheck("inspect", "--from", str(out))
    assert shown.returncode == 0 and allreduce["path"] in shown.stdout, shown.stdout + shown.stderr


# What NCCL with the Inspector plugin writes in each rank of a job (no GPU here: this stands in for NCCL, as the plugin
# writes, the v4.3 format of its README): 20 AllReduce operations of 2 ranks, rank 1 joining each 3 ms late
INSPECTOR_RANK = r"""
import json, os
assert os.environ["NCCL_INSPECTOR_ENABLE"] == "1" and os.path.isfile(os.environ["NCCL_PROFILER_PLUGIN"])
rank, n = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
records = [{"header": {"id": "0xjob", "rank": rank, "n_ranks": n, "nnodes": 1},
            "metadata": {"inspector_output_format_version": "v4.3", "hostname": os.uname().nodename, "pid": os.getpid()},
            "dump_stats": {"coll_records": 20, "p2p_records": 0}}]
for sn in range(20):
    exec_us = 9000.0 + (0 if rank == 1 else 3000.0 + 10 * rank)
    records.append({"coll_perf": {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": 1 << 28, "coll_exec_time_us": exec_us,
                                  "coll_timing_source": "kernel_gpu", "coll_busbw_gbs": (1 << 28) / exec_us / 1e3}})
path = os.path.join(os.environ["NCCL_INSPECTOR_DUMP_DIR"], f"{os.uname().nodename}-pid{os.getpid()}.log")
with open(path, "w") as out:
    out.write("\n".join(json.dumps(r) for r in records) + "\n")
"""


def test_a_job_step_under_the_inspector_wrapper_names_its_late_rank(slurm, tmp_path):
    """deploy/slurm/nodecheck-inspector in a real job: srun runs the step with the plugin's variables set, each rank
    writes its file under DIR/JOBID, and the wrapper names rank 1, the late one, in DIR/JOBID.nccl-job.json. Without
    an allocation or without the plugin it says so (exit 2)."""
    script = REPO / "deploy/slurm/nodecheck-inspector"
    plugin = tmp_path / "libnccl-profiler-inspector.so"
    plugin.write_bytes(b"")
    alone = subprocess.run(["sh", str(script), str(tmp_path / "d"), "--", "true"], capture_output=True, text=True, timeout=60,
                           env={"PATH": os.environ["PATH"], "NCCL_PROFILER_PLUGIN": str(plugin)})
    assert alone.returncode == 2 and "not inside a Slurm allocation" in alone.stderr
    unplugged = subprocess.run(["sh", str(script), str(tmp_path / "d"), "--", "true"], capture_output=True, text=True, timeout=60,
                               env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "1"})
    assert unplugged.returncode == 2 and "NCCL_PROFILER_PLUGIN must name" in unplugged.stderr
    slurm.configure(HEALTHY)
    (tmp_path / "rank.py").write_text(INSPECTOR_RANK)
    dumps, log = tmp_path / "inspector", tmp_path / "inspector.log"
    entry = Path(sys.executable).parent / "nodecheck"
    job = slurm.sbatch("-o", str(log), "-n", "2", "-t", "5", "--export", f"ALL,NODECHECK={entry},NCCL_PROFILER_PLUGIN={plugin}",
                       "--wrap", f"sh {script} {dumps} --ntasks=2 -- {sys.executable} {tmp_path / 'rank.py'}")
    slurm.wait_for(lambda: finished(slurm, job), 280, f"inspector job {job} to finish")
    text = log.read_text() if log.exists() else ""
    assert slurm.job(job)["JobState"] == "COMPLETED", text[-3000:] or slurm.log("slurmd.log")
    verdict = json.loads((dumps / f"{job}.nccl-job.json").read_text())
    assert [(n["why"], n["rank"]) for n in verdict["named"]] == [("late", 1)], verdict
    assert f"nodecheck-inspector: a rank held job {job} back" in text and not list(dumps.glob(".nodecheck-inspector.*"))


def test_a_jobs_process_on_a_gpu_is_the_jobs_and_a_stray_one_drains(slurm, tmp_path, monkeypatch):
    """Real processes, as NVML would list them on a GPU: a running job's task (this Slurm tracks processes without
    cgroups, proctrack/linuxproc: its slurmstepd parent says it is a job's) and a process that left its parent
    (setsid and a shell that exited: reparented, as a leftover daemon is). Only the stray one is in use."""
    from fakes import fake_pynvml
    from helpers import GIB, NoDeviceFileGate, captured

    from nodecheck.checks.gpu_processes import before_job
    from nodecheck.probes.nvml import collect
    from nodecheck.report.model import GpuProcess, Report

    slurm.configure(HEALTHY)
    pidfile = tmp_path / "pid"
    job = slurm.sbatch("-o", "/dev/null", "--wrap", f"echo $$ > {pidfile}; exec sleep 60")
    stray = subprocess.run(["setsid", "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                           timeout=10).stdout.strip()
    try:
        slurm.wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 60, "the job's task to start")
        task = int(pidfile.read_text())
        slurm.wait_for(lambda: Path(f"/proc/{task}/comm").read_text().strip() == "sleep", 30, "the task to exec sleep")
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying([dict(captured(), processes=[
            {"pid": task, "used_memory": GIB}, {"pid": int(stray), "used_memory": 2 * GIB}])]))
        listed = {p["pid"]: p for p in collect(NoDeviceFileGate(), 10.0).gpus[0].processes}
    finally:
        slurm.cancel(job)
        subprocess.run(["kill", "-9", stray], capture_output=True, timeout=10)
    assert (listed[task]["name"], listed[task]["job"]) == ("sleep", 0), listed  # under slurmstepd
    assert (listed[int(stray)]["job"], listed[int(stray)]["ours"]) == (None, False), listed
    report = Report.from_dict({"gpus": [{"index": 0, "processes": list(listed.values())}]})
    assert all(isinstance(p, GpuProcess) for p in report.gpus[0].processes)
    assert [(f.kind, f.measured) for f in before_job(report, int(job) + 1, [])] == [("gpu_in_use", f"pid {stray} sleep, 2.0 GiB")]


def test_the_health_check_judges_gpu_processes_on_an_idle_node_only(slurm, tmp_path):
    """A snapshot whose GPU a stray process holds, judged with this real Slurm's view of the node: idle, the health
    check would drain it (and so never resumes a node the prolog drained for it); running a job, it does not judge
    the processes, which may be the job's."""
    from helpers import GIB, OUTSIDE, node

    slurm.configure(HEALTHY)
    snap = node(tmp_path, [{"pid": 4242, "used_memory": 30 * GIB}], {4242: ("python3", "S", OUTSIDE)}).root

    def healthcheck() -> dict:
        run = subprocess.run([str(Path(sys.executable).parent / "nodecheck"), "healthcheck", "--dry-run", "--json", "--from",
                              str(snap), "--config", str(slurm.nodecheck_config)],
                             env={"SLURMD_NODENAME": slurm.name, "STATE_DIRECTORY": str(slurm.root / "nodecheck-state")},
                             capture_output=True, text=True, timeout=60)
        return json.loads(run.stdout)

    slurm.wait_for(lambda: slurm.node_state() == "idle", 60, "the node to be idle")
    idle = healthcheck()
    assert (idle["action"], idle["detail"]) == ("drain", "nodecheck: gpu0 held outside any job: pid 4242 python3, 30.0 GiB"), idle
    job = slurm.sbatch("-o", "/dev/null", "--wrap", "sleep 60")
    try:
        slurm.wait_for(lambda: slurm.node_state() in ("allocated", "mixed"), 60, "the job to run")
        busy = healthcheck()
    finally:
        slurm.cancel(job)
    assert busy["failing"] == [] and "gpu_in_use" not in json.dumps(busy), busy
