"""`nodecheck fleet DIR` (src/nodecheck/fleet) over Reports of real snapshots: eight HGX H100 nodes built from the
published topology and the H100 capture's NVML values, each with an in-node all-reduce; one measures 0.81 of
spec where its peers measure 0.95, one runs another driver, one has a GPU trained at x8. The fleet names those
three and no other; fewer than five nodes of a type are not judged."""

import dataclasses
import json
from pathlib import Path

import pytest
from helpers import cli, hgx_nvml, make_measurement, make_snapshot

from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report


@pytest.fixture(autouse=True)
def terminal_of_80_columns(monkeypatch):
    """Lines wrap at the terminal's width (COLUMNS where there is no terminal, as under a pager)."""
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture(scope="module")
def hgx_report(tmp_path_factory):
    snap = make_snapshot(tmp_path_factory.mktemp("hgx") / "node", topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                         nvml_gpus=hgx_nvml())
    return build_report(SnapshotHost(snap))


def node(report, name: str, ratio: float = 0.95, driver: str | None = None, narrow_gpu: int | None = None,
         power_limit: dict | None = None):
    allreduce = make_measurement("allreduce:node-8-gpus", "allreduce", rate=ratio * 400e9, spec=400e9,
                                 details={"path_kind": "nvlink"})
    gpus = [dataclasses.replace(g, pcie=dict(g.pcie, width_current=8)) if g.index == narrow_gpu else g for g in report.gpus]
    gpus = [dataclasses.replace(g, power_limit_w=(power_limit or {}).get(g.index, g.power_limit_w)) for g in gpus]
    return dataclasses.replace(report, node=dict(report.node, hostname=name, driver_version=driver or report.node["driver_version"]),
                               gpus=gpus, measurements=[allreduce])


def write(directory, reports) -> None:
    directory.mkdir(exist_ok=True)
    for report in reports:
        (directory / f"{report.node['hostname']}.json").write_text(json.dumps(report.to_dict()))


def test_the_fleet_names_the_nodes_out_of_line_and_no_other(tmp_path, hgx_report):
    reports = [node(hgx_report, f"gpu-{i:02d}") for i in range(5)]
    reports += [node(hgx_report, "gpu-slow", ratio=0.81), node(hgx_report, "gpu-olddriver", driver="550.54.15"),
                node(hgx_report, "gpu-x8", narrow_gpu=3)]
    write(tmp_path / "fleet", reports)
    (tmp_path / "fleet" / "garbage.json").write_text("{not json")
    result = cli("fleet", str(tmp_path / "fleet"), "--json")
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert (document["schema"], document["schema_version"], document["nodes"]) == ("nodecheck.fleet", 1, 8)
    assert document["out_of_line"] == ["gpu-olddriver", "gpu-slow", "gpu-x8"]
    assert [s["file"] for s in document["skipped"]] == ["garbage.json"]
    (group,) = document["groups"]
    slow = [o for o in group["outliers"] if o["node"] == "gpu-slow"]
    assert [(o["key"], o["ratio"]) for o in slow] == [("measured:allreduce/allreduce:node-8-gpus", round(0.81 / 0.95, 4))]
    (drift,) = group["drift"]
    assert (drift["node"], drift["field"], drift["value"], drift["majority"], drift["majority_nodes"]) == (
        "gpu-olddriver", "driver", "550.54.15", "580.159.04", 7)

    text = cli("fleet", str(tmp_path / "fleet"))
    lines = text.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert "  gpu-olddriver: driver 550.54.15; 7 of 8 nodes run 580.159.04" in lines


def test_a_node_with_another_nccl_conf_drifts(tmp_path, hgx_report):
    """Seven nodes read one /etc/nccl.conf, one another NCCL_IB_GID_INDEX: named, with the majority's hash."""
    from nodecheck.probes.platform import parse_nccl_conf
    from nodecheck.report.model import Platform

    def conf(report, text):
        return dataclasses.replace(report, platform=Platform(None, False, nccl_conf=parse_nccl_conf(text)))

    reports = [conf(node(hgx_report, f"gpu-{i:02d}"), "NCCL_IB_GID_INDEX=3\n") for i in range(7)]
    reports.append(conf(node(hgx_report, "gpu-gid5"), "NCCL_IB_GID_INDEX=5\n"))
    write(tmp_path / "fleet", reports)
    document = json.loads(cli("fleet", str(tmp_path / "fleet"), "--json").stdout)
    (drift,) = document["groups"][0]["drift"]
    assert (drift["node"], drift["field"], drift["majority_nodes"]) == ("gpu-gid5", "nccl_conf", 7)
    assert len(drift["value"]) == len(drift["majority"]) == 12 and drift["value"] != drift["majority"]
    assert drift["differs"] == ["NCCL_IB_GID_INDEX=5, most: 3"]
    lines = cli("fleet", str(tmp_path / "fleet")).stdout.splitlines()
    assert "    NCCL_IB_GID_INDEX=5, most: 3" in lines and all(len(line) <= 80 for line in lines)


