"""`serve --kubernetes-device-taints` (issue 53): a GPU with a failing finding is taken from the scheduler by a
DRA DeviceTaintRule selecting exactly its device, so that a node with one bad GPU still runs pods on the other
seven (KEP-5055; its user story is an external health monitor tainting devices). The rules are in
device_taint_rules.py; this module holds them on the API server, in serve's Kubernetes thread (node_health.py).

- **Which device.** The node's ResourceSlices (`GET .../resourceslices?fieldSelector=spec.nodeName=NODE`, read as
  untrusted input) map each GPU to its device by UUID, else PCI address (resource_slices.py). Read again whenever
  the failing GPUs change and at every heartbeat: a restarted DRA driver publishes a new pool generation.
- **Only its own.** nodecheck lists the rules labelled with its name and this node, creates the ones missing,
  replaces (conditional on the resourceVersion read) those that differ, and deletes those no finding asks for any
  more. It never touches another rule. A rule deleted by hand while the fault lasts comes back at the heartbeat.
- **Which version.** resource.k8s.io v1 (Kubernetes 1.37), else v1beta2 (1.36), else v1alpha3 (1.33, behind the
  DRADeviceTaints gate): the first the server serves (404 for the others). None served, or no slice listing a
  GPU, or more failing GPUs than the share allowed (the rules held are kept, none is added): said in the log and
  an Event, and the node acts for those GPUs as before."""

from __future__ import annotations

import logging
import urllib.parse
from dataclasses import dataclass, field

from nodecheck.core.pci import normal_pci
from nodecheck.kubernetes.api import ApiClient, ApiError
from nodecheck.kubernetes.device_taint_rules import (
    EFFECTS,
    GROUP,
    Held,
    Rule,
    gpu_of,
    held_rules,
    owner_selector,
    plan,
    rule_object,
    same,
)
from nodecheck.kubernetes.resource_slices import DeviceMap, map_gpus, slice_devices
from nodecheck.report.findings import at_or_above
from nodecheck.report.model import Report

log = logging.getLogger("nodecheck.serve")

RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
SLICE_VERSIONS = ("v1", "v1beta2", "v1beta1")
CONFLICT_RETRIES = 3
DEFAULT_MAX_SHARE = 0.5


@dataclass
class Outcome:
    covered: set[tuple[str, str]] = field(default_factory=set)  # (kind, subject) the device taints speak for
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message) to post on the Node


def unlisted_gpus(report: Report) -> frozenset[str]:
    """The GPUs the NVIDIA driver manages (/proc/driver/nvidia/gpus) at addresses NVML lists no GPU at: fallen off
    the bus, say, whose Xid names the address."""
    listed = {normal_pci(g.pci_bus_id) for g in report.gpus}
    return frozenset(a for a in map(normal_pci, report.driver_gpus or []) if a and a not in listed)


