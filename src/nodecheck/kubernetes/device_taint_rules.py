"""Which DeviceTaintRules a Report asks for (issue 53), pure: a GPU with a finding at or above the failing severity,
mapped to its DRA devices (resource_slices.py), gets one rule per device and finding kind, selecting exactly that
device (driver, pool, device) with the taint `nodecheck/<kind>`. What a rule cannot name stays with the node:
findings of a GPU pair (which of the two?), of a GPU and its NIC, of a NIC, of the node; a GPU no slice lists;
and, once more GPUs fail than the share a node may lose device by device (default half: a wrong reading must not
take a whole node away one GPU at a time), every GPU not already tainted: those keep their rules, no new one is
made, and the node condition speaks for the rest. A GPU
NVML no longer lists (fallen off the bus) is named by its PCI address (`pci:0000:53:00.0`, an Xid's subject then):
it is a GPU when the NVIDIA driver manages that address, and its device is found there.

The objects follow resource.k8s.io's DeviceTaintRule (k8s.io/api resource/v1 types.go: v1 from Kubernetes 1.37,
v1beta2 from 1.36, v1alpha3 from 1.33, one shape): spec.deviceSelector {driver, pool, device}, spec.taint {key,
value, effect}; a taint key "must be a label name", a value "a label value", effects None, NoSchedule, NoExecute.
The finding's message rides in an annotation: a taint has no room for it."""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

from nodecheck.core.pci import normal_pci
from nodecheck.core.typed_json import member
from nodecheck.kubernetes.resource_slices import DeviceMap
from nodecheck.report.findings import Finding, at_or_above, one_line

GROUP = "resource.k8s.io"
EFFECTS = ("NoSchedule", "NoExecute", "None")
TAINT_PREFIX = "nodecheck/"
MANAGED_BY = "app.kubernetes.io/managed-by"
NODE_LABEL = "nodecheck/node"  # the node whose rules these are: what a pod lists and deletes by
NODE_ANNOTATION, MESSAGE_ANNOTATION, GPU_ANNOTATION = "nodecheck/node", "nodecheck/message", "nodecheck/gpu"
MAX_RULES = 256  # per node: 8 GPUs x 7 MIG devices x a few kinds fits many times over
MAX_MESSAGE = 1024
# a GPU's own finding: itself, or one of its own paths (its memory, its compute, its link to the host)
_GPU_SUBJECT = re.compile(r"gpu(\d{1,4})(?::(?:memory|compute|host))?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class Rule:
    """One DeviceTaintRule nodecheck wants: its name, what it selects, its taint and why."""

    name: str
    driver: str
    pool: str
    device: str
    key: str  # nodecheck/<kind>
    gpu: str  # gpu3, or pci:0000:53:00.0 for a GPU NVML no longer lists
    message: str


@dataclass
class Plan:
    rules: list[Rule] = field(default_factory=list)
    covered: set[tuple[str, str]] = field(default_factory=set)  # (kind, subject) a rule speaks for: not the node
    notes: list[str] = field(default_factory=list)  # why a GPU's finding stays with the node


def gpu_of(subject: str, addresses: frozenset[str] = frozenset()) -> str | None:
    """The one GPU a finding's subject is about ("gpu3"), or `pci:ADDRESS` when that address is one of `addresses`
    (the GPUs the driver manages that NVML does not list), or None (a pair, a NIC, a switch port, the node ...)."""
    match = _GPU_SUBJECT.fullmatch(subject)
    if match:
        return f"gpu{int(match[1])}"
    if subject.startswith("pci:") and (address := normal_pci(subject[4:])) in addresses:
        return f"pci:{address}"
    return None


def taint_value(gpu: str) -> str:
    """gpu3; pci:0000:53:00.0 as pci-0000-53-00.0 (a label value has no colon)."""
    return gpu.replace(":", "-")


def taint_key(kind: str) -> str | None:
    name = kind.replace(" ", "_")[:63]
    return TAINT_PREFIX + name if _LABEL_NAME.fullmatch(name) else None


def node_label(node: str) -> str:
    """A node name as a label value (63 characters at most; a node name may have 253)."""
    if len(node) <= 63 and _LABEL_VALUE.fullmatch(node):
        return node
    return "h-" + hashlib.sha256(node.encode()).hexdigest()[:60]


def rule_name(node: str, driver: str, pool: str, device: str, kind: str) -> str:
    """nodecheck.<node>.<device>.<kind>.<hash of all five>: readable in `kubectl get devicetaintrules`, unique
    per node, driver, pool, device and kind, and a DNS subdomain (253 characters, else the hash alone)."""
    digest = hashlib.sha256("|".join((node, driver, pool, device, kind)).encode()).hexdigest()
    readable = f"nodecheck.{node}.{device}.{kind.replace('_', '-')}.{digest[:8]}"
    labels = readable.split(".")
    if len(readable) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in labels):
        return readable
    return f"nodecheck.{digest[:40]}"


