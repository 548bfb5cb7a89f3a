"""Subnet proximity of a job's peers: node lists expanded by python-hostlist, the subnet and round-trip
judgement (pure), and `nodecheck prolog` inside network namespaces with peers in this node's subnet,
behind a router, and nowhere."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import requires_root

from nodecheck.core.errors import ParseError
from nodecheck.slurm.proximity import (
    Peer,
    ProximityPolicy,
    chosen_peers,
    collect_peers,
    expand_nodelist,
    in_subnet,
    judge_peers,
    nodelist_size,
)


def test_expand_slurm_node_lists():
    assert expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_nodelist("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    for bad in ("gpu[01-", "gpu[3-1]"):
        with pytest.raises(ParseError, match="cannot be expanded"):
            expand_nodelist(bad)


def test_in_subnet_needs_the_network_and_no_gateway():
    networks = ["198.18.0.1/24", "fe80::1/64"]
    assert in_subnet("198.18.0.7", networks, None) == (True, "198.18.0.0/24")
    assert in_subnet("198.18.1.2", networks, "198.18.0.254") == (False, "198.18.0.0/24")
    assert in_subnet("198.18.0.7", networks, "198.18.0.254") == (False, "198.18.0.0/24")  # policy-routed away
    assert in_subnet("2001:db8::5", networks, None) == (False, None)  # link-local is no subnet


def test_judging_far_and_slow_peers():
    policy = ProximityPolicy()
    peers = [Peer("a", "10.0.0.2", "ib0", "10.0.0.0/24", True, None, 0.08),
             Peer("b", "10.0.0.3", "ib0", "10.0.0.0/24", True, None, 0.09),
             Peer("c", "10.0.0.4", "ib0", "10.0.0.0/24", True, None, 0.10),
             Peer("d", "10.0.1.9", "ib0", "10.0.0.0/24", False, "10.0.0.254", 0.35),
             Peer("e", "10.0.0.5", "ib0", "10.0.0.0/24", True, None, 2.5),
             Peer("f", error="f does not resolve (Name or service not known)")]
    found = {(f.kind, f.subject): f for f in judge_peers(peers, policy)}
    assert set(found) == {("peer_outside_subnet", "peer:d"), ("peer_slow", "peer:e"), ("peer_unreachable", "peer:f")}
    assert "outside 10.0.0.0/24 on ib0 via 10.0.0.254" in found["peer_outside_subnet", "peer:d"].message
    assert found["peer_slow", "peer:e"].expected == "0.1 ms" and all(f.severity == "warning" for f in found.values())
    # 3.5x the median but only 0.25 ms above it: under the floor, not "far slower"
    close = [Peer(n, "10.0.0.9", "ib0", "10.0.0.0/24", True, None, r) for n, r in (("x", 0.1), ("y", 0.1), ("z", 0.35))]
    assert judge_peers(close, policy) == []


@pytest.fixture
def cluster():
    requires_root()
    from netns_cluster import Cluster

    with Cluster(2) as cluster:
        far_ns, far_address = cluster.add_routed_node()
        names = {"nodea": cluster.addresses[0], "nodeb": cluster.addresses[1], "nodec": far_address,
                 "nodeghost": "198.18.2.9"}  # resolves, but no route leads there
        hosts_dir = Path("/etc/netns") / cluster.nodes[0]  # `ip netns exec` binds this over /etc/hosts
        hosts_dir.mkdir(parents=True)
        try:
            (hosts_dir / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in names.items()))
            yield cluster
        finally:
            shutil.rmtree(hosts_dir, ignore_errors=True)


def test_prolog_reports_peers_in_and_out_of_the_subnet(cluster, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[proximity]\nseverity = "error"\nconnect_timeout_s = 1\n[prolog]\ntimeout_s = 10\n')
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_NODELIST": "nodea,nodeb,nodec,nodeghost", "SLURMD_NODENAME": "nodea",
           "STATE_DIRECTORY": os.environ["STATE_DIRECTORY"]}
    run = subprocess.run(["ip", "netns", "exec", cluster.nodes[0], "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                          str(Path(sys.executable).parent / "nodecheck"), "prolog", "--dry-run", "--json", "--config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    outcome = json.loads(run.stdout)
    proximity = next(c for c in outcome["checks"] if c["name"] == "proximity")
    peers = {p["name"]: p for p in proximity["details"]}
    assert set(peers) == {"nodeb", "nodec", "nodeghost"}  # nodea is this node
    assert peers["nodeb"]["same_subnet"] and peers["nodeb"]["interface"] == "eth0" and peers["nodeb"]["subnet"] == "198.18.0.0/24"
    assert 0 < peers["nodeb"]["rtt_ms"] < 50  # slurmd's port is closed there: the RST is the answer
    assert peers["nodec"]["same_subnet"] is False and peers["nodec"]["gateway"] == "198.18.0.254"
    assert peers["nodec"]["rtt_ms"] > 0  # reachable through the router
    assert "no route" in peers["nodeghost"]["error"] or "unreachable" in peers["nodeghost"]["error"]
    kinds = {(f["kind"], f["subject"]) for f in outcome["failing"]}
    assert kinds == {("peer_outside_subnet", "peer:nodec"), ("peer_unreachable", "peer:nodeghost")}
    assert outcome["action"] == "drain" and outcome["detail"].startswith("nodecheck: peer:")


def test_each_node_examines_the_peers_after_it_and_is_examined_by_as_many():
    names = expand_nodelist("gpu[001-100]")
    chosen = {name: chosen_peers(names, {name}, 16) for name in names}
    assert chosen["gpu010"] == [f"gpu{i:03d}" for i in range(11, 27)]
    assert chosen["gpu095"][-11:] == [f"gpu{i:03d}" for i in range(1, 12)]  # round the end of the list
    examined_by = {name: sum(name in peers for peers in chosen.values()) for name in names}
    assert set(examined_by.values()) == {16}
    assert chosen_peers(names, {"gpu010"}, 0) == names[10:] + names[:9]  # 0: every peer
    assert chosen_peers(["a", "b", "c"], {"b"}, 16) == ["c", "a"]  # a small job: all of it
    assert chosen_peers(["a", "b", "c"], {"elsewhere"}, 2) == ["a", "b"]  # this node not in the list
    from nodecheck.config import parse

    assert parse({"proximity": {"max_peers": 0}}, "t.toml").proximity.max_peers == 0
    assert parse({}, "t.toml").proximity.max_peers == 16


def test_a_jobs_prologs_open_a_bounded_number_of_connections_on_each_peer():
    """Every node of a 40-node job examines its peers, as the prolog does at the job's start, against a real
    listener that counts the connects each address receives (the nodes are loopback addresses, 127.0.0.2-41).
    Each connect costs two error lines in a real slurmd's log ("Zero Bytes were transmitted or received"):
    examining every peer made 39 x 3 connects on each node, 117 x (N-1) lines on a 512-node job; now 16 x 3
    whatever the job's size."""
    import socket
    import threading
    from collections import Counter

    from nodecheck.host.live import LiveHost
    from nodecheck.host.network import CONNECT_ATTEMPTS

    received: Counter = Counter()
    with socket.create_server(("0.0.0.0", 0), backlog=1024) as server:
        server.settimeout(0.2)
        done = threading.Event()

        def count() -> None:
            while not done.is_set():
                try:
                    conn, _ = server.accept()
                except (TimeoutError, socket.timeout):
                    continue
                received[conn.getsockname()[0]] += 1
                conn.close()

        counter = threading.Thread(target=count, daemon=True)
        counter.start()
        policy = ProximityPolicy(port=server.getsockname()[1], connect_timeout_s=5)
        names = expand_nodelist("127.0.0.[2-41]")
        try:
            for name in names:
                peers = collect_peers(LiveHost(), names, {name}, policy, 60)
                assert len(peers) == 16 and all(p.rtt_ms is not None and p.same_subnet for p in peers), peers
            deadline = time.monotonic() + 30
            while sum(received.values()) < 40 * 16 * CONNECT_ATTEMPTS and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            done.set()
            counter.join(timeout=5)
    assert received == Counter({name: 16 * CONNECT_ATTEMPTS for name in names})


