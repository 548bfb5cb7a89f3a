"""The fleet's nodes as the Prometheus that scrapes them sees them (`nodecheck fleet --prometheus URL`): the same
NodeViews a directory of Reports gives (fleet/__init__.py), from instant queries of its HTTP API. Every call has a
timeout and a bounded answer; a node is named by its `instance` label."""

from __future__ import annotations

import math
import urllib.parse

from nodecheck.assemble.fingerprint import FIELDS
from nodecheck.core import typed_json
from nodecheck.core.errors import NodecheckError
from nodecheck.fleet import NodeView
from nodecheck.host.http_call import get
from nodecheck.report.model import measured_on

MAX_ANSWER = 64 * 1024 * 1024  # 10,000 nodes x a few dozen series
TIMEOUT_S = 30.0
FACTS = {  # the numeric facts fleet/__init__.py takes from a Report, as PromQL over nodecheck's metrics
    "fact:gpus": "nodecheck_gpus",
    "fact:gpu_pcie_width_min": "min by (instance) (nodecheck_gpu_pcie_link_width)",
    "fact:nvlinks_active": "sum by (instance) (nodecheck_gpu_nvlink_active_links)",
    "fact:gpu_power_limit_min_w": "min by (instance) (nodecheck_gpu_power_limit_watts)",
    "fact:gpu_hw_braked_pct_max": ('round(clamp_max(100 * max by (instance) (sum by (instance, gpu) (nodecheck_gpu_clock_event_seconds'
                                   '{reason=~"hw_thermal_slowdown|hw_power_brake_slowdown"})) / on (instance)'
                                   ' nodecheck_node_uptime_seconds, 100), 0.1)'),
    "fact:nics_up": 'count by (instance) (nodecheck_nic_up * on (instance, nic) group_left () nodecheck_nic_info{virtual="false"} == 1)',
    "fact:nic_spec_gbits_total": ('sum by (instance) (label_replace(nodecheck_path_spec_bytes_per_second{path=~"nic:.+"}, "nic", "$1",'
                                  ' "path", "nic:(.+)") * on (instance, nic) group_left () (nodecheck_nic_up == 1)'
                                  ' * on (instance, nic) group_left () nodecheck_nic_info{virtual="false"}) * 8 / 1e9'),
}


def query(base: str, promql: str, timeout: float = TIMEOUT_S) -> list[dict]:
    """An instant query's result vector: [{"metric": {...}, "value": [time, "text"]}]; the whole call within
    `timeout` (src/nodecheck/host/http_call.py), its answer within MAX_ANSWER; NodecheckError naming what went wrong."""
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        body = get(url, timeout, MAX_ANSWER)
    except NodecheckError as error:
        raise NodecheckError(f"Prometheus at {base[:200]}: {error}") from None
    try:
        document = typed_json.loads(body)
        result = document["data"]["result"] if document.get("status") == "success" else None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        result = None
    if not isinstance(result, list):
        raise NodecheckError(f"Prometheus at {base[:200]}: not an instant-query answer to {promql[:80]!r}")
    return [r for r in result if isinstance(r, dict) and isinstance(r.get("metric"), dict)]


def _number(sample: dict) -> float | None:
    try:
        value = float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None  # NaN or +Inf: no figure (a NaN median judges no one)


def node_views(base: str) -> list[NodeView]:
    """One NodeView per instance that publishes a fingerprint."""
    views: dict[str, NodeView] = {}
    for sample in query(base, "nodecheck_node_fingerprint_info"):
        labels = sample["metric"]
        instance = str(labels.get("instance", ""))
        if instance:
            views[instance] = NodeView(instance, str(labels.get("sku", "")), {f: str(labels.get(f, "")) for f in FIELDS}, {})
    for sample in query(base, "min by (instance, test, path) (nodecheck_bandwidth_ratio)"):
        view, value = views.get(str(sample["metric"].get("instance"))), _number(sample)
        path = str(sample["metric"].get("path", ""))
        if view is not None and value is not None and measured_on(path) is None:
            view.values[f"measured:{sample['metric'].get('test')}/{path}"] = value
    for key, promql in FACTS.items():
        for sample in query(base, promql):
            view, value = views.get(str(sample["metric"].get("instance"))), _number(sample)
            if view is not None and value is not None:
                view.values[key] = value
    return sorted(views.values(), key=lambda v: v.name)
