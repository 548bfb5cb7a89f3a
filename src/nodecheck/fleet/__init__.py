"""The fleet view (issue 24): nodes of one type compared with each other. Pure: Reports in, a verdict out.

Nodes are grouped by sku (src/nodecheck/assemble/fingerprint.py). In a group where each node has at least MIN_PEERS peers:
- every measurement (its ratio to spec, per test and path) and numeric fact gets the group's
  median, each node's ratio to it and a robust z-score (0.6745 (x - median) / MAD, Iglewicz and Hoaglin); a node
  below `fraction` of its peers' median on a measurement, or at z <= -3.5 on anything, is out of line; the share of
  the time a GPU spent on a hardware clock brake is worse high: out of line a point above its peers' median;
- every fingerprint field has its majority; a node that differs from it is named ("gpu-17: driver 550.54.15;
  412 of 415 nodes run 550.90.07").
Fewer than MIN_PEERS peers: said, nothing judged (the Prometheus rules' `fleet_nodes >= 6` is the same bar), except
that a node with fewer GPUs of its model than a judged group of that model is named out of line: it lost GPUs.
Peers advise; they never drain a node (issue 24).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass, field

from nodecheck.assemble.fingerprint import MIG, fingerprint, topology_facts
from nodecheck.fleet.topology_diff import topology_differences
from nodecheck.probes.nvml_clock_events import HARDWARE_BRAKES
from nodecheck.report.model import Report, measured_on

MIN_PEERS = 5
DEFAULT_FRACTION = 0.9
Z_OUT = -3.5  # Iglewicz and Hoaglin's cut for a modified z-score
# facts worse when high, each with how far above its peers' median is out of line (the Prometheus alert's margin too):
# percentage points of the time since boot a GPU spent on a hardware clock brake
HIGHER_IS_WORSE = {"fact:gpu_hw_braked_pct_max": 1.0}
_COUNT = re.compile(r"[0-9]{1,6}")
DRIFT_FIELDS = ("driver", "cuda", "vbios", "nic_firmware", "kernel", "topology", "nccl_conf", "roce_gid")


@dataclass
class NodeView:
    name: str
    sku: str
    fingerprint: dict[str, str]
    values: dict[str, float]  # "measured:allreduce/allreduce:node-8-gpus" -> ratio to spec; "fact:gpus" -> a number
    nccl_conf: dict[str, str] | None = None  # its /etc/nccl.conf where its Report holds it (not from Prometheus)
    topology: dict | None = None  # what its topology hash covers, where its Report says (not from Prometheus)
    nics: list[tuple[str, str, int]] = field(default_factory=list)  # (name, kind, Mb/s) of its physical NICs


@dataclass
class Outlier:
    node: str
    key: str
    value: float
    median: float
    ratio: float | None
    z: float | None


@dataclass
class Drift:
    node: str
    field: str
    value: str
    majority: str
    majority_nodes: int
    nodes: int
    differs: list[str] = field(default_factory=list)  # what differs, where the Reports say (nccl_conf: NAME=value)


@dataclass
class Group:
    sku: str
    nodes: list[str]
    judged: bool
    why: str | None = None
    medians: dict[str, float] = field(default_factory=dict)
    outliers: list[Outlier] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)


def node_view(report: Report, fallback_name: str) -> NodeView:
    values: dict[str, float] = {}
    for m in report.measurements:
        # a GPU's own test (hbm, gemm) whose model has no spec is compared by its figure: its peers are the same model
        value = m.ratio if m.ratio is not None else m.figure if m.scope == "gpu" else None
        if m.ok and value is not None and measured_on(m.path) is None:  # another node's: its own Report speaks
            key = f"measured:{m.test}/{m.path}"
            values[key] = min(values.get(key, value), value)
    values.update(_facts(report))
    name = str((report.node or {}).get("hostname") or fallback_name)
    topology = topology_facts(report)  # hashed for the fingerprint, kept to say what a drift is
    labels = fingerprint(report, topology).labels()
    nics = [(n.name, n.kind, n.speed_mbps or 0) for n in report.nics if not n.virtual]
    return NodeView(name, labels["sku"], labels, values, report.nccl_conf(), topology, nics)


def _facts(report: Report) -> dict[str, float]:
    facts = {"fact:gpus": float(len(report.gpus))}
    widths = [(g.pcie or {}).get("width_current") for g in report.gpus]
    if any(widths):
        facts["fact:gpu_pcie_width_min"] = float(min(w for w in widths if w))
    if any(g.nvlinks for g in report.gpus):
        facts["fact:nvlinks_active"] = float(sum(1 for g in report.gpus for l in g.nvlinks if l.get("active")))
    limits = [g.power_limit_w for g in report.gpus if g.power_limit_w is not None]
    if limits:  # one lowered (`nvidia-smi -pl`) keeps a busy GPU on its power cap
        facts["fact:gpu_power_limit_min_w"] = min(limits)
    braked = _hw_braked_pct(report)
    if braked is not None:  # a GPU its cooling or power supply brakes more often than its peers' do
        facts["fact:gpu_hw_braked_pct_max"] = braked
    up = [n for n in report.nics if not n.virtual and n.state == "up"]
    facts["fact:nics_up"] = float(len(up))
    specs = [spec.bytes_per_second for spec in (report.path_spec(f"nic:{n.name}") for n in up) if spec and spec.bytes_per_second]
    if specs:  # each port's rate (an InfiniBand port has no netdev speed), or its PCIe path where slower
        facts["fact:nic_spec_gbits_total"] = round(sum(specs) * 8 / 1e9, 3)
    return facts


def _hw_braked_pct(report: Report) -> float | None:
    """The share of the time since boot its most braked GPU spent on a hardware brake (HW thermal or power brake
    slowdown: NVML's clock event counters, kept since the driver loaded), in percent to 0.1; None where the counters
    or the uptime are unknown."""
    uptime = report.history.uptime_s if report.history else None
    counters = [g.signals.clock_event_ns for g in report.gpus if g.signals and g.signals.clock_event_ns]
    if not uptime or uptime <= 0 or not counters:
        return None
    worst = max(sum(ns.get(name, 0) for name in HARDWARE_BRAKES) for ns in counters)
    return round(min(100.0, 100 * worst / 1e9 / uptime), 1)


def _models(sku: str) -> Counter:
    """GPU model -> count in a sku ("7x A + 1x A (MIG)" -> {"A (MIG)": 1, "A": 7})."""
    models = Counter()
    for part in sku.split(" + "):
        count, _, name = part.partition("x ")
        models[name] += int(count) if _COUNT.fullmatch(count) else 0  # ASCII digits: str.isdigit takes '²', int() not
    return models


def _partitioned_apart(sku: str, sizes: Counter) -> str:
    """For a group whose sku names MIG GPUs: how many nodes of the same GPUs have none in MIG mode, and what a GPU
    in MIG mode by mistake costs ("; 7 node(s) of 8x ... have no GPU in MIG mode; ..."); else ""."""
    if MIG not in sku:
        return ""
    models = Counter()
    for name, count in _models(sku).items():
        models[name.removesuffix(MIG)] += count
    plain = " + ".join(f"{n}x {name}" for name, n in models.most_common())
    peers = sizes.get(plain, 0)
    return (f"; {peers} node(s) of {plain} have no GPU in MIG mode"
            "; a GPU in MIG mode by mistake has no NVLink: [gpus] mig requires a mode") if peers else ""


def _judged_single_model(sizes: Counter) -> dict[str, list[tuple[int, str, int]]]:
    """GPU model -> (nodes, sku, GPUs) of each type large enough to judge whose GPUs are all that model: found
    once per comparison (per small group, a fleet of 8,000 node types took 59 s)."""
    out: dict[str, list[tuple[int, str, int]]] = {}
    for full, n in sizes.items():
        kinds = _models(full)
        if n >= MIN_PEERS + 1 and len(kinds) == 1:
            ((model, count),) = kinds.items()
            out.setdefault(model, []).append((n, full, count))
    return out


def _short_of_gpus(sku: str, members: list[NodeView], single: dict[str, list[tuple[int, str, int]]]) -> tuple[str, list[Drift]]:
    """For a group too small to judge whose GPUs are all of one model, where a judged group (MIN_PEERS + 1 nodes or
    more) holds more GPUs of that model: each node lost GPUs its type has (fallen off the bus or never enumerated,
    which no check of its own sees without [gpus] count). The clause to say and a Drift per node; else ("", [])."""
    models = _models(sku)
    if len(models) != 1:
        return "", []
    ((model, count),) = models.items()
    if not model or MIG in model:  # "no GPU", or MIG GPUs (_partitioned_apart)
        return "", []
    # (nodes, sku, GPUs) of each judged type holding more GPUs of this model alone
    fuller = [entry for entry in single.get(model, []) if entry[2] > count]
    if not fuller:
        return "", []
    nodes, full, usual = max(fuller)
    clause = (f"; {nodes} node(s) of {full}: {count} of {usual} GPUs here"
              "; a GPU fell off the bus or never came up: `nodecheck inspect` there")
    return clause, [Drift(v.name, "gpus", str(count), str(usual), nodes, nodes + len(members)) for v in members]


def compare(views: list[NodeView], fraction: float = DEFAULT_FRACTION) -> list[Group]:
    groups = []
    by_sku: dict[str, list[NodeView]] = {}
    for view in views:
        by_sku.setdefault(view.sku, []).append(view)
    sizes = Counter({sku: len(members) for sku, members in by_sku.items()})
    single = _judged_single_model(sizes)
    for sku in sorted(by_sku):
        members = sorted(by_sku[sku], key=lambda v: v.name)
        names = [v.name for v in members]
        if len(members) < MIN_PEERS + 1:
            short, lost = _short_of_gpus(sku, members, single)
            groups.append(Group(sku, names, False, f"{len(members)} node(s): fewer than {MIN_PEERS} peers each, nothing judged"
                                + _partitioned_apart(sku, sizes) + short, drift=lost))
            continue
        group = Group(sku, names, True)
        for key in sorted({k for v in members for k in v.values}):
            _judge_key(group, key, [(v.name, v.values[key]) for v in members if key in v.values], fraction)
        for name in DRIFT_FIELDS:
            _drift(group, name, [(v.name, v.fingerprint.get(name, "")) for v in members])
        _conf_differences(group, members)
        _topology_differences(group, members)
        for drift in (d for d in group.drift if d.field == "roce_gid" and d.majority):
            drift.differs = [f"jobs pinning NCCL_IB_GID_INDEX={drift.majority.split(',')[0]} fail their RoCE "
                             f"connections here (NCCL's GID: {drift.value or 'no RoCE rail'})"]
        groups.append(group)
    return groups


def _judge_key(group: Group, key: str, values: list[tuple[str, float]], fraction: float) -> None:
    if len(values) < MIN_PEERS + 1:
        return
    numbers = [x for _, x in values]
    median = statistics.median(numbers)
    mad = statistics.median(abs(x - median) for x in numbers)
    group.medians[key] = median
    for name, x in values:
        ratio = x / median if median else None
        z = 0.6745 * (x - median) / mad if mad else (0.0 if x == median else None)
        if key in HIGHER_IS_WORSE:
            out = x > median + HIGHER_IS_WORSE[key]
        else:
            low_measurement = key.startswith("measured:") and ratio is not None and ratio < fraction
            low_z = z is not None and z <= Z_OUT
            off_fact = key.startswith("fact:") and mad == 0 and x != median  # all peers agree but this one
            out = low_measurement or low_z or off_fact
        if out:
            group.outliers.append(Outlier(name, key, x, median, round(ratio, 4) if ratio is not None else None,
                                          round(z, 2) if z is not None else None))


def _drift(group: Group, name: str, values: list[tuple[str, str]]) -> None:
    majority, majority_nodes = Counter(value for _, value in values).most_common(1)[0]
    for node, value in values:
        if value != majority:
            group.drift.append(Drift(node, name, value, majority, majority_nodes, len(values)))


def _conf_differences(group: Group, members: list[NodeView]) -> None:
    """Each nccl_conf drift with the settings that differ from a node of the majority's file ("NCCL_IB_GID_INDEX=5,
    most: 3"), where both Reports hold the file."""
    confs = {v.name: v.nccl_conf for v in members}
    hashes = {v.name: v.fingerprint.get("nccl_conf", "") for v in members}
    for drift in (d for d in group.drift if d.field == "nccl_conf"):
        usual = next((confs[n] for n, h in hashes.items() if h == drift.majority and confs[n] is not None), None)
        mine = confs.get(drift.node)
        if usual is None and mine is None:
            continue
        usual, mine = usual or {}, mine or {}
        drift.differs = [f"{key.strip()[:40]}={mine.get(key, '(unset)')[:40]}, most: {usual.get(key, '(unset)')[:40]}"
                         for key in sorted(set(usual) | set(mine)) if usual.get(key) != mine.get(key)][:8]


def _topology_differences(group: Group, members: list[NodeView]) -> None:
    """Each topology drift with the fields that differ from a node of the majority's topology, where both
    Reports hold them (Prometheus gives the hash alone)."""
    by_name = {v.name: v for v in members}
    for drift in (d for d in group.drift if d.field == "topology"):
        usual = next((v.topology for v in members if v.fingerprint.get("topology") == drift.majority and v.topology), None)
        mine = by_name[drift.node]
        if usual is not None and mine.topology is not None:
            drift.differs = topology_differences(mine.topology, usual, mine.nics)


def out_of_line(groups: list[Group]) -> list[str]:
    return sorted({o.node for g in groups for o in g.outliers} | {d.node for g in groups for d in g.drift})