class DeviceTaints:
    def __init__(self, api: ApiClient, node: str, fail_severity: str = "error", effect: str = "NoSchedule",
                 max_share: float = DEFAULT_MAX_SHARE, heartbeat_s: float = 300.0) -> None:
        if effect not in EFFECTS:
            raise ValueError(f"effect {effect!r}: one of {', '.join(EFFECTS)}")
        self.api, self.node, self.fail_severity, self.effect = api, node, fail_severity, effect
        self.max_share, self.heartbeat_s = max_share, heartbeat_s
        self.versions: dict[str, str | None] = {}  # resource -> the version the server serves (None: none)
        self.held: set[str] | None = None  # the names of this node's rules as last written; None: read again
        self.asked: frozenset | None = None  # the failing (GPU, kind) pairs last reconciled
        self.checked_at = float("-inf")
        self.covered: set[tuple[str, str]] = set()
        self.notes: tuple[str, ...] = ()
        self.withheld = 0  # GPUs with a failing finding that no rule speaks for

    # -- one round
    def sync(self, report: Report, now: float) -> Outcome:
        addresses = unlisted_gpus(report)
        asked = frozenset((gpu_of(f.subject, addresses), f.kind) for f in at_or_above(report.findings, self.fail_severity)
                          if gpu_of(f.subject, addresses) is not None)
        if asked == self.asked and self.held is not None and now - self.checked_at < self.heartbeat_s:
            return Outcome(set(self.covered))
        outcome, self.held = Outcome(), None  # until this round is done: a failed one reads again
        held = self._list()
        devices = self._devices(report, addresses) if asked else DeviceMap()
        already = frozenset(h.gpu for h in (held or {}).values() if h.gpu)
        wanted = plan(self.node, report.findings, self.fail_severity, devices, len(report.gpus) + len(addresses),
                      self.max_share, addresses, already)
        notes = list(wanted.notes)
        if held is None:  # no DeviceTaintRule API: nothing of nodecheck's can be there either
            if wanted.rules:
                notes.append("the API server serves no DeviceTaintRule (resource.k8s.io v1, v1beta2 or v1alpha3): "
                             "the node acts for its GPUs")
            wanted.covered, self.held = set(), set()
        else:
            outcome.events.extend(self._reconcile(wanted.rules, held))
        self.covered, self.asked, self.checked_at = set(wanted.covered), asked, now
        self.withheld = len({g for g, _ in asked} - {gpu_of(s, addresses) for _, s in wanted.covered})
        self._say(tuple(notes), outcome)
        outcome.covered = set(self.covered)
        return outcome

    def _get(self, resource: str, versions: tuple[str, ...], query: dict) -> dict | None:
        """A list of resource.k8s.io's `resource` in the first of `versions` the server serves (a 404 for the
        others, found once); None when it serves none."""
        tried = (self.versions[resource],) if resource in self.versions else versions
        for version in tried:
            if version is None:
                return None
            try:
                answer = self.api.request("GET", f"/apis/{GROUP}/{version}/{resource}?{urllib.parse.urlencode(query)}")
            except ApiError as error:
                if error.status == 404 and resource not in self.versions:
                    continue
                raise
            self.versions[resource] = version
            return answer
        self.versions[resource] = None
        return None

    def _devices(self, report: Report, addresses: frozenset[str]) -> DeviceMap:
        answer = self._get("resourceslices", SLICE_VERSIONS, {"fieldSelector": f"spec.nodeName={self.node}"})
        if answer is None:
            return DeviceMap(notes=["the API server serves no ResourceSlice (no DRA): the node acts for its GPUs"],
                             unmatched=[f"gpu{g.index}" for g in report.gpus])
        devices, notes = slice_devices(answer, self.node)
        if not devices:
            notes.append(f"no ResourceSlice lists a device of node {self.node} (no DRA driver here?)")
        gpus = [(f"gpu{g.index}", g.uuid, g.pci_bus_id) for g in report.gpus]
        mapped = map_gpus(devices, gpus + [(f"pci:{address}", None, address) for address in sorted(addresses)])
        mapped.notes[:0] = notes
        return mapped

    def _path(self, name: str | None = None) -> str:
        base = f"/apis/{GROUP}/{self.versions['devicetaintrules']}/devicetaintrules"
        return base if name is None else f"{base}/{urllib.parse.quote(name, safe='')}"

    def _list(self) -> dict[str, Held] | None:
        """This node's rules as the server holds them; None when it serves no DeviceTaintRule."""
        answer = self._get("devicetaintrules", RULE_VERSIONS, {"labelSelector": owner_selector(self.node)})
        if answer is None:
            return None
        held, notes = held_rules(answer, self.node)
        for note in notes:
            log.warning("node %s: %s", self.node, note)
        return held

    def _reconcile(self, rules: list[Rule], held: dict[str, Held]) -> list[tuple[str, str, str]]:
        """Make the server hold exactly `rules` of this node's; a write that lost a race (409) reads again."""
        events: list[tuple[str, str, str]] = []
        for attempt in range(CONFLICT_RETRIES):
            if attempt:
                held = self._list() or {}
            try:
                events.extend(self._apply(rules, held))
            except ApiError as error:
                if error.status == 409:
                    continue
                raise
            self.held = {rule.name for rule in rules}
            return events
        raise ApiError(409, f"node {self.node}: its DeviceTaintRules kept changing under {CONFLICT_RETRIES} tries")

    def _apply(self, rules: list[Rule], held: dict[str, Held]) -> list[tuple[str, str, str]]:
        version = self.versions["devicetaintrules"]
        events: list[tuple[str, str, str]] = []
        tainted, lifted = set(), set()
        for rule in rules:
            before = held.get(rule.name)
            if before is None:
                self.api.request("POST", self._path(), rule_object(rule, self.node, self.effect, version))
                tainted.add((rule.gpu, rule.key, rule.message))
                log.info("node %s: %s tainted %s:%s (%s %s)", self.node, rule.gpu, rule.key, self.effect, rule.driver, rule.device)
            elif not same(before, rule, self.effect):
                self.api.request("PUT", self._path(rule.name), rule_object(rule, self.node, self.effect, version,
                                                                          before.resource_version, before.time_added))
        wanted = {rule.name for rule in rules}
        for name, before in held.items():
            if name in wanted:
                continue
            try:
                self.api.request("DELETE", self._path(name))
            except ApiError as error:
                if error.status != 404:  # already gone
                    raise
            lifted.add((before.taint[1] or "a GPU", before.taint[0] or "nodecheck"))
            log.info("node %s: lifted %s from %s (%s)", self.node, before.taint[0], before.taint[1], name)
        for gpu, key, message in sorted(tainted):
            events.append(("Warning", "NodecheckDeviceTainted", f"{gpu} tainted {key}:{self.effect} by DeviceTaintRule: {message}"))
        for gpu, key in sorted(lifted):
            events.append(("Normal", "NodecheckDeviceTaintLifted", f"{key} lifted from {gpu}: the finding cleared"))
        return events

    def _say(self, notes: tuple[str, ...], outcome: Outcome) -> None:
        """Why GPUs' findings stay with the node: logged and posted once each time it changes."""
        if notes == self.notes:
            return
        self.notes = notes
        if notes:
            log.warning("node %s: device taints: %s", self.node, "; ".join(notes))
            outcome.events.append(("Warning", "NodecheckDeviceTaintsWithheld", "; ".join(notes)))

    def families(self) -> list:
        """The publisher's device-taint series (docs/metrics.md)."""
        from prometheus_client.core import GaugeMetricFamily

        rules = GaugeMetricFamily("nodecheck_kubernetes_device_taint_rules",
                                  "DeviceTaintRules nodecheck holds for this node's GPUs (serve --kubernetes-device-taints)",
                                  value=float(len(self.held or {})))
        withheld = GaugeMetricFamily("nodecheck_kubernetes_device_taints_withheld_gpus",
                                     "GPUs with a failing finding that no DeviceTaintRule speaks for: the node acts for them",
                                     value=float(self.withheld))
        return [rules, withheld]