def plan(node: str, findings: list[Finding], fail_severity: str, devices: DeviceMap, gpu_count: int,
         max_share: float, addresses: frozenset[str] = frozenset(), already: frozenset[str] = frozenset()) -> Plan:
    """The rules the failing findings ask for, and which findings they speak for. devices: keyed by gpu_of's names;
    gpu_count: the node's GPUs (NVML's and those at `addresses`); already: the GPUs nodecheck's rules hold now."""
    out = Plan()
    per_gpu: dict[str, list[Finding]] = {}
    for finding in at_or_above(findings, fail_severity):
        gpu = gpu_of(finding.subject, addresses)
        if gpu is not None and taint_key(finding.kind):
            per_gpu.setdefault(gpu, []).append(finding)
    if not per_gpu:
        return out
    limit = math.floor(gpu_count * max_share + 1e-9)
    if len(per_gpu) > limit:
        kept = sorted(gpu for gpu in per_gpu if gpu in already)[:limit]
        out.notes.append(f"{len(per_gpu)} of {gpu_count} GPUs have failing findings, more than the {limit} "
                         f"({max_share:g} of them) a node may lose by device taints: no new device taint, "
                         f"{'the rules of ' + ', '.join(kept) + ' kept, ' if kept else ''}the node acts for the rest")
        per_gpu = {gpu: per_gpu[gpu] for gpu in kept}
    out.notes.extend(devices.notes)
    for gpu in sorted(per_gpu):
        own = devices.devices.get(gpu)
        if not own:
            out.notes.append(f"{gpu}: no DRA device lists it (UUID or PCI address): the node acts for it")
            continue
        for finding in _one_per_kind(per_gpu[gpu]):
            for device in own:
                if len(out.rules) >= MAX_RULES:
                    out.notes.append(f"more than {MAX_RULES} rules wanted: the rest left to the node")
                    return out
                out.rules.append(Rule(rule_name(node, device.driver, device.pool, device.name, finding.kind),
                                      device.driver, device.pool, device.name, taint_key(finding.kind), gpu,
                                      one_line(" ".join(finding.message.split()))[:MAX_MESSAGE]))
        out.covered |= {(f.kind, f.subject) for f in per_gpu[gpu]}
    return out


def _one_per_kind(findings: list[Finding]) -> list[Finding]:
    seen: dict[str, Finding] = {}
    for finding in findings:
        seen.setdefault(finding.kind, finding)
    return list(seen.values())


def rule_object(rule: Rule, node: str, effect: str, version: str, resource_version: str | None = None,
                time_added: str | None = None) -> dict:
    """The DeviceTaintRule as nodecheck creates (or, with the resourceVersion read, replaces) it."""
    taint = {"key": rule.key, "value": taint_value(rule.gpu), "effect": effect, **({"timeAdded": time_added} if time_added else {})}
    metadata = {"name": rule.name, "labels": {MANAGED_BY: "nodecheck", NODE_LABEL: node_label(node)},
                "annotations": {NODE_ANNOTATION: node, GPU_ANNOTATION: rule.gpu, MESSAGE_ANNOTATION: rule.message}}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {"apiVersion": f"{GROUP}/{version}", "kind": "DeviceTaintRule", "metadata": metadata,
            "spec": {"deviceSelector": {"driver": rule.driver, "pool": rule.pool, "device": rule.device}, "taint": taint}}


def owner_selector(node: str) -> str:
    return f"{MANAGED_BY}=nodecheck,{NODE_LABEL}={node_label(node)}"


@dataclass(frozen=True)
class Held:
    """A DeviceTaintRule the server holds for this node, as far as nodecheck compares it."""

    name: str
    resource_version: str | None
    selector: tuple[str | None, str | None, str | None]  # driver, pool, device
    taint: tuple[str | None, str | None, str | None]  # key, value, effect
    message: str | None
    time_added: str | None
    gpu: str | None = None  # the GPU it was written for (its annotation)


def held_rules(answer: dict, node: str, limit: int = 4 * MAX_RULES) -> tuple[dict[str, Held], list[str]]:
    """This node's rules in a DeviceTaintRuleList (the API server's answer, untrusted): only those whose labels
    and annotation name nodecheck and this node, whatever the server's label selector let through."""
    items = member(answer, "items", list) or []
    notes = [f"{len(items)} DeviceTaintRules listed: the first {limit} read"] if len(items) > limit else []
    out: dict[str, Held] = {}
    for item in items[:limit]:
        metadata = member(item, "metadata", dict)
        labels = member(metadata, "labels", dict) or {}
        annotations = member(metadata, "annotations", dict) or {}
        name = member(metadata, "name", str)
        if (not name or labels.get(MANAGED_BY) != "nodecheck" or labels.get(NODE_LABEL) != node_label(node)
                or annotations.get(NODE_ANNOTATION) != node):
            continue
        spec = member(item, "spec", dict)
        selector, taint = member(spec, "deviceSelector", dict), member(spec, "taint", dict)
        out[name] = Held(name, member(metadata, "resourceVersion", str),
                         tuple(member(selector, k, str) for k in ("driver", "pool", "device")),
                         tuple(member(taint, k, str) for k in ("key", "value", "effect")),
                         member(annotations, MESSAGE_ANNOTATION, str), member(taint, "timeAdded", str),
                         member(annotations, GPU_ANNOTATION, str))
    return out, notes


def same(held: Held, rule: Rule, effect: str) -> bool:
    return (held.selector == (rule.driver, rule.pool, rule.device) and held.taint == (rule.key, taint_value(rule.gpu), effect)
            and held.message == rule.message)
