"""node-problem-detector's custom-plugin protocol (issue 25, item 1): `nodecheck check --npd AREA` run as NPD
runs a plugin (a subprocess under a timeout; exit 0 ok, 1 problem, 2 unknown; one line of at most 80
characters), on real snapshots, and deploy/kubernetes/npd-nodecheck.json naming only what the plugin accepts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, fake_executable, h100_node_snapshot, hgx_nvml, make_snapshot

from nodecheck.checks import AREAS, FINDING_KINDS
from nodecheck.kubernetes.npd import MAX_LINE

CONFIG = REPO / "deploy/kubernetes/npd-nodecheck.json"


def plugin(*args: str, timeout: float = 60, env: dict | None = None) -> tuple[int, list[str]]:
    """As NPD invokes a custom plugin: the command, its exit code and its output lines."""
    run = subprocess.run([sys.executable, "-m", "nodecheck", "check", *args], capture_output=True, text=True, timeout=timeout,
                         env=env)
    return run.returncode, run.stdout.splitlines()


def test_every_finding_kind_is_in_exactly_one_area():
    placed = [kind for kinds in AREAS.values() for kind in kinds]
    assert sorted(placed) == sorted(FINDING_KINDS)


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    root = tmp_path_factory.mktemp("npd")
    return {"healthy": h100_node_snapshot(root / "healthy"),
            "nvlink_down": make_snapshot(root / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                                         nvml_gpus=hgx_nvml(inactive={3: [7]}))}


def test_a_problem_an_ok_and_an_unknown_as_npd_reads_them(snapshots, tmp_path):
    code, lines = plugin("--npd", "gpu", "--from", str(snapshots["nvlink_down"]))
    assert (code, lines) == (1, ["gpu3 NVLinks active 17 < 18"])
    code, lines = plugin("--npd", "gpu", "--from", str(snapshots["healthy"]))
    assert code == 0 and len(lines) == 1 and lines[0].startswith("gpu: ok")
    broken = tmp_path / "broken.toml"
    broken.write_text("[gpus]\ncount = 'eight'\n")
    code, lines = plugin("--npd", "gpu", "--from", str(snapshots["healthy"]), "--config", str(broken))
    assert code == 2 and len(lines) == 1 and lines[0].startswith("unknown:") and len(lines[0]) <= MAX_LINE
    assert plugin("--npd", "disks", "--from", str(snapshots["healthy"]))[0] == 2
    for area in AREAS:
        code, lines = plugin("--npd", area, "--npd-severity", "warning", "--from", str(snapshots["nvlink_down"]))
        assert code in (0, 1, 2) and len(lines) == 1 and len(lines[0]) <= MAX_LINE, (area, lines)


def test_the_npd_config_asks_only_what_the_plugin_answers():
    config = json.loads(CONFIG.read_text())
    assert config["plugin"] == "custom" and config["pluginConfig"]["max_output_length"] == MAX_LINE
    conditions = {c["type"] for c in config["conditions"]}
    for rule in config["rules"]:
        args = rule["args"]
        assert args[:2] == ["check", "--npd"] and args[2] in AREAS, rule
        assert rule["type"] in ("permanent", "temporary") and (rule["type"] == "temporary" or rule["condition"] in conditions)
        assert rule["path"] == "/usr/local/bin/nodecheck"
    # bandwidth needs the file a bench wrote, which no shipped unit writes: shipped, it would be Unknown for ever
    assert {r["args"][2] for r in config["rules"] if r["type"] == "permanent"} == set(AREAS) - {"bandwidth"}
    assert all("--measurements" in r["args"] for r in config["rules"] if r["args"][2] == "bandwidth")


def test_bandwidth_reads_the_measurements_a_bench_wrote(snapshots, tmp_path):
    """`--npd bandwidth --measurements FILE` judges what `bench --json` wrote, as `serve --measurements` does: a
    failing figure is a problem, a passing one ok; no file, another node's, or a week-old one is unknown; a wrong
    area lists the valid ones."""
    import time

    from helpers import make_measurement

    healthy = str(snapshots["healthy"])

    def judged(ratio: float, measured_at: float, hostname: str | None = None) -> tuple[int, list[str]]:
        m = make_measurement("gpu0:host", "h2d", rate=ratio * 64e9, spec=64e9, method="copy", direction="unidirectional")
        document = {"schema": "nodecheck.measurements", "measured_at": measured_at, "measurements": [m.__dict__]}
        if hostname:
            document["node"] = {"hostname": hostname}
        (tmp_path / "bench.json").write_text(json.dumps(document))
        return plugin("--npd", "bandwidth", "--measurements", str(tmp_path / "bench.json"), "--from", healthy)

    code, lines = judged(0.4, time.time() - 60)
    assert (code, lines) == (1, ["gpu0:host bandwidth 0.40 of spec, >= 0.8 expected"])
    code, lines = judged(0.9, time.time() - 60)
    assert code == 0 and lines[0].startswith("bandwidth: ok"), lines
    code, lines = judged(0.4, time.time() - 8 * 86400)
    assert code == 2 and "days ago" in lines[0], lines
    named = make_snapshot(tmp_path / "named", nvml_gpus=hgx_nvml())
    (named / "identity.json").write_text(json.dumps({"hostname": "gpu-01", "kernel": "6.8.0", "machine": "x86_64"}))
    healthy = str(named)
    code, lines = judged(0.4, time.time() - 60, hostname="another-node")  # a shared path: another node's figures
    assert code == 2 and lines[0].startswith("unknown:") and "another-node" in lines[0], lines
    code, lines = plugin("--npd", "bandwidth", "--from", healthy)
    assert code == 2 and "--measurements" in lines[0]
    code, lines = plugin("--npd", "foo", "--from", healthy)
    assert code == 2 and "gpu, fabric, bandwidth" in lines[0] and len(lines[0]) <= MAX_LINE


def test_a_hung_nvidia_smi_is_answered_within_npd_s_timeout_and_leaves_nothing_running(tmp_path):
    """NPD kills a plugin at its rule's timeout and then knows nothing: nodecheck's own probe deadlines end
    first, so a hung driver is reported as the problem it is, and the hung command does not outlive the plugin."""
    rule_timeouts = {float(rule["timeout"].rstrip("s")) for rule in json.loads(CONFIG.read_text())["rules"]}
    pidfile = tmp_path / "pid"
    fake_executable(tmp_path / "nvidia-smi", f"echo $$ > {pidfile}\nexec sleep 600\n")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "STATE_DIRECTORY": str(tmp_path)}
    code, lines = plugin("--npd", "gpu", timeout=min(rule_timeouts), env=env)  # TimeoutExpired had NPD given up
    assert code == 1 and len(lines) == 1 and lines[0].startswith("probe:nvidia_smi_topo timed out"), lines
    pid = int(pidfile.read_text())
    assert not Path(f"/proc/{pid}").exists() or "sleep" not in Path(f"/proc/{pid}/cmdline").read_text()


def test_a_name_with_a_newline_or_an_escape_is_one_printable_line():
    """NPD's output and a node condition's message (`kubectl describe node` prints it raw): a NIC name from a config
    or sysfs holding a newline and an escape sequence stays on one line, the escape a '?'."""
    from nodecheck.kubernetes.npd import AreaVerdict
    from nodecheck.report.findings import Finding

    hostile = Finding("nic_missing", "error", "eth9\nState=IDLE\x1b[2J", "absent", "present",
                      "eth9\nState=IDLE\x1b[2J is missing:\tcheck the cable")
    verdict = AreaVerdict("nic", (hostile,), {}, 1)
    assert verdict.line() == "eth9 State=IDLE?[2J missing"
    assert verdict.line(full=True) == "eth9 State=IDLE?[2J is missing: check the cable"
