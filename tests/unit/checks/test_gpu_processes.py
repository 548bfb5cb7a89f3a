"""The processes holding a GPU (src/nodecheck/probes/nvml_processes.py) and the prolog's judgment of them before a job
(src/nodecheck/checks/gpu_processes.py). NVML's lists come through the real dump_nvml() reading the pynvml stand-in; who each
process is comes from /proc: the real /proc of this machine, or a snapshot's copy. The cgroup lines of Slurm jobs
are real nodes': "0::/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0" (cgroup v2, a compute node of
the Fox cluster, 2025-03-13) and "10:devices:/slurm/uid_2101171/job_280678/step_interactive/task_0" (cgroup v1),
as NordicHPC/sonar's src/slurm.rs keeps them. The captured H100 lists none ("<processes></processes>") and
"Reserved: 480 MiB, Used: 0 MiB"."""

import json
import os
import subprocess
import sys

import pytest
from fakes import fake_pynvml
from helpers import GIB, OUTSIDE, NoDeviceFileGate, captured, node, run_nodecheck

from nodecheck.checks.gpu_processes import before_job
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.probes.nvml import collect
from nodecheck.probes.nvml_processes import parse_processes

FOX_V2 = "0::/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0\n"
OLDER_V1 = "10:devices:/slurm/uid_2101171/job_280678/step_interactive/task_0\n"
ALLOW = ["nvidia-cuda-mps-server"]


def judged(host, job=77, allowed=ALLOW) -> list[tuple[str, str, str, str]]:
    return [(f.kind, f.severity, f.subject, f.measured) for f in before_job(build_report(host), job, allowed)]


def test_the_captured_h100_holds_no_process_and_no_memory(tmp_path):
    report = build_report(node(tmp_path, [], {}, memory_total=85520809984))
    (gpu,) = report.gpus
    assert (gpu.processes, gpu.memory_used_bytes) == ([], 0)
    assert before_job(report, 77, ALLOW) == []


def test_a_process_outside_every_job_drains_and_one_of_another_job_does_not(tmp_path):
    host = node(tmp_path, [{"pid": 4242, "used_memory": 30 * GIB}, {"pid": 5151, "used_memory": 20 * GIB},
                           {"pid": 6161, "used_memory": GIB}],
                {4242: ("python3", "D", OUTSIDE), 5151: ("python", "R", FOX_V2), 6161: ("pt_main_thread", "S", OLDER_V1)})
    processes = {p.pid: p for p in build_report(host).gpus[0].processes}
    assert {pid: (p.name, p.state, p.job, p.ours, p.gone) for pid, p in processes.items()} == {
        4242: ("python3", "D", None, False, False), 5151: ("python", "R", 1392969, False, False),
        6161: ("pt_main_thread", "S", 280678, False, False)}
    assert judged(host) == [("gpu_in_use", "error", "gpu0", "pid 4242 python3, state D, 30.0 GiB")]
    (finding,) = before_job(build_report(host), 77, ALLOW)
    assert "reset the GPU" in finding.message and "before job 77" in finding.message  # state D: kill will not do


def test_a_display_server_and_an_allowed_service_are_not_judged(tmp_path):
    host = node(tmp_path, [{"pid": 900, "used_memory": 4 << 20, "graphics": True}, {"pid": 901, "used_memory": 30 << 20}],
                {900: ("Xorg", "S", OUTSIDE), 901: ("nvidia-cuda-mps", "S", OUTSIDE)})  # comm keeps 15 characters
    assert [p.type for p in build_report(host).gpus[0].processes] == ["compute", "graphics"]
    assert judged(host) == []
    assert judged(host, allowed=[]) == [("gpu_in_use", "error", "gpu0", "pid 901 nvidia-cuda-mps, 0.0 GiB")]


