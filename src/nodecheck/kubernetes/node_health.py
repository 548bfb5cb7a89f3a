"""`serve --kubernetes-conditions` (issue 25): the Report's verdict where the scheduler and `kubectl describe node`
see it, through the pod's service account (src/nodecheck/kubernetes/api.py).

- **Conditions.** One per area of src/nodecheck/kubernetes/npd.py, named as deploy/kubernetes/npd-nodecheck.json names them
  (NodecheckGpuProblem, ...): True with the gravest failing finding's kind as reason and its message, False when
  the area's checks pass, Unknown when none could be made. One strategic-merge PATCH of nodes/NAME/status (merged
  by condition type: the kubelet's and NPD's conditions are left alone), sent when a status, reason or message
  changes and at least every heartbeat_s. lastTransitionTime moves only when the status does.
- **Events.** A Warning Event for each warning finding (at most every event_repeat_s per kind and subject, so
  that `kubectl get events` keeps it past the API server's one-hour event TTL), and one for each condition that
  turns True (Normal when it turns back), posted on the Node as the kubelet and NPD post theirs. A warning's
  Event has a name a restarted pod derives again (warning_event_name), so a rollout does not repost them.
- **Taint** (only with --kubernetes-taint): TAINT_KEY:NoSchedule while a condition is True, removed when none is.
  nodecheck reads the node's taints and writes them back with its own added or removed, conditional on the
  resourceVersion it read: it never removes or rewrites a taint it did not set, as it resumes only its own
  Slurm drains.

- **Device taints** (only with --kubernetes-device-taints, device_taints.py): a GPU's failing finding taints that
  GPU's DRA device instead; the node taint then covers only what no device taint speaks for.

RBAC (deploy/kubernetes/rbac.yaml, rbac-taint.yaml, rbac-device-taints.yaml): nodes/status patch and events create;
nodes patch for the taint; ResourceSlices list and DeviceTaintRules list, create, update, delete for device taints.
No get: the node is read from the answer to a PATCH that changes nothing."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Callable

from nodecheck.core.errors import NodecheckError
from nodecheck.core.typed_json import member
from nodecheck.kubernetes.api import ApiClient, ApiError
from nodecheck.kubernetes.device_taints import DeviceTaints
from nodecheck.kubernetes.npd import AREAS, AreaVerdict, area_verdict, fit
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

log = logging.getLogger("nodecheck.serve")

CONDITIONS = {"gpu": "NodecheckGpuProblem", "fabric": "NodecheckFabricProblem", "bandwidth": "NodecheckBandwidthProblem"}
TAINT_KEY, TAINT_EFFECT = "nodecheck/unhealthy", "NoSchedule"
EVENT_NAMESPACE = "default"  # where the kubelet and NPD post a Node's events
HEARTBEAT_S = 300.0
EVENT_REPEAT_S = 3600.0
MAX_EVENTS_PER_ROUND = 20
MAX_MESSAGE = 1024
STRATEGIC, MERGE = "application/strategic-merge-patch+json", "application/merge-patch+json"
TAINT_CONFLICT_RETRIES = 3
# what node-problem-detector writes with deploy/kubernetes/npd-nodecheck.json (its rules' reasons and its conditions'
# default messages; a test keeps them equal): serve writes neither, so seeing one means both publish the verdict
NPD_REASONS = frozenset(f"Nodecheck{area.capitalize()}Failing" for area in CONDITIONS)
NPD_MESSAGES = frozenset(("nodecheck finds no GPU problem", "nodecheck finds no NIC, fabric or path problem",
                          "nodecheck's bandwidth tests pass"))
SHARED_REPEAT_S = 3600.0


def reason_of(kind: str) -> str:
    """A finding kind as a Kubernetes reason: nvlink_inactive -> NvlinkInactive."""
    return "".join(part.capitalize() for part in kind.split("_"))


def condition(verdict: AreaVerdict) -> dict:
    """The area's node condition, without its times."""
    label = verdict.area.capitalize()
    if verdict.failing:
        status, reason = "True", reason_of(verdict.failing[0].kind)
    elif verdict.state == "unknown":
        status, reason = "Unknown", f"Nodecheck{label}Unknown"
    else:
        status, reason = "False", f"Nodecheck{label}Ok"
    return {"type": CONDITIONS[verdict.area], "status": status, "reason": reason, "message": verdict.line(MAX_MESSAGE, full=True)}


def conditions(report: Report, fail_severity: str) -> list[dict]:
    return [condition(area_verdict(report, area, fail_severity)) for area in AREAS]


