"""The fleet view for real: a real Prometheus with the shipped rules scrapes eight `nodecheck serve --from`
processes on loopback (the HGX H100 example snapshot: the published topology, the H100 capture's NVML values,
eight NDR HCAs; each publishing an in-node all-reduce result with --measurements; each up ten days): five alike,
one at 0.81 of spec where the others measure 0.95, one on another driver, one with a GPU trained at x8, one with an
HCA up at 2X (200 Gbit/s), one whose gpu3 spent two of its ten days on its HW thermal brake. The fleet alerts fire
for those five and no other node; `nodecheck fleet --prometheus` and `nodecheck fleet DIR` over the same nodes'
Reports name the same five."""

import json
import re
import shutil
import sys
import time
import urllib.parse

import pytest
from helpers import REPO, cli, free_port, get_json, hgx_nvml, make_measurement, make_snapshot, wait_for
from scripted_server import ScriptedServer

from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.verdicts.bandwidth import with_measurements

DEADLINE = 120
FLEET_ALERTS = ("NodecheckBelowPeers", "NodecheckFingerprintDrift", "NodecheckNarrowerThanPeers", "NodecheckNicsSlowerThanPeers",
                "NodecheckClockBrakesAbovePeers")
NODES = {"node-1": {}, "node-2": {}, "node-3": {}, "node-4": {}, "node-5": {},
         "node-slow": {"ratio": 0.81}, "node-olddriver": {"driver": "550.54.15"}, "node-x8": {"x8": 3},
         "node-2x": {"two_x": 5}, "node-hot": {"hot": 3}}
UPTIME_S = 864000  # ten days


def node_snapshot(root, ratio: float = 0.95, driver: str | None = None, x8: int | None = None, two_x: int | None = None,
                  hot: int | None = None):
    from examples_builder import build_node

    snap = build_node(root)
    identity = json.loads((snap / "identity.json").read_text())
    (snap / "identity.json").write_text(json.dumps(dict(identity, hostname=root.name)))
    (snap / "state.json").write_text(json.dumps({"boot_id": "boot", "state": None}))  # no state kept yet, but uptime
    (snap / "fs/proc").mkdir(parents=True, exist_ok=True)
    (snap / "fs/proc/uptime").write_text(f"{UPTIME_S}.00 1000.00\n")
    if hot is not None:  # two of its ten days on the HW thermal brake
        dump = json.loads((snap / "nvml.json").read_text())
        dump["gpus"][hot]["clock_event_ns"]["hw_thermal_slowdown"] = 2 * 86400 * 10**9
        (snap / "nvml.json").write_text(json.dumps(dump))
    if x8 is not None:
        gpus = hgx_nvml()
        gpus[x8] = dict(gpus[x8], width=8)
        make_snapshot(snap, nvml_gpus=gpus)
    if two_x is not None:  # the port came up on two of its four lanes
        (snap / f"fs/sys/class/infiniband/mlx5_{two_x}/ports/1/rate").write_text("200 Gb/sec (2X NDR)\n")
    if driver:
        dump = json.loads((snap / "nvml.json").read_text())
        (snap / "nvml.json").write_text(json.dumps(dict(dump, driver_version=driver)))
    allreduce = make_measurement("allreduce:node-8-gpus", "allreduce", rate=ratio * 400e9, spec=400e9,
                                 details={"path_kind": "nvlink"})
    (root / "measurements.json").write_text(json.dumps({"schema": "nodecheck.measurements", "measured_at": time.time() - 600,
                                                        "measurements": [allreduce.__dict__]}))
    return snap, allreduce