def test_a_pid_proc_does_not_have_is_a_warning_and_memory_nvml_cannot_say_is_no_figure(tmp_path):
    host = node(tmp_path, [{"pid": 31794, "used_memory": None}, {"pid": 7653, "used_memory": None}],
                {7653: ("python", "R", OUTSIDE)})
    assert judged(host) == [("gpu_in_use", "error", "gpu0", "pid 7653 python"),
                            ("gpu_process_gone", "warning", "gpu0", "pid 31794")]


def test_memory_held_with_no_process_is_a_warning_except_under_mig(tmp_path):
    held = dict(memory_total=85520809984, memory_used=10 * GIB)
    assert judged(node(tmp_path, [], {}, **held)) == [("gpu_memory_held", "warning", "gpu0", "10.0 GiB")]
    assert judged(node(tmp_path, [], {}, mig=[1, 1], **held)) == []
    assert judged(node(tmp_path, [], {}, memory_total=85520809984, memory_used=200 << 20)) == []


def test_a_driver_without_v2_memory_info_says_no_used_figure(tmp_path, monkeypatch):
    """v1's used counts the driver's reservation in (480 MiB on the H100): not judged as held."""
    module = fake_pynvml.replaying([dict(captured(), memory_total=85520809984)])
    del module.nvmlMemory_v2
    monkeypatch.setitem(sys.modules, "pynvml", module)
    from nodecheck.probes.nvml import dump_nvml

    raw = dump_nvml()["gpus"][0]
    assert raw["memory_used"] == {"used": 480 << 20, "reserved": None}
    snap = tmp_path / "v1"
    snap.mkdir()
    (snap / "nvml.json").write_text(json.dumps({"gpus": [raw]}))
    assert build_report(SnapshotHost(snap)).gpus[0].memory_used_bytes is None


