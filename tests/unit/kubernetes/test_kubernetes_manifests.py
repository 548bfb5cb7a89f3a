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
            ("rbac.yaml", "ClusterRole"), ("rbac.yaml", "Role"), ("rbac-taint.yaml", "ClusterRole")} <= set(validated)


def test_an_unknown_field_fails_the_validation():
    (daemonset,) = [doc for _, doc in documents() if doc["kind"] == "DaemonSet"]
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, kubernetes_validate.utils.latest_version(), strict=True)