def test_a_node_whose_roce_gid_sits_elsewhere_drifts(tmp_path, hgx_report):
    """Seven nodes' RoCE rail holds NVIDIA/nccl#769's real GID table (NCCL takes GID 3, its IPv4 RoCE v2 entry); one
    holds an IPv6 address before its IPv4 one, which moves that entry to 5. NCCL finds it by itself on each node,
    but a job pinning NCCL_IB_GID_INDEX=3 fails there: named, with what it means."""
    from helpers import make_nic

    from nodecheck.report.model import IbPort

    link_local, ipv4 = "fe80:0000:0000:0000:0ac0:ebff:feda:1cfb", "0000:0000:0000:0000:0000:ffff:c800:d106"
    ipv6 = "2001:0db8:0000:0000:0ac0:ebff:feda:1cfb"

    def roce(report, gids: list[str]):
        port = IbPort("mlx5_bond_0", 1, "ACTIVE", "LinkUp", "200 Gb/sec (4X HDR)", "Ethernet", {},
                      {str(i): gid for i, gid in enumerate(gids)}, {str(i): 1 + i % 2 for i in range(len(gids))})
        nic = make_nic("bond0", kind="ethernet", rdma_device="mlx5_bond_0", ib_ports=[port])
        return dataclasses.replace(report, nics=[nic])

    reports = [roce(node(hgx_report, f"gpu-{i:02d}"), [link_local, link_local, ipv4, ipv4]) for i in range(7)]
    reports.append(roce(node(hgx_report, "gpu-v6"), [link_local, link_local, ipv6, ipv6, ipv4, ipv4]))
    write(tmp_path / "fleet", reports)
    document = json.loads(cli("fleet", str(tmp_path / "fleet"), "--json").stdout)
    (drift,) = document["groups"][0]["drift"]
    assert (drift["node"], drift["field"], drift["value"], drift["majority"], drift["majority_nodes"]) == (
        "gpu-v6", "roce_gid", "5", "3", 7)
    assert drift["differs"] == ["jobs pinning NCCL_IB_GID_INDEX=3 fail their RoCE connections here (NCCL's GID: 5)"]
    lines = cli("fleet", str(tmp_path / "fleet")).stdout.splitlines()
    assert "  gpu-v6: roce_gid 5; 7 of 8 nodes run 3" in lines and all(len(line) <= 80 for line in lines)


def test_fewer_than_five_peers_judge_nothing(tmp_path, hgx_report):
    write(tmp_path / "small", [node(hgx_report, "a"), node(hgx_report, "b"), node(hgx_report, "c", ratio=0.5)])
    result = cli("fleet", str(tmp_path / "small"), "--json")
    (group,) = json.loads(result.stdout)["groups"]
    assert result.returncode == 0 and not group["judged"] and "fewer than 5" in group["why"]


def test_fleet_refuses_what_is_not_a_directory(tmp_path):
    assert cli("fleet", str(tmp_path / "absent")).returncode == 2