def test_huge_node_lists_are_refused_without_expanding():
    assert nodelist_size("gpu[01-03,07],login1") == 5 and nodelist_size("rack[1-2]-n[1-2]") == 4
    for huge in ("n[1-10000000]", "a[1-1000]b[1-1000]", "n[0-99999999999999999999]"):
        with pytest.raises(ParseError, match="more than 65536 nodes, not expanded"):
            expand_nodelist(huge)


def test_a_dead_resolver_and_a_large_job_never_drain_and_end_in_budget(tmp_path):
    """100 peers that resolve through a DNS server that never answers: the prolog ends within its
    budget (here 4 s; with slack for a loaded machine), drains nothing, and says what it could not do."""
    requires_root()
    from netns_cluster import Cluster

    with Cluster(1) as cluster:
        etc = Path("/etc/netns") / cluster.nodes[0]  # `ip netns exec` binds these over /etc/hosts and resolv.conf
        etc.mkdir(parents=True)
        try:
            (etc / "hosts").write_text("127.0.0.1 localhost\n198.18.0.1 nodea\n")
            (etc / "resolv.conf").write_text("nameserver 198.18.0.99\noptions timeout:5 attempts:2\n")  # nobody there
            config = tmp_path / "config.toml"
            config.write_text("[prolog]\ntimeout_s = 4\n")
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_NODELIST": "nodea,gpu[001-100]", "SLURMD_NODENAME": "nodea",
                   "STATE_DIRECTORY": os.environ["STATE_DIRECTORY"]}
            started = time.monotonic()
            run = subprocess.run(["ip", "netns", "exec", cluster.nodes[0], "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                                  str(Path(sys.executable).parent / "nodecheck"), "prolog", "--dry-run", "--json",
                                  "--config", str(config)], capture_output=True, text=True, timeout=120)
            wall = time.monotonic() - started
        finally:
            shutil.rmtree(etc, ignore_errors=True)
    outcome = json.loads(run.stdout)
    assert run.returncode == 0 and outcome["action"] == "none" and outcome["failing"] == [], run.stdout[-2000:] + run.stderr
    proximity = next(c for c in outcome["checks"] if c["name"] == "proximity")
    assert {f["severity"] for f in proximity["findings"]} == {"warning"} and proximity["findings"]
    assert wall < 4 + 10, f"the prolog took {wall:.1f} s on a 4 s budget"  # unbounded, it took minutes


def test_a_node_list_nodecheck_refuses_fails_proximity_at_its_own_severity():
    """A node list too large to expand failed the proximity check at error, though [proximity] severity is
    warning: the prolog drained the node for the job's list. It is a check_failed at the proximity severity."""
    from nodecheck.config import Config
    from nodecheck.slurm.prolog import _proximity_check

    findings, _ = _proximity_check(None, {"SLURM_JOB_NODELIST": "n[1-10000000]"}, Config(), "n1", 5.0)
    (finding,) = findings
    assert (finding.kind, finding.severity) == ("check_failed", Config().proximity.severity) == ("check_failed", "warning")
    assert "more than 65536 nodes" in finding.message