def test_nodechecks_own_workers_and_this_machines_processes_as_the_real_proc_says(monkeypatch):
    """A child of this process (as a bench's worker is nodecheck's) is ours; pid 1 is not, and /proc names it."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(
            [dict(captured(), processes=[{"pid": child.pid, "used_memory": GIB}, {"pid": 1, "used_memory": GIB}])]))
        facts = collect(NoDeviceFileGate(), 10.0)
    finally:
        child.kill()
        child.wait()
    listed = {p["pid"]: p for p in facts.gpus[0].processes}
    assert facts.asked_by_pid == os.getpid()
    assert (listed[child.pid]["name"], listed[child.pid]["ours"]) == ("sleep", True)
    with open("/proc/1/comm") as comm:
        assert (listed[1]["name"], listed[1]["ours"]) == (comm.read().strip(), False)


def test_the_prolog_drains_a_node_held_before_the_job_and_the_health_check_does_not(tmp_path):
    snap = node(tmp_path, [{"pid": 4242, "used_memory": 30 * GIB}], {4242: ("python3", "D", OUTSIDE)}).root
    run = run_nodecheck("prolog", "--dry-run", "--json", "--from", str(snap), env_extra={"SLURM_JOB_ID": "77"})
    outcome = json.loads(run.stdout)
    assert (run.returncode, outcome["action"]) == (1, "drain"), outcome
    assert outcome["detail"] == "nodecheck: gpu0 held outside any job: pid 4242 python3, state D, 30.0 GiB"
    health = run_nodecheck("healthcheck", "--dry-run", "--json", "--from", str(snap))
    outcome = json.loads(health.stdout)  # under a running job its processes are the job's
    assert outcome["failing"] == [] and "gpu_in_use" not in health.stdout, health.stdout


def test_a_process_in_this_jobs_own_cgroup_is_not_left_over(tmp_path):
    own = "0::/system.slice/slurmstepd.scope/job_77/step_extern/user\n"  # pam_slurm_adopt's step
    assert judged(node(tmp_path, [{"pid": 4300, "used_memory": GIB}], {4300: ("python", "S", own)})) == []


@pytest.mark.parametrize("raw", [None, [], {"compute": "x"}, {"compute": [{"pid": -1}, {"pid": "7"}, 3, {"pid": 1 << 40}]},
                                 {"compute": {"error": "Not Supported"}, "graphics": [{"pid": 5, "used_memory": (1 << 64) - 1}]}])
def test_a_malformed_list_is_no_answer(raw):
    errors = {}
    listed = parse_processes(raw, errors)
    assert all(0 < p["pid"] < 1 << 31 and p["memory_bytes"] is None for p in listed or [])
    assert (listed is None) == (not isinstance(raw, dict) or not isinstance(raw.get("compute"), list))


def test_a_list_nvml_refused_is_unknown_not_empty(tmp_path):
    """NVML refusing the list (No Permission) with 10 GiB in use: no process is known, so none is said to be
    missing, and the count is absent rather than 0."""
    from helpers import metrics_of, samples

    report = build_report(node(tmp_path, "ERR", {}, memory_total=85520809984, memory_used=10 * GIB))
    assert report.gpus[0].processes is None and report.gpus[0].memory_used_bytes == 10 * GIB
    assert before_job(report, 77, ALLOW) == []
    assert not any(name == "nodecheck_gpu_processes" for name, _ in samples(metrics_of(report, tmp_path)))


def test_inspect_and_the_metrics_name_who_holds_each_gpu(tmp_path):
    from helpers import metrics_of, samples

    host = node(tmp_path, [{"pid": 4242, "used_memory": 30 * GIB}, {"pid": 5151, "used_memory": 20 * GIB}],
                {4242: ("python3", "D", OUTSIDE), 5151: ("python", "R", FOX_V2)}, memory_total=85520809984, memory_used=50 * GIB)
    shown = run_nodecheck("inspect", "--from", str(host.root))
    assert ("GPU processes: gpu0 pid 4242 python3 (outside any job, 30.0 GiB, state D); "
            "gpu0 pid 5151 python (job 1392969, 20.0 GiB)") in " ".join(shown.stdout.split()), shown.stdout
    published = samples(metrics_of(build_report(host), tmp_path))
    assert published[("nodecheck_gpu_processes", (("gpu", "0"), ("owner", "none")))] == 1
    assert published[("nodecheck_gpu_processes", (("gpu", "0"), ("owner", "job")))] == 1
    assert published[("nodecheck_gpu_processes", (("gpu", "0"), ("owner", "unknown")))] == 0
    gone = build_report(node(tmp_path, [{"pid": 31794, "used_memory": None}], {}))  # /proc does not show it
    assert samples(metrics_of(gone, tmp_path))[("nodecheck_gpu_processes", (("gpu", "0"), ("owner", "unknown")))] == 1
    assert published[("nodecheck_gpu_memory_used_bytes", (("gpu", "0"),))] == 50 * GIB


def test_a_slow_copy_on_a_gpu_another_process_held_is_a_warning_naming_it(tmp_path):
    """`bench` beside a job: gpu0's h2d at half its spec measured the sharing, not the link; with the GPU free the
    same figure drains."""
    from nodecheck.report.model import Measurement
    from nodecheck.verdicts.bandwidth import with_measurements

    spec = 64e9
    h2d = Measurement.measured("gpu0:host", "h2d", 0.5 * spec, spec, 1 << 28, "cudaMemcpyAsync", "unidirectional",
                               {"path_kind": "pcie"})
    held = build_report(node(tmp_path, [{"pid": 4242, "used_memory": 30 * GIB}], {4242: ("python3", "R", OUTSIDE)}))
    (finding,) = [f for f in with_measurements(held, [h2d], 0.0, None).findings if f.kind == "bandwidth_below_spec"]
    assert finding.severity == "warning" and "another process held gpu0 (pid 4242 python3)" in finding.message
    free = build_report(node(tmp_path, [], {}))
    (finding,) = [f for f in with_measurements(free, [h2d], 0.0, None).findings if f.kind == "bandwidth_below_spec"]
    assert finding.severity == "error"


def test_the_exporters_bench_round_waits_while_another_process_holds_a_gpu(tmp_path):
    from nodecheck.prometheus.serve import busy_gpus

    held = build_report(node(tmp_path, [{"pid": 4242, "used_memory": 30 * GIB}], {4242: ("python3", "S", FOX_V2)}))
    assert held.gpus[0].utilization_percent == 0  # a job loading its data: idle by utilization
    assert busy_gpus(held) == ["gpu0 held by pid 4242 python3"]
    assert busy_gpus(build_report(node(tmp_path, [], {}))) == []


def test_a_hostile_proc_in_a_snapshot_is_read_bounded(tmp_path):
    """A comm holding ") S 1 ", parents that name each other, a stat of garbage and a cgroup file of 60 KB: each
    read once, bounded; the garbage one is as good as gone."""
    host = node(tmp_path, [{"pid": 10, "used_memory": GIB}, {"pid": 12, "used_memory": GIB}],
                {10: ("a) S 1 (b", "S", "x" * 60_000 + "\n" + OUTSIDE), 12: ("python", "S", OUTSIDE)})
    for pid, parent in ((10, 11), (11, 10), (12, 12)):
        folder = host.root / "fs" / "proc" / str(pid)
        folder.mkdir(exist_ok=True)
        comm = "a) S 1 (b" if pid == 10 else "loop"
        (folder / "stat").write_text(f"{pid} ({comm}) S {parent} 0 0\n" if pid != 12 else "garbage\n")
    listed = {p.pid: p for p in build_report(host).gpus[0].processes}
    assert (listed[10].name, listed[10].job, listed[10].ours, listed[12].gone) == ("a) S 1 (b", None, False, True)


def test_the_allowed_names_come_from_the_config():
    from nodecheck.config import Config, loads
    from nodecheck.core.errors import ConfigError

    assert Config().prolog.gpu_process_allow == ["nvidia-cuda-mps-server"]
    assert loads('[prolog]\ngpu_process_allow = ["dcgmproftester"]\n', "t.toml").prolog.gpu_process_allow == ["dcgmproftester"]
    with pytest.raises(ConfigError, match="prolog.gpu_process_allow"):
        loads("[prolog]\ngpu_process_allow = 3\n", "t.toml")


@pytest.mark.parametrize(("state", "idle"), [("IDLE", True), ("IDLE+DRAIN", True), ("IDLE+COMPLETING", False),
                                             ("MIXED", False), ("ALLOCATED+DRAIN", False), ("DOWN*", False)])
def test_which_slurm_states_run_no_job(state, idle):
    from nodecheck.slurm.scontrol import parse_node

    assert parse_node("gpu01", f"NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 State={state} ThreadsPerCore=1\n").idle is idle


def test_each_pids_stat_is_read_once_however_many_processes_share_their_parents():
    """256 processes on each of two GPUs, all children of one launcher under a slurmstepd: the launcher's and
    slurmstepd's stat are read once, not once per process (a hostile snapshot's 16,384 would be 16 times more)."""
    from nodecheck.probes.nvml_processes import describe_owners

    files = {"/proc/2/stat": "2 (slurmstepd) S 1 0 0\n", "/proc/3/stat": "3 (torchrun) S 2 0 0\n"}
    for pid in range(100, 612):
        files[f"/proc/{pid}/stat"] = f"{pid} (python) S 3 0 0\n"

    class Counting:
        reads: list[str] = []

        def read_text(self, path):
            self.reads.append(path)
            return files.get(path)

    host = Counting()
    processes = [{"pid": pid, "type": "compute", "memory_bytes": GIB} for pid in range(100, 612)]
    describe_owners(host, processes, own_pid=99)
    assert all(p["job"] == 0 and not p["ours"] for p in processes)  # a job's, by its slurmstepd grandparent
    assert len(host.reads) == len(set(host.reads))  # cgroup and stat of each process, its parents' stat, once each