def npd_written(known: dict[str, dict]) -> list[str]:
    """The nodecheck conditions the server holds as node-problem-detector's nodecheck plugin writes them."""
    return [f"{kind} (reason {c.get('reason')})" for kind, c in sorted(known.items())
            if kind in CONDITIONS.values() and (c.get("reason") in NPD_REASONS or c.get("message") in NPD_MESSAGES)]


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_patch(wanted: list[dict], known: dict[str, dict], now: str) -> dict:
    """The strategic-merge patch of nodes/NAME/status: each condition with its heartbeat now, and its transition
    time kept from what the server holds while the status stays."""
    out = []
    for c in wanted:
        before = known.get(c["type"], {})
        since = before.get("lastTransitionTime") if before.get("status") == c["status"] else None
        out.append({**c, "lastHeartbeatTime": now, "lastTransitionTime": since if isinstance(since, str) else now})
    return {"status": {"conditions": out}}


def event(node: str, uid: str | None, kind: str, reason: str, message: str, seconds: float, sequence: int,
          name: str | None = None) -> dict:
    """A core/v1 Event on the Node (involvedObject as the kubelet names its node), named as client-go names
    events, the object's name and a hex timestamp, unless `name` is given."""
    when = rfc3339(seconds)
    involved = {"apiVersion": "v1", "kind": "Node", "name": node, **({"uid": uid} if uid else {})}
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name or f"{node[:200]}.{int(seconds * 1e9) + sequence:x}", "namespace": EVENT_NAMESPACE},
            "involvedObject": involved, "reason": reason[:128], "message": fit(message, MAX_MESSAGE), "type": kind,
            "source": {"component": "nodecheck", "host": node}, "firstTimestamp": when, "lastTimestamp": when, "count": 1,
            "reportingComponent": "nodecheck", "reportingInstance": node[:128]}


def warning_event_name(node: str, finding: Finding, window: int, occurrence: int) -> str:
    """The same name for the same warning in the same repeat window and occurrence, whichever pod posts it: a
    restarted daemon's post of a warning its predecessor already posted is refused (409 AlreadyExists), so a
    rollout does not post every warning again."""
    digest = hashlib.sha256(f"{finding.kind}|{finding.subject}|{window}|{occurrence}".encode()).hexdigest()[:16]
    return f"{node[:200]}.nodecheck-{digest}"


def node_uid(node: dict) -> str | None:
    return member(member(node, "metadata", dict), "uid", str)


def node_conditions(node: dict) -> dict[str, dict]:
    """nodecheck's conditions in a Node, by type."""
    listed = member(member(node, "status", dict), "conditions", list) or []
    ours = set(CONDITIONS.values())
    return {c["type"]: c for c in listed if isinstance(member(c, "type", str), str) and c["type"] in ours}


def node_taints(node: dict) -> tuple[list, str | None]:
    """(the Node's taints, its resourceVersion)."""
    taints = member(member(node, "spec", dict), "taints", list) or []
    return taints, member(member(node, "metadata", dict), "resourceVersion", str)


def taints_with(taints: list, tainted: bool) -> list | None:
    """The node's taints with nodecheck's own added or removed, every other one as it was; None when nothing
    changes."""
    others = [t for t in taints if not (isinstance(t, dict) and t.get("key") == TAINT_KEY)]
    mine = [t for t in taints if isinstance(t, dict) and t.get("key") == TAINT_KEY]
    if tainted and mine != [{"key": TAINT_KEY, "effect": TAINT_EFFECT}]:
        return [*others, {"key": TAINT_KEY, "effect": TAINT_EFFECT}]
    if not tainted and mine:
        return others
    return None


