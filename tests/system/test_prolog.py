"""The prolog's decisions without Slurm: drain reasons named after the check and its figure, which
drains the health check may lift, skipping, the time budget (a hung nvidia-smi, a hung check), a
broken config, and scontrol's node line as Slurm 22.05 prints it."""

import json
import os
import threading
import time

import pytest
from helpers import DRAINED_LINE, fake_executable, hgx_nvml, make_snapshot, run_nodecheck

from nodecheck.config import Config, PrologSettings
from nodecheck.core.errors import NoData, ParseError
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.report.findings import Finding, one_line
from nodecheck.slurm.prolog import Verdict, _run_bounded, drain_reason, failing_findings, plan_action, skip_reason
from nodecheck.slurm.scontrol import NodeState, parse_node, slurm_env


def test_parse_node_as_slurm_prints_it():
    state = parse_node("vm", DRAINED_LINE)
    assert state.states == ["IDLE", "DRAIN"] and state.reason == "nodecheck: gpu3 PCIe x8 < x16 (+1 more)"
    assert state.drained and state.drained_by_nodecheck
    idle = parse_node("vm", DRAINED_LINE.replace("IDLE+DRAIN", "IDLE").split(" Reason=")[0])
    assert idle.states == ["IDLE"] and idle.reason is None and not idle.drained
    admin = parse_node("vm", DRAINED_LINE.replace("nodecheck: gpu3 PCIe x8 < x16 (+1 more)", "admin: DIMM [ticket 7]"))
    assert admin.reason == "admin: DIMM [ticket 7]" and admin.drained and not admin.drained_by_nodecheck
    with pytest.raises(ParseError, match="no state for node vm"):
        parse_node("vm", "Node vm not found\n")


def test_drain_reasons_name_the_check_and_the_figure(tmp_path):
    nvml = hgx_nvml()
    nvml[3] = dict(nvml[3], width=8)  # a riser that trained at x8
    report = build_report(SnapshotHost(make_snapshot(tmp_path / "s", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=nvml)),
                          Config(gpu_count=8))
    failing = [f for f in report.findings if f.severity == "error"]
    assert drain_reason(failing) == "nodecheck: gpu3 PCIe x8 < x16"
    more = failing + [Finding("gpu_count_low", "error", "node", 7, 8, "7 GPUs visible, 8 expected")]
    assert drain_reason(more) == "nodecheck: gpu3 PCIe x8 < x16 (+1 more)"
    hung = Finding("probe_failed", "error", "probe:nvml", "timed out", "ok", "probe nvml timed out: NVML did not answer within 8 s")
    assert drain_reason([hung]) == "nodecheck: probe:nvml timed out"
    long = Finding("bench_failed", "error", "gpu0:host", "failed", "completed", "h2d on gpu0:host: " + "x" * 500)
    assert drain_reason([long, hung]) == "nodecheck: h2d on gpu0:host failed (+1 more)"
    assert len(drain_reason([Finding("nic_missing", "error", "n" * 400, "absent", "present", "m"), hung])) <= 200


def test_a_drain_reason_is_one_printable_line_whatever_a_name_holds():
    """A NIC or GPU name comes from sysfs, NVML, a config or a snapshot: a newline in it ended the reason's line in
    `scontrol show node --oneliner` (which the prolog reads back), an escape sequence reached the admin's terminal."""
    hostile = Finding("nic_missing", "error", "eth0\nState=IDLE\x1b[2J\t", "absent", "present", "m")
    assert drain_reason([hostile]) == "nodecheck: eth0?State=IDLE?[2J? missing"
    assert one_line("nodecheck: gpu3 PCIe x8 < x16 \x85") == "nodecheck: gpu3 PCIe x8 < x16 ?"


