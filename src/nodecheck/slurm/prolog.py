"""`nodecheck prolog` and `nodecheck healthcheck`: the quick checks under one hard time budget, then
what Slurm should do about this node.

Checks (concurrent, each bounded by the budget; one that does not finish is named as timed out):
  node       the probes and static rules (GPU count, PCIe width, NVLinks, link types, NIC state and speed);
             the prolog, and the health check of an idle node: the processes holding a GPU (src/nodecheck/checks/gpu_processes.py)
  proximity  the job's peers: same subnet on the traffic interface, round trip (prolog only)
  bench      the quick bandwidth tests listed in [prolog] bench, in a subprocess (none by default;
             prolog only: the health check runs every few minutes, under running jobs too)

Failing = a finding at or above thresholds.fail_severity; a probe that hung is an error.
The drain reason starts with `nodecheck:` and names the check and its figure; the health check
resumes only nodes whose drain reason starts so (never an admin's drain).
"""

from __future__ import annotations

import socket
import time
from dataclasses import asdict, dataclass, field

from nodecheck.checks import headline
from nodecheck.core.errors import NoData, NodecheckError
from nodecheck.host.commands import run_until
from nodecheck.report.findings import SEVERITIES, Finding, at_or_above, one_line
from nodecheck.slurm.scontrol import MAX_REASON, REASON_PREFIX, NodeState

SCONTROL_SHARE = 0.2  # of the budget, kept back from the checks for the drain or resume call

# slurm's prolog and job environment: what launches a distributed run, kept from the bench subprocess
_DISTRIBUTED_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS")


@dataclass
class CheckRun:
    name: str
    seconds: float
    timed_out: bool
    findings: list[Finding] = field(default_factory=list)
    details: list[dict] = field(default_factory=list)  # proximity: one per peer; bench: the measurements


@dataclass
class Verdict:
    node: str
    checks: list[CheckRun]
    findings: list[Finding]
    failing: list[Finding]

    @property
    def passed(self) -> bool:
        return not self.failing

    def reason(self) -> str:
        return drain_reason(self.failing)


def skip_reason(environ: dict[str, str], prolog) -> str | None:
    """Why this job skips the prolog: its partition is listed, or its comment carries the skip word."""
    partition = environ.get("SLURM_JOB_PARTITION")
    if partition and partition in prolog.skip_partitions:
        return f"partition {partition} is in [prolog] skip_partitions"
    if prolog.skip_comment and prolog.skip_comment in environ.get("SLURM_JOB_COMMENT", ""):
        return f"job comment contains {prolog.skip_comment!r}"
    return None


def drain_reason(failing: list[Finding]) -> str:
    """`nodecheck: gpu3 PCIe x8 < x16 (+2 more)`: the first failing check and its figure."""
    if not failing:
        return ""
    text = one_line(headline(failing[0]))  # names from sources nodecheck does not control
    more = f" (+{len(failing) - 1} more)" if len(failing) > 1 else ""
    reason = f"{REASON_PREFIX} {text}"
    return reason[: MAX_REASON - len(more)] + more


def failing_findings(findings: list[Finding], fail_severity: str) -> list[Finding]:
    """What fails the checks, gravest first (the drain reason names the first)."""
    return sorted(at_or_above(findings, fail_severity), key=lambda f: -SEVERITIES.index(f.severity))