class NodeHealth:
    """Publishes one Report's verdict on the Node; sync() raises ApiError, follow() logs it and tries again."""

    def __init__(self, api: ApiClient, node: str, fail_severity: str = "error", taint: bool = False,
                 heartbeat_s: float = HEARTBEAT_S, event_repeat_s: float = EVENT_REPEAT_S,
                 clock: Callable[[], float] = time.time, device_taints: DeviceTaints | None = None) -> None:
        self.api, self.node, self.fail_severity, self.taint = api, node, fail_severity, taint
        self.device_taints = device_taints  # per GPU, by DRA DeviceTaintRules (device_taints.py); None: off
        self.heartbeat_s, self.event_repeat_s, self.clock = heartbeat_s, event_repeat_s, clock
        self.uid: str | None = None
        self.known: dict[str, dict] | None = None  # our conditions as the server last answered them
        self.patched_at = float("-inf")
        self.tainted: bool | None = None  # as last written or read; None: not known
        self.taint_checked_at = float("-inf")
        self.posted: dict[tuple[str, str], float] = {}  # (kind, subject) of a warning -> when its Event was posted
        self.returns: dict[tuple[str, str], int] = {}  # (kind, subject) -> how often it went away and came back
        # transition Events not yet accepted: the status PATCH that made them landed, so the next round, which
        # reads the new status, would not see the transition again; each retried as it was (a retry of one that
        # had landed is refused by name)
        self.pending: list[dict] = []
        self.sequence = 0
        self.shared_said = float("-inf")  # when the conditions were last seen written by NPD too, and said
        self.published_at: float | None = None  # when a round last reached the API server (wall clock)
        self._latest: Report | None = None
        self._lock = threading.Lock()
        self._new = threading.Event()
        self._metrics = b""  # what serve appends to /metrics: nothing until the first attempt

    # -- one round
    def sync(self, report: Report) -> None:
        now = self.clock()
        verdicts = [area_verdict(report, area, self.fail_severity) for area in AREAS]
        wanted = [condition(verdict) for verdict in verdicts]
        beat = now - self.patched_at >= self.heartbeat_s
        if self.known is None or beat:  # at the heartbeat too: another writer's conditions show only when read
            self._learn(self.api.request("PATCH", self._status_path(), {}, STRATEGIC))
            self._another_writer(now)
        before = self.known  # _learn below replaces self.known: this stays what the server held
        if self._differs(wanted, before) or beat:
            patch = status_patch(wanted, before, rfc3339(now))
            self._learn(self.api.request("PATCH", self._status_path(), patch, STRATEGIC))
            self.patched_at = now
            self._transition_events(wanted, before, now)
        covered, device_error = self._device_taints(report, now)
        self._post_pending()
        self._warning_events(report, now)
        if self.taint:  # what a device taint speaks for is not the node's (issue 53); the rest still is
            self._reconcile_taint(any((f.kind, f.subject) not in covered for v in verdicts for f in v.failing), now)
        if device_error is not None:
            raise device_error

    def _device_taints(self, report: Report, now: float) -> tuple[set[tuple[str, str]], ApiError | None]:
        """The findings device taints speak for, and the error that stopped them: then they speak for none, so
        that the node taint (with --kubernetes-taint) covers a GPU whose rule could not be written."""
        if self.device_taints is None:
            return set(), None
        try:
            outcome = self.device_taints.sync(report, now)
        except ApiError as error:
            return set(), error
        for kind, reason, message in outcome.events:
            self._queue(kind, reason, message, now)
        return outcome.covered, None

    def _status_path(self) -> str:
        return f"/api/v1/nodes/{self.node}/status"

    def _learn(self, node: dict) -> None:
        self.uid = node_uid(node) or self.uid
        self.known = node_conditions(node)

    def _another_writer(self, now: float) -> None:
        """node-problem-detector's nodecheck plugin writing the same conditions: the two overwrite each other (and
        every flip is a transition Event), so say so, in the log and as a Warning Event on the Node, hourly."""
        seen = npd_written(self.known or {})
        if not seen or now - self.shared_said < SHARED_REPEAT_S:
            return
        message = (f"node-problem-detector's nodecheck plugin writes these conditions too: {', '.join(seen)}; the two "
                   "overwrite each other: run one of them (docs/kubernetes.md)")
        log.warning("node %s: %s", self.node, message)
        self.shared_said = now
        self._queue("Warning", "NodecheckConditionsShared", message, now)

    @staticmethod
    def _differs(wanted: list[dict], known: dict[str, dict]) -> bool:
        fields = ("status", "reason", "message")
        return any(tuple(known.get(c["type"], {}).get(f) for f in fields) != tuple(c[f] for f in fields) for c in wanted)

    def _event(self, kind: str, reason: str, message: str, now: float, name: str | None = None) -> dict:
        self.sequence += 1
        return event(self.node, self.uid, kind, reason, message, now, self.sequence, name)

    def _send(self, body: dict) -> None:
        try:
            self.api.request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body)
        except ApiError as error:
            if error.status != 409:  # AlreadyExists: a retry whose first try had landed, or a predecessor's post
                raise

    def _transition_events(self, wanted: list[dict], before: dict[str, dict], now: float) -> None:
        for c in wanted:
            was = before.get(c["type"], {}).get("status")
            if c["status"] == "True" and was != "True":
                self._queue("Warning", c["type"], c["message"], now)
            elif c["status"] == "False" and was == "True":
                self._queue("Normal", c["reason"], c["message"], now)

    def _queue(self, kind: str, reason: str, message: str, now: float) -> None:
        self.pending.append(self._event(kind, reason, message, now))
        if len(self.pending) > MAX_EVENTS_PER_ROUND:  # an API server that refuses every Event: keep the newest
            log.warning("node %s: %d transition Event(s) dropped, never accepted", self.node, len(self.pending) - MAX_EVENTS_PER_ROUND)
            del self.pending[:-MAX_EVENTS_PER_ROUND]

    def _post_pending(self) -> None:
        while self.pending:
            self._send(self.pending[0])
            self.pending.pop(0)

    def _warning_events(self, report: Report, now: float) -> None:
        warnings: list[Finding] = [f for f in report.findings if f.severity == "warning"]
        current = {(f.kind, f.subject) for f in warnings}
        for gone in set(self.posted) - current:  # gone: a return posts again, under a name of its own
            self.returns[gone] = self.returns.get(gone, 0) + 1
        self.posted = {key: at for key, at in self.posted.items() if key in current}
        due = [f for f in warnings if now - self.posted.get((f.kind, f.subject), float("-inf")) >= self.event_repeat_s]
        for finding in due[:MAX_EVENTS_PER_ROUND]:
            key = (finding.kind, finding.subject)
            name = warning_event_name(self.node, finding, int(now // self.event_repeat_s), self.returns.get(key, 0))
            self._send(self._event("Warning", reason_of(finding.kind), finding.message, now, name))
            self.posted[key] = now

    def _reconcile_taint(self, tainted: bool, now: float) -> None:
        """Read the taints (when the wanted state is not what was last written, or a heartbeat has passed: an
        admin may have lifted it), and write them back with nodecheck's own changed, conditional on the
        resourceVersion read; a write that lost a race reads again."""
        if tainted == self.tainted and now - self.taint_checked_at < self.heartbeat_s:
            return
        path = f"/api/v1/nodes/{self.node}"
        for _ in range(TAINT_CONFLICT_RETRIES):
            taints, version = node_taints(self.api.request("PATCH", path, {}, MERGE))
            changed = taints_with(taints, tainted)
            try:
                if changed is not None:
                    self.api.request("PATCH", path, {"metadata": {"resourceVersion": version}, "spec": {"taints": changed}}, MERGE)
                    log.info("%s taint %s:%s on node %s", "set" if tainted else "removed", TAINT_KEY, TAINT_EFFECT, self.node)
            except ApiError as error:
                if error.status == 409:  # the node changed since it was read
                    continue
                raise
            self.tainted, self.taint_checked_at = tainted, now
            return
        raise ApiError(409, f"node {self.node}: its taints kept changing under {TAINT_CONFLICT_RETRIES} tries")

    # -- the daemon's side
    def offer(self, report: Report) -> None:
        """The latest judged Report (serve's publisher calls this): taken by follow() in its own thread, so that
        a slow API server never holds a probe round or a scrape."""
        with self._lock:
            self._latest = report
        self._new.set()

    def follow(self, stop: threading.Event, repeat_s: float = 600.0) -> None:
        """Sync each new Report, and again at the heartbeat; a failure is logged (again at most every repeat_s)
        and forgets what the server held, so that the next round reads it afresh."""
        self.api.wait = stop.wait  # the daemon's stop (SIGTERM) ends a request's retries too
        failing, said = False, float("-inf")
        while not stop.is_set():
            self._new.wait(self.heartbeat_s)
            self._new.clear()
            with self._lock:
                report = self._latest
            if report is None or stop.is_set():
                continue
            try:
                self.sync(report)
            except Exception as error:  # noqa: BLE001 - an API error, or a bug: either way metrics keep being served
                if not isinstance(error, NodecheckError):
                    log.exception("node %s: publishing the conditions failed", self.node)
                self.known, self.tainted = None, None
                if self.device_taints is not None:
                    self.device_taints.held = None
                self.record_round(False)
                now = time.monotonic()
                if not failing or now - said >= repeat_s:
                    log.warning("node %s: Kubernetes conditions not published: %s", self.node, error)
                    said = now
                failing = True
                continue
            self.record_round(True)
            if failing:
                log.info("node %s: Kubernetes conditions published again", self.node)
                failing = False

    def record_round(self, success: bool) -> None:
        """The series serve appends to /metrics, after a round that reached the API server (or did not)."""
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import GaugeMetricFamily

        if success:
            self.published_at = time.time()
        families = [GaugeMetricFamily("nodecheck_kubernetes_publish_success",
                                      "1 when the last round's node conditions (and taint) reached the API server, 0 when not",
                                      value=1.0 if success else 0.0)]
        if self.published_at is not None:
            families.append(GaugeMetricFamily("nodecheck_kubernetes_publish_last_success_timestamp_seconds",
                                              "when the node conditions last reached the API server", value=self.published_at))
        if self.device_taints is not None:
            families.extend(self.device_taints.families())
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(families))
        body = generate_latest(registry)
        with self._lock:
            self._metrics = body

    def exposition(self) -> bytes:
        """The publisher's own series, appended to the Report's by serve's /metrics (docs/metrics.md)."""
        with self._lock:
            return self._metrics


class _Families:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self):
        return iter(self.families)
