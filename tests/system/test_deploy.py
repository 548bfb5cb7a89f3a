"""deploy/: the Grafana dashboard's queries are valid PromQL (promtool) over metrics the exporter
publishes, and the Kubernetes manifests agree with each other and with the CLI."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import REPO, hgx_nvml, kubernetes_objects, make_measurement, make_snapshot, nodecheck, write_pci_tree
from prometheus_client.parser import text_string_to_metric_families

from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.prometheus.exposition import write_textfile
from nodecheck.report.model import Measurement

DASHBOARD = REPO / "deploy" / "grafana" / "nodecheck-dashboard.json"


FLEET_DASHBOARD = REPO / "deploy" / "grafana" / "nodecheck-fleet-dashboard.json"


def dashboard_queries(path: Path = DASHBOARD) -> list[str]:
    dash = json.loads(path.read_text())
    queries = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queries += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    return queries


def test_dashboard_queries_use_exported_metrics(tmp_path):
    snap = make_snapshot(tmp_path / "s", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    (snap / "kmsg.txt").write_text("4,1,8312000001,-;NVRM: Xid (PCI:0000:48:00): 74, pid=1, NVLink: fatal error\n")
    # gpu3 behind a PCIe switch port, each with the AER counts the kernel keeps
    write_pci_tree(snap, {"0000:47:00.0": ("0x060400", "pci0000:40/0000:40:01.0/0000:47:00.0", 16, 16, "32.0 GT/s PCIe"),
                          "0000:48:00.0": ("0x030200", "pci0000:40/0000:40:01.0/0000:47:00.0/0000:48:00.0", 16, 16, "32.0 GT/s PCIe")},
                   {"0000:47:00.0": {"correctable": 3, "nonfatal": 0, "fatal": 0}, "0000:48:00.0": {"correctable": 0, "nonfatal": 0, "fatal": 0}})
    report = build_report(SnapshotHost(snap))
    report.measurements.append(make_measurement())
    report.measurements.append(Measurement.computed("gpu0:compute", "gemm", 797.5e12, 989.4e12, 1, "matmul", "bf16 dense",
                                                    {"path_kind": "compute"}))
    exported = {f.name for f in text_string_to_metric_families(write_textfile(report, tmp_path).read_text())}
    queried = {m for q in dashboard_queries() for m in re.findall(r"\bnodecheck_[a-z_]+", q)}
    assert len(queried) >= 10 and queried <= exported, queried - exported


def test_dashboard_queries_are_valid_promql(tmp_path):
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (apt install prometheus)")
    exprs = [q.replace("$instance", ".*").replace("$sku", ".*") for path in (DASHBOARD, FLEET_DASHBOARD)
             for q in dashboard_queries(path) if not q.startswith("label_values")]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    (tmp_path / "q.yml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run(["promtool", "check", "rules", str(tmp_path / "q.yml")], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    dash = json.loads(DASHBOARD.read_text())
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"]) and dash["uid"] == "nodecheck"


def test_kubernetes_manifests_agree():
    objects = kubernetes_objects("daemonset.yaml")
    daemonset, service = objects["DaemonSet"], objects["Service"]
    monitor = yaml.safe_load((REPO / "deploy/kubernetes/servicemonitor.yaml").read_text())
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    listen = container["args"][container["args"].index("--listen") + 1]
    port = int(listen.rsplit(":", 1)[1])
    assert container["ports"][0]["containerPort"] == port and service["spec"]["ports"][0]["port"] == port
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert daemonset["spec"]["template"]["spec"]["hostNetwork"] is True
    usage = nodecheck(*container["args"][:1], "--help")
    assert usage.returncode == 0 and all(flag in usage.stdout for flag in ("--listen", "--interval"))


def test_the_fleet_dashboard_reads_what_the_fleet_rules_record():
    """Every recorded series the fleet dashboard queries is one the rules define; every raw one is exported."""
    recorded = set(re.findall(r"record: (nodecheck:[a-z_:]+)", (REPO / "deploy/prometheus/nodecheck-rules.yml").read_text()))
    queries = dashboard_queries(FLEET_DASHBOARD)
    used = {m for q in queries for m in re.findall(r"\bnodecheck:[a-z_:]+", q)}
    assert used and used <= recorded, used - recorded
    dash = json.loads(FLEET_DASHBOARD.read_text())
    assert dash["uid"] == "nodecheck-fleet" and len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_the_daemonset_gives_the_kernel_log_and_the_state_what_they_need():
    """The journal read-only with the groups its ACLs name (no privilege, no CAP_SYSLOG), and a writable state
    directory where STATE_DIRECTORY points, under a read-only root filesystem: the host's, which outlives the pod,
    given to the container's user by an init container that holds CHOWN alone (tests/system/test_container.py runs it)."""
    daemonset = kubernetes_objects("daemonset.yaml")["DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert all(mounts[path].get("readOnly") for path in ("/var/log/journal", "/run/log/journal", "/etc/machine-id"))
    assert volumes[mounts["/var/log/journal"]["name"]]["hostPath"]["path"] == "/var/log/journal"
    assert {4, 10} <= set(pod["securityContext"]["supplementalGroups"])
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["capabilities"] == {"drop": ["ALL"]} and not security.get("privileged")
    state = {e["name"]: e.get("value") for e in container["env"]}["STATE_DIRECTORY"]
    assert not mounts[state].get("readOnly") and volumes[mounts[state]["name"]]["hostPath"] == {"path": state, "type": "DirectoryOrCreate"}
    (init,) = pod["initContainers"]
    assert init["command"] == ["chown", f"{security['runAsUser']}:{security['runAsUser']}", state]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert init["securityContext"]["readOnlyRootFilesystem"] and not init["securityContext"]["allowPrivilegeEscalation"]
    assert init["image"] == container["image"] and [m["mountPath"] for m in init["volumeMounts"]] == [state]
    assert "systemd" in (REPO / "deploy/container/Containerfile").read_text()  # journalctl in the image


def test_the_test_command_left_no_service_enabled():
    """tests/run.sh installs slurm-wlm, munge, Prometheus and Alertmanager for the tests' own instances: the
    machine it ran on must not be left with them enabled at boot (a CI runner or a GPU node is not a cluster head)."""
    before = os.environ.get("NODECHECK_UNITS_ENABLED_BEFORE")
    if before is None or shutil.which("systemctl") is None:
        pytest.skip("tests/run.sh did not install packages (not root, or pytest run directly)")
    listed = subprocess.run(["systemctl", "list-unit-files", "--state=enabled", "--no-legend"], capture_output=True,
                            text=True, timeout=60)
    enabled_now = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    assert enabled_now <= set(before.split()), f"enabled by the test command: {sorted(enabled_now - set(before.split()))}"