def run_checks(host, config, environ: dict[str, str], node: str, before_job: bool = True,
               deadline: float | None = None, idle: bool = False) -> Verdict:
    """Every check by `deadline` (default: config.prolog.timeout_s from now). The node and proximity
    checks run together; the bandwidth tests (when configured and before_job: the prolog's) get what is left of the
    budget afterwards. before_job, or `idle` (a health check of a node Slurm says runs no job), also judges the
    processes holding the GPUs (src/nodecheck/checks/gpu_processes.py)."""
    deadline = deadline if deadline is not None else time.monotonic() + config.prolog.timeout_s
    budget = max(0.0, deadline - time.monotonic())
    # the prolog's tests before a job; the health check's [prolog] idle_bench on a node Slurm says is idle, where
    # they cost no job anything (as operators schedule DCGM's diagnostic on free nodes)
    bench = list(config.prolog.bench) if before_job else list(config.prolog.idle_bench) if idle else []
    first_deadline = deadline - (budget / 2 if bench else 0)
    first_share = first_deadline - time.monotonic()
    # a check that runs out of time is as grave as the findings it could have made, no graver:
    # proximity findings are warnings by default, so its time-out is too (it must never drain a node)
    built: dict = {}  # the node check's Report: the bench's measurements are judged against it
    job = environ.get("SLURM_JOB_ID", "")
    job_id = int(job) if before_job and job.isascii() and job.isdigit() and len(job) < 13 else None
    checks = {"node": (lambda: _node_check(host, config, first_share, built, before_job or idle, job_id), "error"),
              "proximity": (lambda: _proximity_check(host, environ, config, node, first_share), config.proximity.severity)}
    runs = _run_bounded(checks, first_deadline)
    held = idle and not before_job and _held_gpus(built.get("report"))
    if bench and held:  # Slurm says idle, NVML says otherwise: the node is someone's, its tests wait for another round
        runs.append(CheckRun("bench", 0.0, False, [Finding(
            "bench_skipped", "info", "bench", "not run", "an idle node",
            f"[prolog] idle_bench ({', '.join(bench)}) not run: {held} though Slurm says the node is idle")]))
    elif bench:
        remaining = deadline - time.monotonic()
        runs += _run_bounded({"bench": (lambda: _bench_check(bench, config, environ, remaining, built.get("report"), built),
                                        "warning")}, deadline)
    findings = _joined([f for run in runs for f in run.findings], runs, built)
    return Verdict(node, runs, findings, failing_findings(findings, config.fail_severity))


def _held_gpus(report) -> str:
    """"gpu3 is held by pid 4242 python (job 17)" for the first GPU a process other than nodecheck's holds; ""
    for none (or no Report: the node check did not finish, and the bench's own workers skip what is held)."""
    from nodecheck.bench.gpu_itself import holders

    for gpu in report.gpus if report is not None else []:
        if held := holders(gpu):
            return f"gpu{gpu.index} is held by {', '.join(held[:3])}"
    return ""


def _joined(findings: list[Finding], runs: list[CheckRun], built: dict) -> list[Finding]:
    """The node check's error signals joined to the bench check's verdicts (src/nodecheck/verdicts/signal_join.py), in every
    check's own list too."""
    from nodecheck.verdicts.signal_join import joined

    if not built.get("measurements") or built.get("report") is None:
        return findings
    joined_findings = joined(built["report"], built["measurements"], findings)
    replaced = {id(old): new for old, new in zip(findings, joined_findings, strict=True)}
    for run in runs:
        run.findings = [replaced.get(id(f), f) for f in run.findings]
    return joined_findings


def _run_bounded(checks: dict, deadline: float) -> list[CheckRun]:
    """Each check (name -> (function returning findings and details, severity of its time-out)) in a
    daemon thread; one still running at the deadline is abandoned and named. Durations are each
    check's own, from its start."""
    def timed(check) -> tuple:
        started = time.monotonic()
        try:
            value, error = check(), None
        except NodecheckError as failure:
            value, error = None, failure
        except Exception as failure:  # a bug in a check must not cost the verdict of the others
            value, error = None, NodecheckError(f"internal error: {type(failure).__name__}: {failure}")
        return value, error, time.monotonic() - started

    launched = time.monotonic()
    results = run_until({name: (lambda c=check: timed(c)) for name, (check, _) in checks.items()}, deadline,
                        workers=max(1, len(checks)))
    runs = []
    for name in checks:
        if not isinstance(results.get(name), tuple):
            allowed = f"{round(deadline - launched, 1):g} s"
            seconds = round(time.monotonic() - launched, 3)
            runs.append(CheckRun(name, seconds, True, [Finding("check_timed_out", checks[name][1], name, "timed out", allowed,
                                                               f"check {name} did not finish within {allowed} ([prolog] timeout_s)")]))
            continue
        value, error, seconds = results[name]
        if error is not None:
            value = ([Finding("check_failed", "error", name, "failed", "completed", f"check {name} failed: {error}")], [])
        runs.append(CheckRun(name, round(seconds, 3), False, *value))
    return runs