def test_who_may_lift_a_drain():
    failing = Verdict("n1", [], [], [Finding("nic_down", "error", "ib0", "down", "up", "ib0 down")])
    passing = Verdict("n1", [], [], [])
    ours, admins = NodeState("n1", ["IDLE", "DRAIN"], "nodecheck: ib0 down != up"), NodeState("n1", ["IDLE", "DRAIN"], "memtest")
    idle = NodeState("n1", ["IDLE"])
    assert plan_action(failing, None, healthcheck=False) == ("drain", "nodecheck: ib0 down != up")
    assert plan_action(failing, idle, healthcheck=True) == ("drain", "nodecheck: ib0 down != up")
    assert plan_action(failing, ours, healthcheck=True)[0] == "none"  # already drained for this reason
    assert plan_action(failing, admins, healthcheck=True)[0] == "none"  # the admin's reason is kept
    assert plan_action(passing, ours, healthcheck=True) == ("resume", None)
    assert plan_action(passing, admins, healthcheck=True)[0] == "none"
    assert plan_action(passing, ours, healthcheck=False)[0] == "none"  # only the health check resumes


def test_skipping_by_partition_or_job_comment():
    prolog = PrologSettings(skip_partitions=["interactive"])
    assert "partition interactive" in skip_reason({"SLURM_JOB_PARTITION": "interactive"}, prolog)
    assert "job comment" in skip_reason({"SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_COMMENT": "run nodecheck:skip please"}, prolog)
    assert skip_reason({"SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_COMMENT": "nodecheck"}, prolog) is None


def test_a_check_past_the_deadline_is_named_as_timed_out():
    started = time.monotonic()
    runs = _run_bounded({"stuck": (lambda: time.sleep(30), "error"), "quick": (lambda: ([], [{"ok": 1}]), "error")},
                        time.monotonic() + 0.5)
    assert time.monotonic() - started < 2
    stuck, quick = runs
    assert stuck.timed_out and stuck.findings[0].kind == "check_timed_out" and stuck.findings[0].severity == "error"
    assert drain_reason(stuck.findings) == "nodecheck: stuck timed out after 0.5 s"
    assert not quick.timed_out and quick.details == [{"ok": 1}]


def test_a_warning_check_that_times_out_stays_a_warning_and_durations_are_each_checks_own():
    def late_start():
        time.sleep(0.3)
        return [], []

    stuck_for = threading.Event()
    runs = _run_bounded({"slow": (late_start, "error"), "proximity": (lambda: stuck_for.wait(30), "warning"),
                         "instant": (lambda: ([], []), "error")}, time.monotonic() + 1.0)
    slow, proximity, instant = runs
    assert proximity.timed_out and proximity.findings[0].severity == "warning"
    assert failing_findings(proximity.findings, "error") == []  # a late warning check never drains
    assert instant.seconds < slow.seconds  # measured from each check's start, not from the join
    stuck_for.set()


def test_hung_nvidia_smi_drains_within_the_budget_naming_the_probe(tmp_path):
    fake_executable(tmp_path / "nvidia-smi", "sleep 60\n")
    config = tmp_path / "c.toml"
    config.write_text("[prolog]\ntimeout_s = 4\n")
    started = time.monotonic()
    run = run_nodecheck("prolog", "--dry-run", "--config", str(config), path_prefix=str(tmp_path))
    assert time.monotonic() - started < 8, run.stdout
    assert run.returncode == 1 and "would drain testnode: nodecheck: probe:nvidia_smi_topo timed out" in run.stdout, run.stdout