def test_the_fleet_alerts_and_both_fleet_commands_name_the_same_nodes(tmp_path, processes):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (apt install prometheus)")
    targets, reports = {}, tmp_path / "reports"
    reports.mkdir()
    for name, variant in NODES.items():
        snap, allreduce = node_snapshot(tmp_path / name, **variant)
        targets[name] = f"127.0.0.1:{free_port()}"
        processes([sys.executable, "-m", "nodecheck", "serve", "--listen", targets[name], "--from", str(snap), "--interval", "1",
                   "--measurements", str(tmp_path / name / "measurements.json")], tmp_path / f"{name}.log")
        report = with_measurements(build_report(SnapshotHost(snap)), [allreduce], 1.8e9, None)
        (reports / f"{name}.json").write_text(json.dumps(report.to_dict()))

    rules = re.sub(r"for: \d+m", "for: 2s", (REPO / "deploy/prometheus/nodecheck-rules.yml").read_text())
    (tmp_path / "rules.yml").write_text(rules)
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [{"job_name": "nodecheck", "static_configs": [{"targets": list(targets.values())}]}]}))
    processes(["prometheus", f"--config.file={tmp_path}/prometheus.yml", f"--storage.tsdb.path={tmp_path}/tsdb",
               f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prometheus.log")
    base = f"http://127.0.0.1:{prom_port}"
    deadline = time.monotonic() + DEADLINE

    def query(expr: str) -> list:
        return get_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["data"]["result"]

    wait_for(lambda: len(query("nodecheck_bandwidth_ratio")) == len(NODES), "every node's all-reduce scraped", deadline)
    names = {address: name for name, address in targets.items()}
    expected = {("NodecheckBelowPeers", "node-slow"), ("NodecheckFingerprintDrift", "node-olddriver"),
                ("NodecheckNarrowerThanPeers", "node-x8"), ("NodecheckNicsSlowerThanPeers", "node-2x"),
                ("NodecheckClockBrakesAbovePeers", "node-hot")}

    def firing() -> set:
        alerts = query('ALERTS{alertstate="firing",alertname=~"%s"}' % "|".join(FLEET_ALERTS))
        return {(a["metric"]["alertname"], names[a["metric"]["instance"]]) for a in alerts}

    wait_for(lambda: firing() >= expected, "the five fleet alerts to fire", deadline)
    time.sleep(3)  # a few more evaluations: nothing else fires
    assert firing() == expected

    from_prometheus = json.loads(cli("fleet", "--prometheus", base, "--json").stdout)
    from_reports = json.loads(cli("fleet", str(reports), "--json").stdout)
    assert sorted(names[i] for i in from_prometheus["out_of_line"]) == from_reports["out_of_line"] == [
        "node-2x", "node-hot", "node-olddriver", "node-slow", "node-x8"]


def trickle(conn, stop) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
    while not stop.wait(0.2):
        conn.sendall(b" ")


@pytest.mark.parametrize("reply, said", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 200013\r\n\r\n" + b"[" * 200_000 + b"]" * 13, "not an instant-query answer"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "not an HTTP answer"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n{\"status\": \"succ", "cut short"),
    (b"HTTP/1.1 302 Found\r\nLocation: ftp://example.invalid/x\r\nContent-Length: 0\r\n\r\n", "not followed"),
    (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n", "answered 500"),
    (trickle, "within 2 s"),
])
def test_a_broken_prometheus_is_a_named_error_within_the_deadline(reply, said):
    """Tracebacks on deep JSON, a non-HTTP reply and a cut body; a trickled reply ran past 400 s (the timeout was
    per read); a redirect to ftp:// was followed. Each is now a NodecheckError naming it, within one deadline."""
    from nodecheck.core.errors import NodecheckError
    from nodecheck.fleet.prometheus import query

    with ScriptedServer(reply) as server:
        started = time.monotonic()
        with pytest.raises(NodecheckError, match=said):
            query(server.url, "nodecheck_node_fingerprint_info", timeout=2.0)
        assert time.monotonic() - started < 10


def test_the_fleet_command_says_so_and_exits_2():
    with ScriptedServer(b"SSH-2.0-OpenSSH_9.6\r\n") as server:
        run = cli("fleet", "--prometheus", server.url)
    assert run.returncode == 2 and "not an HTTP answer" in run.stderr and "Traceback" not in run.stderr