def _node_check(host, config, share: float, built: dict, processes: bool = False, job: int | None = None):
    """The Report's findings; with `processes`, those of the processes holding the GPUs too, before `job` (the
    prolog's SLURM_JOB_ID; None where there is none)."""
    from nodecheck.checks.gpu_processes import before_job
    from nodecheck.pipeline import build_report

    # probes get most of the share, so a hung source is named by its probe rather than by the check
    report = build_report(host, config, probe_timeout=max(1.0, share * 0.8))
    built["report"] = report
    held = before_job(report, job, config.prolog.gpu_process_allow) if processes else []
    return report.findings + held, []


def _proximity_check(host, environ: dict[str, str], config, node: str, share: float):
    from nodecheck.slurm.proximity import collect_peers, expand_nodelist, judge_peers

    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")  # the prolog gets the latter
    if not nodelist:
        return [], []
    local = {node, socket.gethostname().split(".")[0]}
    try:
        names = expand_nodelist(nodelist)
    except NodecheckError as error:  # a list nodecheck refuses says nothing against this node: [proximity] severity
        return [Finding("check_failed", config.proximity.severity, "proximity", "failed", "completed",
                        f"check proximity failed: {error}")], []
    try:
        peers = collect_peers(host, names, local, config.proximity, max(0.5, share * 0.8))
    except NoData:  # a replayed snapshot reaches no other node
        return [], []
    return judge_peers(peers, config.proximity), [asdict(p) for p in peers]


MIN_BENCH_S = 5.0  # below this much budget left, a bandwidth test is skipped rather than started


def _bench_check(tests: list[str], config, environ: dict[str, str], share: float, report=None, built: dict | None = None):
    """The prolog's bandwidth tests, one at a time within `share` seconds, judged as `bench` judges them
    (verdicts.judge_measurements) against the node check's Report (an empty one when that check did not
    finish). A test that does not fit in what is left (not started, or stopped at the budget's end) is
    skipped and named at warning: running out of time says nothing against the node, so it never drains it."""
    from nodecheck.bench.plan import run_in_subprocess
    from nodecheck.report.model import Report
    from nodecheck.verdicts.bandwidth import judge_measurements

    deadline = time.monotonic() + share
    env = {k: v for k, v in environ.items() if k not in _DISTRIBUTED_VARS}  # in this node only
    measurements, skipped = [], []
    for test in tests:
        left = deadline - time.monotonic()
        if left < MIN_BENCH_S:
            skipped.append(test)
            continue
        # the test's own --timeout lies past the budget: only the budget stops it, and that is a skip
        tail = ["--quick", "--tests", test, "--timeout", f"{2 * left:g}"] + (["--config", config.path] if config.path else [])
        results = run_in_subprocess(tail, left * 0.95, env)
        if any(m.details.get("timed_out") for m in results):
            skipped.append(test)
        else:
            measurements += results
    report = report or Report.from_dict({})  # a Report of nothing
    measurements, findings = judge_measurements(report, measurements, config)  # the node check counted the Report's own
    if built is not None:
        built["measurements"] = measurements  # for the error signals' join with these verdicts
    if skipped:
        findings.append(Finding("check_timed_out", "warning", "bench", f"{len(skipped)} skipped", "every test",
                                f"bench: {', '.join(skipped)} did not fit in what was left of [prolog] timeout_s: "
                                "skipped, not judged (raise timeout_s or list fewer tests in [prolog] bench)"))
    return findings, [asdict(m) for m in measurements] + [{"test": t, "skipped": True} for t in skipped]


def plan_action(verdict: Verdict, state: NodeState | None, healthcheck: bool) -> tuple[str, str | None]:
    """("drain", reason), ("resume", None) or ("none", why). The prolog drains on failure; the health
    check also resumes a node it drained, and never touches an admin's drain."""
    if not verdict.passed:
        if state is not None and state.drained and not state.drained_by_nodecheck:
            return "none", f"already drained by someone else ({state.reason}); their reason is kept"
        if state is not None and state.drained_by_nodecheck and state.reason == verdict.reason():
            return "none", "already drained for this reason"
        return "drain", verdict.reason()
    if healthcheck and state is not None and state.drained_by_nodecheck:
        return "resume", None
    if healthcheck and state is not None and state.drained:
        return "none", f"drained by someone else ({state.reason}): left drained"
    return "none", "checks passed"