def test_broken_config_drains_saying_so(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[gpus]\ncuont = 8\n")
    run = run_nodecheck("prolog", "--dry-run", "--config", str(config))
    assert run.returncode == 1
    assert f"would drain testnode: nodecheck: config error: {config}: unknown key 'gpus.cuont'" in run.stdout, run.stdout


def test_skipped_job_exits_zero_without_checking(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[gpus]\ncount = 64\n")  # would fail
    run = run_nodecheck("prolog", "--config", str(config), env_extra={"SLURM_JOB_COMMENT": "nodecheck:skip"})
    assert run.returncode == 0 and "skipped (job comment contains 'nodecheck:skip')" in run.stdout


def test_healthcheck_without_slurm_says_why(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'[slurm]\nconf = "{tmp_path}/nowhere.conf"\nscontrol_timeout_s = 5\n')
    run = run_nodecheck("healthcheck", "--config", str(config), path_prefix=str(tmp_path))
    # the checks first, then why Slurm could not be asked; a configuration error: exit 2
    assert run.returncode == 2 and "cannot read node testnode's state from Slurm" in run.stderr, run.stdout + run.stderr
    assert "nodecheck healthcheck: node: ok" in run.stdout and "nothing is resumed" in run.stdout
    dry = run_nodecheck("healthcheck", "--dry-run", "--json", "--config", str(config), path_prefix=str(tmp_path))
    outcome = json.loads(dry.stdout)
    assert dry.returncode == 2 and (outcome["schema"], outcome["schema_version"], outcome["action"]) == ("nodecheck.prolog", 1, "none")
    assert [c["name"] for c in outcome["checks"]] == ["node", "proximity"] and "testnode" in outcome["slurm_error"]


def test_slurm_env_supplies_path_and_conf(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.delenv("PATH", raising=False)
    env = slurm_env(str(tmp_path / "slurm.conf"))
    assert env["SLURM_CONF"] == str(tmp_path / "slurm.conf") and "/usr/bin" in env["PATH"].split(":")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/other.conf")
    assert slurm_env(None)["SLURM_CONF"] == "/etc/slurm/other.conf"
    assert os.environ.get("PATH") is None  # the process's own environment is left alone


def test_bench_tests_that_do_not_fit_the_budget_are_skipped_and_never_drain(monkeypatch):
    """The first test is stopped at the budget's end (a real `nodecheck bench` subprocess killed by its
    time limit is what run_in_subprocess reports then); the second has no time left to start. Both
    are named at warning, and the prolog would not drain."""
    from nodecheck.bench import plan
    from nodecheck.config import Config
    from nodecheck.report.model import Measurement
    from nodecheck.slurm import prolog

    calls = []

    def budget_runs_out(tail, timeout, env):
        calls.append((tail, timeout))
        time.sleep(min(timeout, 0.2))
        failed = Measurement.failed("bench", "bench", "nodecheck bench", "-", f"did not finish within {timeout:g} s")
        failed.details["timed_out"] = True
        return [failed]

    monkeypatch.setattr(plan, "run_in_subprocess", budget_runs_out)
    monkeypatch.setattr(prolog, "MIN_BENCH_S", 5.0)
    findings, details = prolog._bench_check(["h2d", "p2p"], Config(), {}, 5.1)
    assert [t for t, _ in calls] and calls[0][0][calls[0][0].index("--tests") + 1] == "h2d"
    assert float(calls[0][0][calls[0][0].index("--timeout") + 1]) > calls[0][1]  # only the budget stops a test
    (finding,) = findings
    assert finding.kind == "check_timed_out" and finding.severity == "warning" and "h2d, p2p" in finding.message
    assert failing_findings(findings, "error") == [] and {"test": "p2p", "skipped": True} in details


def test_a_bench_test_that_fails_in_time_is_still_an_error(monkeypatch):
    from nodecheck.bench import plan
    from nodecheck.config import Config
    from nodecheck.report.model import Measurement
    from nodecheck.slurm import prolog

    monkeypatch.setattr(plan, "run_in_subprocess", lambda tail, timeout, env: [
        Measurement.failed("gpu0:host", "h2d", "copy", "unidirectional", "RuntimeError: CUDA error: uncorrectable ECC error")])
    findings, _ = prolog._bench_check(["h2d"], Config(), {}, 30)
    (finding,) = findings
    assert finding.kind == "bench_failed" and finding.severity == "error"


def test_a_replayed_snapshot_reaches_no_other_node(tmp_path):
    """`prolog --from SNAPSHOT` judges the recorded node: the job's peers are not resolved or connected
    to (proximity goes through the host, and a snapshot host reaches no other node)."""
    from helpers import h100_node_snapshot

    from nodecheck.host.snapshot import PEERS_NOT_IN_SNAPSHOT, SnapshotHost

    snap = h100_node_snapshot(tmp_path / "h100")
    with pytest.raises(NoData, match="other nodes are not reached"):
        SnapshotHost(snap).resolve("peer1", 6818, 1.0)
    assert "snapshot" in PEERS_NOT_IN_SNAPSHOT
    run = run_nodecheck("prolog", "--dry-run", "--json", "--from", str(snap),
                        env_extra={"SLURM_JOB_NODELIST": "no-such-peer[1-3].invalid"})
    outcome = json.loads(run.stdout)
    proximity = {c["name"]: c for c in outcome["checks"]}["proximity"]
    assert proximity["details"] == [] and proximity["findings"] == [], proximity


def test_the_prolog_judges_its_bench_as_bench_does(tmp_path, monkeypatch):
    """The bench child hands back measurements only; the prolog judges them with verdicts.judge_measurements
    (the judgment behind with_measurements) against the node check's Report, so what NCCL chose (details.nccl) raises the nccl_* findings there too."""
    from helpers import hgx_h100_with_ndr

    from nodecheck.bench import plan
    from nodecheck.config import Config
    from nodecheck.report.model import Measurement
    from nodecheck.slurm import prolog

    report = hgx_h100_with_ndr(tmp_path)
    sockets = {"network": "Socket", "inter_node_transports": ["NET/Socket/0"]}
    monkeypatch.setattr(plan, "run_in_subprocess", lambda tail, timeout, env: [Measurement.measured(
        "allreduce:node-8-gpus", "allreduce", 380e9, 400e9, 1 << 30, "nccl", "busbw", {"nccl": sockets})])
    findings, details = prolog._bench_check(["allreduce"], Config(), {}, 30, report)
    assert [f.kind for f in findings] == ["nccl_socket_fallback"]
    assert details[0]["details"]["threshold"] == Config().threshold("allreduce", None, "busbw")[0]
    without_report, _ = prolog._bench_check(["allreduce"], Config(), {}, 30)  # the node check did not finish
    assert without_report == []  # no RDMA NIC known: sockets are no fallback


def test_the_bench_child_prints_measurements_only():
    """What `serve --bench-every` and the prolog run: no Report, no findings, nothing judged."""
    from helpers import nodecheck

    from nodecheck.bench.plan import run_in_subprocess

    (m,) = run_in_subprocess(["--tests", "h2d", "--timeout", "60"], 120)
    assert (m.test, m.ok) == ("h2d", False) and "no GPU" in m.error and "threshold" not in m.details
    run = nodecheck("bench", "--measure-only", "--tests", "h2d")
    document = json.loads(run.stdout)
    assert run.returncode == 0 and set(document) == {"schema", "measured_at", "measurements"}


def test_the_bench_tests_are_listed_once():
    from helpers import REPO

    listed = [p for p in (REPO / "src").rglob("*.py") if '"h2d", "d2h", "p2p", "allreduce"' in p.read_text()]
    assert [p.name for p in listed] == ["model.py"]


def test_a_gpu_that_fell_off_the_bus_drains_with_the_gpu_and_the_signal(tmp_path):
    """An 8-GPU node whose kernel log (as /dev/kmsg records it) holds gpu3's Xid 79: the prolog would drain it
    with the GPU and the signal in the reason."""
    snap = make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    (snap / "kmsg.txt").write_text("3,900,8312000001,-;NVRM: Xid (PCI:0000:48:00): 79, pid=1, GPU has fallen off the bus.\n")
    run = run_nodecheck("prolog", "--dry-run", "--json", "--from", str(snap))
    outcome = json.loads(run.stdout)
    assert (run.returncode, outcome["action"], outcome["detail"]) == (1, "drain", "nodecheck: gpu3 Xid 79 fallen off the bus"), outcome


def test_a_snapshot_judged_names_the_recorded_node_and_drains_nothing(tmp_path):
    """`prolog --dry-run --from SNAPSHOT` says it would drain the node the snapshot recorded (as `config check`
    names it), not the machine it runs on; without --dry-run a snapshot is refused: another machine's state never
    drains or resumes this one."""
    from helpers import hgx_nvml, make_snapshot

    nvml = hgx_nvml(inactive={3: [0, 1]})  # two NVLinks down: the prolog would drain
    snap = make_snapshot(tmp_path / "snap", nvml_gpus=nvml)
    (snap / "identity.json").write_text(json.dumps({"hostname": "gpu-17.cluster.example", "kernel": "6.8.0",
                                                     "machine": "x86_64", "nodecheck_version": "0.1.0"}))
    env = {"SLURMD_NODENAME": ""}  # as on a laptop: no slurmd names a node
    run = run_nodecheck("prolog", "--dry-run", "--from", str(snap), env_extra=env)
    would = [line for line in run.stdout.splitlines() if "would drain" in line]
    assert run.returncode == 1 and would and would[0].startswith("nodecheck prolog: would drain gpu-17: "), run.stdout
    assert json.loads(run_nodecheck("healthcheck", "--dry-run", "--json", "--from", str(snap), env_extra=env).stdout)["node"] == "gpu-17"
    named = run_nodecheck("prolog", "--dry-run", "--json", "--from", str(snap))  # slurmd's name, where it gives one
    assert json.loads(named.stdout)["node"] == "testnode"
    acted = run_nodecheck("prolog", "--from", str(snap), env_extra=env)
    assert acted.returncode == 2 and "add --dry-run" in acted.stderr and "drain" not in acted.stdout


def test_the_health_check_runs_idle_bench_on_an_idle_node_only_while_no_process_holds_a_gpu(tmp_path, monkeypatch):
    """[prolog] idle_bench: the GPU's own tests where they cost no job anything. A health check of an idle node runs
    them; of a node with a job, or of an idle node whose GPU a process holds (Slurm and NVML disagree), it does not,
    and says why at info: nothing drains for it."""
    from helpers import GIB, OUTSIDE
    from helpers import node as gpu_node

    from nodecheck.bench import plan
    from nodecheck.config import Config
    from nodecheck.report.model import Measurement
    from nodecheck.slurm import prolog

    asked = []

    def bench(tail, timeout, env):
        asked.append(tail[tail.index("--tests") + 1])
        return [Measurement.measured("gpu0:memory", "hbm", 1.2e12, 3.35e12, 1 << 30, "copy", "read+write",
                                     {"path_kind": "memory"})]
    monkeypatch.setattr(plan, "run_in_subprocess", bench)
    config = Config()
    config.prolog.idle_bench = ["hbm"]
    free = gpu_node(tmp_path, [], {})
    verdict = prolog.run_checks(free, config, {}, "n1", before_job=False, idle=True)
    assert asked == ["hbm"] and [f.kind for f in verdict.failing] == ["bandwidth_below_spec"]
    asked.clear()
    assert prolog.run_checks(free, config, {}, "n1", before_job=False, idle=False).failing == [] and asked == []
    held = gpu_node(tmp_path, [{"pid": 4242, "used_memory": 30 * GIB}], {4242: ("python3", "R", OUTSIDE)})
    verdict = prolog.run_checks(held, config, {}, "n1", before_job=False, idle=True)
    skipped = [f for f in verdict.findings if f.kind == "bench_skipped"]
    assert asked == [] and [f.severity for f in skipped] == ["info"]
    assert "[prolog] idle_bench (hbm) not run: gpu0 is held by pid 4242 python3 though Slurm says the node is idle" in skipped[0].message


def test_idle_bench_names_only_tests_bench_knows():
    from nodecheck.config import loads
    from nodecheck.core.errors import ConfigError

    assert loads('[prolog]\nidle_bench = ["hbm", "gemm"]\n', "c.toml").prolog.idle_bench == ["hbm", "gemm"]
    with pytest.raises(ConfigError, match="key 'prolog.idle_bench': unknown test 'burn'"):
        loads('[prolog]\nidle_bench = ["burn"]\n', "bad.toml")
