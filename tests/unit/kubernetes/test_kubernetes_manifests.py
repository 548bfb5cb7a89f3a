"""Every manifest in deploy/kubernetes, validated offline against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict: an unknown field is an error). No API server runs here: this is schema- and
contract-testing, not a live cluster (docs say so). The ServiceMonitor is the Prometheus operator's CRD, whose
schema Kubernetes does not ship: tests/system/test_deploy.py checks it against the Service it selects."""

from pathlib import Path

import pytest
import yaml
from helpers import REPO

kubernetes_validate = pytest.importorskip("kubernetes_validate")
MANIFESTS = sorted((REPO / "deploy/kubernetes").glob("*.yaml"))
CRDS = {"ServiceMonitor"}


def documents() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.utils.latest_version()])
def test_every_manifest_is_valid_kubernetes(version):
    validated = []
    for path, doc in documents():
        if doc["kind"] in CRDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        validated.append((path.name, doc["kind"]))
    assert {("daemonset.yaml", "DaemonSet"), ("daemonset.yaml", "Service"), ("daemonset.yaml", "ServiceAccount"),
            ("rbac.yaml", "ClusterRole"), ("rbac.yaml", "Role"), ("rbac-taint.yaml", "ClusterRole"),
            ("rbac-device-taints.yaml", "ClusterRole")} <= set(validated)


def test_an_unknown_field_fails_the_validation():
    (daemonset,) = [doc for _, doc in documents() if doc["kind"] == "DaemonSet"]
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, kubernetes_validate.utils.latest_version(), strict=True)


def doc_examples() -> list[dict]:
    """The Kubernetes objects docs/kubernetes.md shows in its yaml blocks (the DaemonSet args excerpts apart)."""
    import re

    text = (REPO / "docs/kubernetes.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if isinstance(doc, dict) and "kind" in doc]


def test_the_device_taint_examples_in_the_docs_are_valid_and_what_nodecheck_writes():
    """The rule the page shows is the one nodecheck writes for the HGX node's gpu3 with an NVLink down; it and the
    pod that asks for one GPU are valid in the release that serves resource.k8s.io/v1's DeviceTaintRule."""
    from nodecheck.kubernetes.device_taint_rules import Rule, rule_name, rule_object

    examples = {doc["kind"]: doc for doc in doc_examples()}
    assert set(examples) >= {"DeviceTaintRule", "ResourceClaimTemplate", "Pod"}
    for doc in examples.values():
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    shown = examples["DeviceTaintRule"]
    node, message = "gpu-node-7", shown["metadata"]["annotations"]["nodecheck/message"]
    assert message.startswith("gpu3 17 of 18 NVLinks active")
    rule = Rule(rule_name(node, "gpu.nvidia.com", node, "gpu-3", "nvlink_inactive"), "gpu.nvidia.com", node, "gpu-3",
                "nodecheck/nvlink_inactive", "gpu3", message)
    assert shown == rule_object(rule, node, "NoSchedule", "v1")