@dataclass
class Outcome:
    verdict: Verdict | None
    action: str  # drain, resume, none, skip
    detail: str | None  # the drain reason, or why nothing was done
    done: bool  # scontrol was called and succeeded (False under --dry-run)
    error: str | None = None  # scontrol or the config failed: said here, exit code 1
    slurm_error: str | None = None  # Slurm could not be asked the node's state (not configured here): exit code 2

    def to_dict(self) -> dict:
        verdict = self.verdict
        return {"schema": "nodecheck.prolog", "schema_version": 1, "node": verdict.node if verdict else None,
                "passed": verdict.passed if verdict else False, "action": self.action, "detail": self.detail,
                "done": self.done, "error": self.error, "slurm_error": self.slurm_error,
                "checks": [asdict(c) for c in verdict.checks] if verdict else [],
                "failing": [asdict(f) for f in verdict.failing] if verdict else []}


def execute(mode: str, host, config, environ: dict[str, str], dry_run: bool, recorded: str | None = None) -> Outcome:
    """mode "prolog" or "healthcheck": run the checks, decide, and (unless dry_run) call scontrol.
    All of it within [prolog] timeout_s: the checks end early enough to leave scontrol its time. `recorded`: the
    host name a snapshot recorded, the node judged unless the config or $SLURMD_NODENAME names another."""
    from nodecheck.slurm.scontrol import Scontrol, node_name

    deadline = time.monotonic() + config.prolog.timeout_s
    node = node_name(config.slurm.node_name, recorded)
    if mode == "prolog":
        why = skip_reason(environ, config.prolog)
        if why:
            return Outcome(None, "skip", why, False)
    scontrol_share = min(config.slurm.scontrol_timeout_s, config.prolog.timeout_s * SCONTROL_SHARE)

    def scontrol() -> Scontrol:  # never past the budget's end
        return Scontrol(config.slurm.conf, max(0.5, min(config.slurm.scontrol_timeout_s, deadline - time.monotonic())))

    state, slurm_error = None, None
    if mode == "healthcheck":
        try:
            state = Scontrol(config.slurm.conf, scontrol_share).node(node)
        except NodecheckError as error:  # the checks still run and are shown; nothing is resumed blind
            slurm_error = f"cannot read node {node}'s state from Slurm: {error}"
    # bandwidth tests in the prolog; in a health check ([prolog] idle_bench) only where Slurm says the node is idle
    # an idle node's GPU processes are judged by the health check too: it neither resumes a node the prolog drained
    # for one nor waits for the next job to find it
    verdict = run_checks(host, config, environ, node, before_job=mode == "prolog", deadline=deadline - scontrol_share,
                         idle=state is not None and state.idle)
    action, detail = plan_action(verdict, state, mode == "healthcheck")
    if slurm_error and action == "none":
        detail = f"{detail}; the node's Slurm state is unknown, so nothing is resumed"
    return _apply(scontrol(), Outcome(verdict, action, detail, False, slurm_error=slurm_error), node, dry_run)


def config_failure(config_error: str, dry_run: bool) -> Outcome:
    """A broken config: the node cannot be checked, so it is drained saying why (the health check
    resumes it once the config is fixed and the checks pass). Slurm settings: the defaults."""
    from nodecheck.config import SlurmSettings
    from nodecheck.slurm.scontrol import Scontrol, node_name

    slurm = SlurmSettings()
    node = node_name(slurm.node_name)
    reason = one_line(f"{REASON_PREFIX} config error: {config_error}")[:MAX_REASON]  # a key may hold a newline
    verdict = Verdict(node, [], [], [Finding("check_failed", "error", "config", "invalid", "valid", config_error)])
    return _apply(Scontrol(slurm.conf, slurm.scontrol_timeout_s), Outcome(verdict, "drain", reason, False), node, dry_run)


def _apply(scontrol, outcome: Outcome, node: str, dry_run: bool) -> Outcome:
    if dry_run or outcome.action not in ("drain", "resume"):
        return outcome
    try:
        if outcome.action == "drain":
            scontrol.drain(node, outcome.detail)
        else:
            scontrol.resume(node)
        outcome.done = True
    except NodecheckError as error:
        outcome.error = f"scontrol {outcome.action} {node} failed: {error}"
    return outcome