def test_fleet_takes_one_source_and_says_what_is_wrong_with_a_prometheus(tmp_path):
    import http.server
    import threading

    from helpers import free_port

    assert cli("fleet").returncode == 2 and cli("fleet", str(tmp_path), "--prometheus", "http://x").returncode == 2
    closed = cli("fleet", "--prometheus", f"http://127.0.0.1:{free_port()}")
    assert closed.returncode == 2 and "Prometheus at" in closed.stderr
    assert "http:// or https://" in cli("fleet", "--prometheus", "file:///etc/passwd").stderr

    class Garbage(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"status": "success", "data": {"result": 5}}')

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        answer = cli("fleet", "--prometheus", f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert answer.returncode == 2 and "not an instant-query answer" in answer.stderr


def test_serve_reads_the_measurements_a_bench_run_wrote(tmp_path, hgx_report):
    """`serve --measurements FILE`: a `bench --json` Report or a `bench --measure-only` document; anything else
    is refused naming the file (serve logs it and keeps what it published)."""
    from nodecheck.bench.plan import read_measurements_file
    from nodecheck.core.errors import NodecheckError

    report = node(hgx_report, "n", ratio=0.9)
    (tmp_path / "bench.json").write_text(json.dumps(dict(report.to_dict(), measured_at=1.79e9)))
    measurements, when = read_measurements_file(tmp_path / "bench.json")
    assert [(m.test, round(m.ratio, 2)) for m in measurements] == [("allreduce", 0.9)] and when == 1.79e9
    (tmp_path / "bad.json").write_text('{"measurements": [{"path": 5}]}')
    with pytest.raises(NodecheckError, match="bad.json"):
        read_measurements_file(tmp_path / "bad.json")
    # found by the served_measurements fuzz target: a measurement that does not say whether it ran was read as
    # ok=None, and publishing it raised TypeError (int(None)) in the daemon's refresher
    document = dict(report.to_dict())
    del document["measurements"][0]["ok"]
    (tmp_path / "no-ok.json").write_text(json.dumps(document))
    with pytest.raises(NodecheckError, match="Measurement.ok: missing"):
        read_measurements_file(tmp_path / "no-ok.json")
    assert measurements[0].details["source"] == f"file {tmp_path / 'bench.json'}"  # where the figure came from


def test_a_measurements_file_from_the_future_or_another_user_is_refused(tmp_path, hgx_report):
    """measured_at 1e12 silenced the stale-bandwidth alert for good, and a file any user wrote became a finding,
    a condition and a taint: a time in the future is refused, and so is a file another user could write."""
    import os
    import shutil
    import tempfile

    from nodecheck.bench.plan import read_measurements_file
    from nodecheck.core.errors import NodecheckError

    report = node(hgx_report, "n", ratio=0.4)
    (tmp_path / "future.json").write_text(json.dumps(dict(report.to_dict(), measured_at=1e12)))
    with pytest.raises(NodecheckError, match="lies in the future"):
        read_measurements_file(tmp_path / "future.json")
    if os.geteuid() != 0:
        return
    shared = Path(tempfile.mkdtemp(prefix="nodecheck-bench-", dir="/tmp"))
    try:
        shared.chmod(0o755)
        planted = shared / "bench.json"
        planted.write_text(json.dumps(dict(report.to_dict(), measured_at=1.79e9)))
        planted.chmod(0o666)
        with pytest.raises(NodecheckError, match="writable by others"):
            read_measurements_file(planted)
        planted.chmod(0o644)
        os.chown(planted, 65534, 65534)
        with pytest.raises(NodecheckError, match="owned by uid 65534"):
            read_measurements_file(planted)
    finally:
        shutil.rmtree(shared)


def test_five_peers_means_six_nodes_as_in_the_prometheus_rules(tmp_path, hgx_report):
    five = [node(hgx_report, f"n{i}") for i in range(4)] + [node(hgx_report, "slow", ratio=0.5)]
    write(tmp_path / "five", five)
    assert not json.loads(cli("fleet", str(tmp_path / "five"), "--json").stdout)["groups"][0]["judged"]
    write(tmp_path / "six", five + [node(hgx_report, "n4")])
    assert json.loads(cli("fleet", str(tmp_path / "six"), "--json").stdout)["out_of_line"] == ["slow"]


def test_the_peer_alert_uses_the_fleet_commands_bars():
    """NodecheckBelowPeers and `nodecheck fleet` judge a node by the same fraction of its type's median and the
    same number of peers: a change to one that misses the other fails here."""
    import re

    import yaml
    from helpers import REPO

    from nodecheck.fleet import DEFAULT_FRACTION, MIN_PEERS

    groups = yaml.safe_load((REPO / "deploy/prometheus/nodecheck-rules.yml").read_text())["groups"]
    (expr,) = [r["expr"] for g in groups for r in g["rules"] if r.get("alert") == "NodecheckBelowPeers"]
    assert float(re.search(r"to_fleet_median < ([0-9.]+)", expr)[1]) == DEFAULT_FRACTION
    assert int(re.search(r"fleet_nodes >= (\d+)", expr)[1]) == MIN_PEERS + 1


def braked(report, name: str, ns: dict[int, dict] | None = None, uptime: float = 864000.0):
    """A node of `report` up `uptime` seconds whose GPUs' clock event counters (ns) are `ns` per GPU, else 0 each, as
    the H100 capture reads them."""
    from nodecheck.report.events import History
    from nodecheck.report.model import GpuSignals

    quiet = {"hw_thermal_slowdown": 0, "hw_power_brake_slowdown": 0, "sw_thermal_slowdown": 0}
    gpus = [dataclasses.replace(g, signals=dataclasses.replace(g.signals or GpuSignals(),
                                                               clock_event_ns=quiet | (ns or {}).get(g.index, {})))
            for g in report.gpus]
    return dataclasses.replace(node(report, name), gpus=gpus, history=History("boot", [], [], uptime))


def test_a_node_whose_gpu_brakes_more_than_its_peers_is_out_of_line(tmp_path, hgx_report):
    """Ten days up: gpu-hot's gpu3 spent two of them on its HW thermal brake (20%), gpu-04's gpu1 0.9% on its power
    brake (within a point of the peers' median, 0: each brake of its own, below the per-sample error, passes); the
    SW thermal slowdown is the driver's and does not count. The Prometheus alert judges by the same margin."""
    import re

    import yaml
    from helpers import REPO

    from nodecheck.fleet import HIGHER_IS_WORSE

    day = 86400 * 10**9
    reports = [braked(hgx_report, f"gpu-{i:02d}", {2: {"sw_thermal_slowdown": 3 * day}}) for i in range(4)]
    reports += [braked(hgx_report, "gpu-04", {1: {"hw_power_brake_slowdown": int(0.009 * 10 * day)}}),
                braked(hgx_report, "gpu-hot", {3: {"hw_thermal_slowdown": 2 * day}})]
    write(tmp_path / "fleet", reports)
    result = json.loads(cli("fleet", str(tmp_path / "fleet"), "--json").stdout)
    (group,) = result["groups"]
    assert result["out_of_line"] == ["gpu-hot"]
    assert [(o["key"], o["value"], o["median"]) for o in group["outliers"]] == [("fact:gpu_hw_braked_pct_max", 20.0, 0.0)]
    assert "gpu-hot: gpu_hw_braked_pct_max 20, peers' median 0" in cli("fleet", str(tmp_path / "fleet")).stdout

    groups = yaml.safe_load((REPO / "deploy/prometheus/nodecheck-rules.yml").read_text())["groups"]
    (expr,) = [r["expr"] for g in groups for r in g["rules"] if r.get("alert") == "NodecheckClockBrakesAbovePeers"]
    assert float(re.search(r"fleet_median \+ ([0-9.]+)\)", expr)[1]) == HIGHER_IS_WORSE["fact:gpu_hw_braked_pct_max"]


def test_a_node_without_uptime_or_counters_says_no_brake_share(hgx_report):
    from nodecheck.fleet import node_view

    assert "fact:gpu_hw_braked_pct_max" not in node_view(node(hgx_report, "no-history"), "x").values
    assert node_view(braked(hgx_report, "fresh", uptime=0.0), "x").values.get("fact:gpu_hw_braked_pct_max") is None
    assert node_view(braked(hgx_report, "quiet"), "x").values["fact:gpu_hw_braked_pct_max"] == 0.0


def test_a_report_whose_gpus_links_or_paths_lack_their_names_is_skipped_saying_which(tmp_path, hgx_report):
    """What the fleet fuzz target found (tests/fuzz/targets.py fleet_report): a node's file whose GPU has no index,
    whose link has no type, whose measurement has no path crashed `nodecheck fleet` with a TypeError while it
    sorted them. Such a file is not a Report: skipped, naming the field; the other nodes are still compared."""
    reports = [node(hgx_report, f"gpu-{i:02d}") for i in range(5)]
    write(tmp_path / "fleet", reports)
    good = json.loads((tmp_path / "fleet" / "gpu-00.json").read_text())
    broken = {"no-index.json": ("gpus", 3, "index"), "no-type.json": ("links", 0, "type"),
              "no-path.json": ("measurements", 0, "path"), "no-kind.json": ("nics", 1, "kind")}
    for name, (section, at, key) in broken.items():
        document = json.loads(json.dumps(good))
        del document[section][at][key]
        (tmp_path / "fleet" / name).write_text(json.dumps(document))
    result = cli("fleet", str(tmp_path / "fleet"), "--json")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    skipped = {s["file"]: s["why"] for s in json.loads(result.stdout)["skipped"]}
    assert skipped == {name: f"not a nodecheck Report: {why}" for name, why in (
        ("no-index.json", "Gpu.index: missing"), ("no-type.json", "Link.type: missing"),
        ("no-path.json", "Measurement.path: missing"), ("no-kind.json", "Nic.kind: missing"))}
    assert json.loads(result.stdout)["nodes"] == 5


def test_the_fleets_own_output_beside_the_reports_is_skipped_not_a_node(tmp_path, hgx_report):
    """Read leniently, any JSON object passes as a Report with no GPUs: `fleet --json > reports/fleet.json` made
    the next run count a node of its own sku (and `inspect --from` show an empty node). A document whose schema is
    not nodecheck.report is skipped, naming its schema; so is one with none."""
    write(tmp_path / "fleet", [node(hgx_report, f"gpu-{i:02d}") for i in range(6)])
    first = cli("fleet", str(tmp_path / "fleet"), "--json")
    (tmp_path / "fleet" / "fleet.json").write_text(first.stdout)
    (tmp_path / "fleet" / "other.json").write_text('{"node": {"hostname": "x"}}')
    result = cli("fleet", str(tmp_path / "fleet"), "--json")
    out = json.loads(result.stdout)
    assert out["nodes"] == 6 and [g["sku"] for g in out["groups"]] == [g["sku"] for g in json.loads(first.stdout)["groups"]]
    assert {s["file"]: s["why"] for s in out["skipped"]} == {
        "fleet.json": "not a nodecheck Report: its schema is 'nodecheck.fleet', not 'nodecheck.report'",
        "other.json": "not a nodecheck Report: it has no schema"}


def test_one_machine_is_one_vote_its_newest_report(tmp_path, hgx_report):
    """A directory that collects Reports over days holds several of one machine (same host name, same GPU UUIDs):
    each counted as a peer, three machines read as six and were judged, and a repaired node stayed out of line
    for its old Report. Now the newest Report of a machine is its vote, the older ones skipped saying so; two
    machines that call themselves the same keep a vote each."""
    def at(report, when: float):
        return dataclasses.replace(report, generated_at=when)

    three = [node(hgx_report, f"gpu-{i}") for i in range(3)]
    write(tmp_path / "days", [at(r, 1.8e9) for r in three])
    for r in three:
        (tmp_path / "days" / f"{r.node['hostname']}-monday.json").write_text(json.dumps(at(r, 1.7e9).to_dict()))
    result = json.loads(cli("fleet", str(tmp_path / "days"), "--json").stdout)
    assert result["nodes"] == 3 and not result["groups"][0]["judged"]
    assert {s["file"]: s["why"] for s in result["skipped"]}["gpu-0-monday.json"] == (
        "an older Report of gpu-0: gpu-0.json has the same GPUs")

    six = [node(hgx_report, f"gpu-{i}") for i in range(6)]
    write(tmp_path / "repaired", [at(r, 1.8e9) for r in six])
    slow_before = at(node(hgx_report, "gpu-5", ratio=0.5), 1.7e9)
    (tmp_path / "repaired" / "a-gpu-5-before-repair.json").write_text(json.dumps(slow_before.to_dict()))
    result = json.loads(cli("fleet", str(tmp_path / "repaired"), "--json").stdout)
    assert (result["nodes"], result["out_of_line"]) == (6, [])
    assert [s["file"] for s in result["skipped"]] == ["a-gpu-5-before-repair.json"]

    other = dataclasses.replace(six[0], gpus=[dataclasses.replace(g, uuid=f"GPU-other-{g.index}") for g in six[0].gpus])
    (tmp_path / "repaired" / "gpu-0-twin.json").write_text(json.dumps(at(other, 1.8e9).to_dict()))
    result = json.loads(cli("fleet", str(tmp_path / "repaired"), "--json").stdout)
    assert result["nodes"] == 7 and {"gpu-0", "gpu-0 (gpu-0.json)"} <= set(result["groups"][0]["nodes"])


def test_a_jobs_report_speaks_for_its_own_node_only(tmp_path, hgx_report, monkeypatch):
    """Rank 0's Report of a job across nodes holds every node's in-node figures, named "gpu-05/gpu0:host". Read as rank
    0's own (the fleet took the lowest per path), gpu-05's slow copy put rank 0's node out of line too. Another node's
    figures are now that node's, from its own Report; so in what Prometheus holds of rank 0's instance."""
    def h2d(path: str, ratio: float):
        return make_measurement(path, "h2d", rate=ratio * 55e9, spec=55e9, direction="unidirectional",
                                details={"path_kind": "pcie"})

    reports = [dataclasses.replace(node(hgx_report, f"gpu-{i:02d}"), measurements=[h2d("gpu0:host", 0.85)]) for i in range(6)]
    rank0 = reports[0]
    reports[0] = dataclasses.replace(rank0, measurements=rank0.measurements + [h2d("gpu-05/gpu0:host", 0.3)])
    reports[5] = dataclasses.replace(reports[5], measurements=[h2d("gpu0:host", 0.3)])
    write(tmp_path / "job", reports)
    result = json.loads(cli("fleet", str(tmp_path / "job"), "--json").stdout)
    assert result["out_of_line"] == ["gpu-05"]
    (group,) = result["groups"]
    assert {o["key"] for o in group["outliers"]} == {"measured:h2d/gpu0:host"}

    from nodecheck.fleet import prometheus

    def query(base, promql, timeout=1.0):
        if promql == "nodecheck_node_fingerprint_info":
            return [{"metric": {"instance": "gpu-00:10042", "sku": "8x H100"}, "value": [0, "1"]}]
        if "nodecheck_bandwidth_ratio" in promql:
            return [{"metric": {"instance": "gpu-00:10042", "test": "h2d", "path": path}, "value": [0, value]}
                    for path, value in (("gpu0:host", "0.85"), ("gpu-05/gpu0:host", "0.3"))]
        return []

    monkeypatch.setattr(prometheus, "query", query)
    (view,) = prometheus.node_views("http://prometheus:9090")
    assert view.values == {"measured:h2d/gpu0:host": 0.85}


def test_serve_publishes_a_jobs_report_for_its_own_node_only(tmp_path, hgx_report):
    """`serve --measurements` on rank 0's node, reading its job's Report: gpu-05's slow copy was published and judged
    as this node's, a bandwidth finding here (and with --kubernetes-taint, this node tainted for another's fault)."""
    from nodecheck.bench.plan import read_measurements_file
    from nodecheck.verdicts.bandwidth import with_measurements

    slow_elsewhere = make_measurement("gpu-05/gpu0:host", "h2d", rate=0.3 * 55e9, spec=55e9, direction="unidirectional",
                                      details={"path_kind": "pcie", "node": "gpu-05"})
    job = node(hgx_report, "gpu-00")
    job = dataclasses.replace(job, measurements=job.measurements + [slow_elsewhere])
    (tmp_path / "job.json").write_text(json.dumps(job.to_dict()))
    measurements, _ = read_measurements_file(tmp_path / "job.json", "gpu-00")
    assert [m.path for m in measurements] == ["allreduce:node-8-gpus"]
    judged = with_measurements(hgx_report, measurements, 1.8e9, None)
    assert [f for f in judged.findings if f.kind == "bandwidth_below_spec"] == []


def test_a_gpu_whose_power_limit_was_lowered_is_out_of_line(tmp_path, hgx_report):
    """`nvidia-smi -pl 500` on one GPU of one node: its busy GPU sits on its power cap (which is no finding on its
    own), and the node's lowest power limit differs from its peers', all at the H100's 700 W."""
    assert {g.power_limit_w for g in hgx_report.gpus} == {700.0}
    reports = [node(hgx_report, f"gpu-{i:02d}") for i in range(5)] + [node(hgx_report, "gpu-capped", power_limit={6: 500.0})]
    write(tmp_path / "fleet", reports)
    result = json.loads(cli("fleet", str(tmp_path / "fleet"), "--json").stdout)
    (group,) = result["groups"]
    assert result["out_of_line"] == ["gpu-capped"]
    assert [(o["key"], o["value"], o["median"]) for o in group["outliers"]] == [("fact:gpu_power_limit_min_w", 500.0, 700.0)]


def test_a_node_with_a_gpu_in_mig_mode_is_grouped_apart_and_said(tmp_path, hgx_report):
    """A GPU in MIG mode has no NVLink: its node is no peer of the others (its own sku), so nothing judges it;
    the fleet says how many nodes of the same GPUs have no GPU in MIG mode, and that such a GPU has no NVLink."""
    reports = [node(hgx_report, f"gpu-{i:02d}") for i in range(6)]
    mig = node(hgx_report, "gpu-mig")
    mig = dataclasses.replace(mig, gpus=[dataclasses.replace(g, mig_enabled=g.index == 3) for g in mig.gpus])
    write(tmp_path / "fleet", reports + [mig])
    document = json.loads(cli("fleet", str(tmp_path / "fleet"), "--json").stdout)
    (apart,) = [g for g in document["groups"] if g["nodes"] == ["gpu-mig"]]
    assert apart["sku"] == "7x NVIDIA H100 80GB HBM3 + 1x NVIDIA H100 80GB HBM3 (MIG)" and not apart["judged"]
    assert apart["why"] == ("1 node(s): fewer than 5 peers each, nothing judged; 6 node(s) of 8x NVIDIA H100 80GB HBM3 have "
                            "no GPU in MIG mode; a GPU in MIG mode by mistake has no NVLink: [gpus] mig requires a mode")
    (peers,) = [g for g in document["groups"] if g["sku"] == "8x NVIDIA H100 80GB HBM3"]
    assert peers["judged"] and "gpu-mig" not in peers["nodes"]
    lines = cli("fleet", str(tmp_path / "fleet")).stdout.splitlines()  # at a terminal: each clause whole, within 80
    assert "  6 node(s) of 8x NVIDIA H100 80GB HBM3 have no GPU in MIG mode" in lines
    assert "  a GPU in MIG mode by mistake has no NVLink: [gpus] mig requires a mode" in lines
    assert all(len(line) <= 80 for line in lines), lines


def test_a_node_that_lost_a_gpu_is_named_though_it_has_no_peers_of_its_own(tmp_path, hgx_report):
    """One GPU gone from the bus altogether (NVML and nvidia-smi list seven, no Xid): its sku, "7x ...", is a group
    of one, which judged nothing and named no one, while six nodes of eight such GPUs stood beside it."""
    reports = [node(hgx_report, f"gpu-{i:02d}") for i in range(6)]
    short = node(hgx_report, "gpu-short")
    short = dataclasses.replace(short, gpus=[g for g in short.gpus if g.index != 5])
    write(tmp_path / "fleet", reports + [short])
    result = cli("fleet", str(tmp_path / "fleet"), "--json")
    document = json.loads(result.stdout)
    assert document["out_of_line"] == ["gpu-short"] and result.returncode == 1
    (apart,) = [g for g in document["groups"] if g["nodes"] == ["gpu-short"]]
    assert apart["why"].endswith("; 6 node(s) of 8x NVIDIA H100 80GB HBM3: 7 of 8 GPUs here"
                                 "; a GPU fell off the bus or never came up: `nodecheck inspect` there")
    assert [(d["node"], d["field"], d["value"], d["majority"]) for d in apart["drift"]] == [("gpu-short", "gpus", "7", "8")]
    lines = cli("fleet", str(tmp_path / "fleet")).stdout.splitlines()
    assert "  gpu-short: 7 gpus; 6 of 7 nodes of this model have 8" in lines and all(len(line) <= 80 for line in lines)


def test_a_smaller_type_with_peers_of_its_own_is_no_node_short_of_gpus(tmp_path, hgx_report):
    """Six 4-GPU nodes of the same model beside six 8-GPU ones: two types, each judged, no one named for its count."""
    reports = [node(hgx_report, f"gpu-{i:02d}") for i in range(6)]
    halves = [node(hgx_report, f"half-{i:02d}") for i in range(6)]
    halves = [dataclasses.replace(r, gpus=r.gpus[:4]) for r in halves]
    write(tmp_path / "fleet", reports + halves)
    document = json.loads(cli("fleet", str(tmp_path / "fleet"), "--json").stdout)
    assert document["out_of_line"] == [] and all(g["judged"] for g in document["groups"])


def test_a_node_without_the_conf_file_is_told_what_it_lacks():
    """Six nodes whose Reports hold one file, one node without it: its drift lists the settings it lacks; a fleet
    read from Prometheus (hashes only) has nothing to list."""
    from nodecheck.fleet import NodeView, compare

    def view(name, conf, digest):
        return NodeView(name, "8x H100", {"sku": "8x H100", "nccl_conf": digest}, {}, conf)

    views = [view(f"n{i}", {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": "3"}, "aaaaaaaaaaaa") for i in range(6)]
    (group,) = compare(views + [view("bare", None, "")])
    (drift,) = group.drift
    assert drift.differs == ["NCCL_IB_GID_INDEX=(unset), most: 3", "NCCL_IB_HCA=(unset), most: =mlx5_0,mlx5_1"]
    (group,) = compare([view(v.name, None, v.fingerprint["nccl_conf"]) for v in views] + [view("bare", None, "")])
    assert group.drift[0].differs == []


def test_a_node_left_in_exclusive_process_mode_drifts_and_default_ones_keep_their_hash(tmp_path, hgx_report):
    """Alike within itself, so no in-node check names it: one node of eight whose GPUs were all set to
    exclusive_process (`nvidia-smi -c 3`) fails the jobs of several processes per GPU its peers run. Its topology
    hash differs; the default mode leaves every other node's hash as it was before compute modes were read."""
    from nodecheck.assemble.fingerprint import topology_facts, topology_hash

    default = [dataclasses.replace(node(hgx_report, f"gpu-{i:02d}"),
                                   gpus=[dataclasses.replace(g, compute_mode="default") for g in hgx_report.gpus])
               for i in range(7)]
    unread = dataclasses.replace(hgx_report, gpus=[dataclasses.replace(g, compute_mode=None) for g in hgx_report.gpus])
    assert topology_hash(default[0]) == topology_hash(unread) and "compute_mode" not in topology_facts(default[0])
    exclusive = dataclasses.replace(node(hgx_report, "gpu-exclusive"),
                                    gpus=[dataclasses.replace(g, compute_mode="exclusive_process") for g in hgx_report.gpus])
    write(tmp_path / "fleet", [*default, exclusive])
    (drift,) = json.loads(cli("fleet", str(tmp_path / "fleet"), "--json").stdout)["groups"][0]["drift"]
    assert (drift["node"], drift["field"], drift["majority_nodes"]) == ("gpu-exclusive", "topology", 7)


def test_judging_nothing_is_exit_2_with_a_sentence(tmp_path):
    """An empty directory, or one of files that are no Reports, is no fleet: never "every node in line"."""
    (tmp_path / "empty").mkdir()
    result = cli("fleet", str(tmp_path / "empty"))
    assert result.returncode == 2 and result.stdout == ""
    assert "nothing to compare" in result.stderr and "holds no Report" in result.stderr
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "a.json").write_text("{}")
    (junk / "pyproject.json").write_text("[project]\nname = 'x'\n")
    result = cli("fleet", str(junk), "--json")
    assert result.returncode == 2 and result.stdout == ""
    assert "2 file(s) skipped" in result.stderr and "skipped a.json: not a nodecheck Report" in result.stderr


def test_skip_reasons_wrap_at_the_terminal_and_names_are_made_plain(tmp_path, monkeypatch, hgx_report):
    """A long reason wraps between words at the terminal's width, the file's name whole; a name holding a
    terminal escape (OSC: set the window title) is printed with '?' for its control characters."""
    write(tmp_path / "fleet", [node(hgx_report, f"gpu-{i:02d}") for i in range(5)])
    long_name = "a-report-from-the-night-sweep-of-rack-17-" + "x" * 30 + ".json"
    (tmp_path / "fleet" / long_name).write_text("{" + '"a": 1, ' * 40)
    (tmp_path / "fleet" / "ev\x1b]0;owned\x07il.json").write_text("{}")
    monkeypatch.setenv("COLUMNS", "60")
    lines = cli("fleet", str(tmp_path / "fleet")).stdout.splitlines()
    assert not any("\x1b" in line or "\x07" in line for line in lines)
    assert any("ev?]0;owned?il.json" in line for line in lines)
    (at,) = [n for n, line in enumerate(lines) if long_name in line]  # whole on one line, not cut
    assert "skipped" in lines[at - 1] + lines[at] and lines[at + 1].startswith("  ")  # its reason wrapped below
    assert all(len(line) <= 60 or long_name in line for line in lines), lines


def test_topology_drift_says_which_field_differs(tmp_path, hgx_report):
    """The drift `config check` names as `mlx5_3 200 Gbit/s < 400 Gbit/s`, fleet names too: not two bare hashes
    but the NIC that differs, and a GPU whose PCIe link or NUMA node is not its peers'."""
    def with_nics(report, slow: str | None = None):
        nics = [dataclasses.replace(n, kind="ib", speed_mbps=200_000 if n.name == slow else 400_000) for n in report.nics]
        return dataclasses.replace(report, nics=nics)

    peers = [with_nics(node(hgx_report, f"gpu-{i:02d}")) for i in range(6)]
    slow = with_nics(node(hgx_report, "gpu-slow-nic"), slow="mlx5_3")
    gpus = [dataclasses.replace(g, numa_node=1 - (g.numa_node or 0)) if g.index == 2 else g for g in hgx_report.gpus]
    moved = dataclasses.replace(with_nics(node(hgx_report, "gpu-moved")), gpus=gpus)
    write(tmp_path / "fleet", [*peers, slow, moved])
    drift = {d["node"]: d for d in json.loads(cli("fleet", str(tmp_path / "fleet"), "--json").stdout)["groups"][0]["drift"]}
    assert drift["gpu-slow-nic"]["field"] == "topology"
    assert drift["gpu-slow-nic"]["differs"] == ["mlx5_3 ib 200 Gbit/s, most: ib 400 Gbit/s"]
    assert drift["gpu-moved"]["differs"] == [f"gpu2 NUMA node {gpus[2].numa_node}, most: NUMA node {hgx_report.gpus[2].numa_node}"]
    lines = cli("fleet", str(tmp_path / "fleet")).stdout.splitlines()
    assert "    mlx5_3 ib 200 Gbit/s, most: ib 400 Gbit/s" in lines


# Run as `python -c` with the pool's bar lowered: a fleet of 8 files read by a pool of processes, as a fleet of
# hundreds is. A pool is never started inside the test runner (a fork of a process with threads can hang).
POOLED = """import os, sys
import nodecheck.cli.fleet as fleet
fleet.PARALLEL_FROM = 2
if sys.argv[1] == "dies":  # a reader killed (as the kernel's out-of-memory killer does)
    def dies(path):
        os._exit(9)
    dies.__module__, dies.__qualname__ = fleet.__name__, "_node"
    fleet._node = dies
sys.argv = ["nodecheck", "fleet", *sys.argv[2:]]
from nodecheck.cli import main
main()
"""


def test_reports_read_by_a_pool_of_processes_compare_as_read_in_one(tmp_path, hgx_report):
    """From PARALLEL_FROM files on, the Reports are read on every CPU (a fleet of 10,000 took 23 s on one):
    the same comparison, skipped files and votes in the same order as read in one process."""
    import os
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the Reports are read in one process")
    reports = [node(hgx_report, f"gpu-{i:02d}") for i in range(6)] + [node(hgx_report, "gpu-slow", ratio=0.5)]
    write(tmp_path / "fleet", reports)
    (tmp_path / "fleet" / "garbage.json").write_text("{not json")
    (tmp_path / "fleet" / "gpu-00-old.json").write_text(json.dumps(dataclasses.replace(reports[0], generated_at=1.0).to_dict()))
    alone = cli("fleet", str(tmp_path / "fleet"), "--json")
    pooled = subprocess.run([sys.executable, "-c", POOLED, "pooled", str(tmp_path / "fleet"), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert (pooled.returncode, pooled.stdout) == (alone.returncode, alone.stdout) == (1, alone.stdout), pooled.stderr
    assert json.loads(alone.stdout)["out_of_line"] == ["gpu-slow"]
    assert [s["file"] for s in json.loads(alone.stdout)["skipped"]] == ["garbage.json", "gpu-00-old.json"]

    died = subprocess.run([sys.executable, "-c", POOLED, "dies", str(tmp_path / "fleet"), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert (died.returncode, died.stdout) == (2, ""), died.stderr
    assert "a process reading the Reports died (out of memory?): nothing compared" in died.stderr
    assert "Traceback" not in died.stderr


def test_each_gpus_own_figures_are_compared_with_the_same_gpu_of_its_peers(tmp_path, hgx_report):
    """bench --tests hbm,gemm per GPU across the fleet: gpu5 of one node reads 0.86 of its peers' gpu5 on memory
    bandwidth (each node's GPUs alike within it, so no sibling verdict there); a model without a spec (ratio
    null) is compared by its figure."""
    from nodecheck.report.model import Measurement

    def with_gpu_tests(report, name, hbm5=2.8e12, spec=3.35e12):
        hbm = [Measurement.measured(f"gpu{i}:memory", "hbm", hbm5 if i == 5 else 2.8e12, spec, 1 << 30, "copy", "read+write",
                                    {"path_kind": "memory"}) for i in range(8)]
        gemm = [Measurement.computed(f"gpu{i}:compute", "gemm", 797.5e12, 989.4e12, 1, "matmul", "bf16 dense",
                                     {"path_kind": "compute"}) for i in range(8)]
        base = node(report, name)
        return dataclasses.replace(base, measurements=base.measurements + hbm + gemm)

    write(tmp_path / "fleet", [with_gpu_tests(hgx_report, f"gpu-{i:02d}") for i in range(6)]
          + [with_gpu_tests(hgx_report, "gpu-weak5", hbm5=2.4e12)])
    document = json.loads(cli("fleet", str(tmp_path / "fleet"), "--json").stdout)
    (group,) = document["groups"]
    assert document["out_of_line"] == ["gpu-weak5"]
    assert [(o["key"], o["ratio"]) for o in group["outliers"]] == [("measured:hbm/gpu5:memory", round(2.4 / 2.8, 4))]

    write(tmp_path / "nospec", [with_gpu_tests(hgx_report, f"gpu-{i:02d}", spec=None) for i in range(6)]
          + [with_gpu_tests(hgx_report, "gpu-weak5", hbm5=2.4e12, spec=None)])
    document = json.loads(cli("fleet", str(tmp_path / "nospec"), "--json").stdout)
    assert document["out_of_line"] == ["gpu-weak5"]
    assert document["groups"][0]["medians"]["measured:hbm/gpu5:memory"] == 2.8e12
