"""NIC probe: the real sysfs reader on trees built from captured values, and on real interfaces in
network namespaces (veth, bridge, 198.18.0.0/15) that the test creates and removes."""

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import sysfs_trees
from helpers import H100, PUBLIC, need, nodecheck, requires_root

from nodecheck.assemble.paths import nic_spec
from nodecheck.host.live import LiveHost
from nodecheck.probes.nics import collect, parse_proc_route, pci_address_from_path


class TreeHost(LiveHost):
    """The live reader on a directory tree; addresses come from the capture, not this machine."""

    def addresses(self):
        return {}


def test_h100_vm_sysfs_placeholders_become_unknown(tmp_path):
    sysfs_trees.net_tree_from_capture(tmp_path, need(H100 / "sysfs.txt").read_text())
    sysfs_trees.write(tmp_path / "sys/bus/pci/devices/0000:00:03.0/numa_node", "-1")
    facts = collect(TreeHost(tmp_path))
    nics = {n.name: n for n in facts.nics}
    eth0 = nics["eth0"]
    assert (eth0.state, eth0.speed_mbps, eth0.mtu, eth0.numa_node) == ("up", None, 1400, None)  # speed -1, numa -1
    assert (eth0.pci_address, eth0.virtual, eth0.mac) == ("0000:00:03.0", False, "02:fc:00:00:00:01")
    assert nics["ifb0"].virtual and nics["ifb0"].speed_mbps is None  # 'Invalid argument' on read
    spec = nic_spec(eth0, expected_mbps=None)
    assert spec.bytes_per_second is None and "unknown" in spec.basis


@pytest.mark.parametrize("capture", ["ibstat-h100-node-ib-ndr-3-ports-down.txt",
                                     "ibstat-h100-node-12ca-roce400g-plus-100g-all-active.txt"])
def test_infiniband_ports_from_sysfs(tmp_path, capture):
    ports = sysfs_trees.ib_tree_from_ibstat(tmp_path, need(PUBLIC / "ib" / capture).read_text())
    sysfs_trees.write(tmp_path / "sys/class/net/lo/operstate", "unknown")
    facts = collect(TreeHost(tmp_path))
    read = {(p.device, p.port): p for ps in facts.rdma_devices.values() for p in ps}
    assert len(read) == len(ports)
    for p in ports:
        got = read[(p["ca"], p["port"])]
        assert got.state == sysfs_trees._IB_STATES[p["State"]].split(": ")[1]
        assert got.link_layer == p["Link layer"] and got.rate.startswith(p["Rate"] + " Gb/sec")
    assert facts.rdma_pci["mlx5_0"].startswith("0000:")


def test_report_lists_rdma_devices_with_their_rate(tmp_path):
    sysfs_trees.ib_tree_from_ibstat(tmp_path, need(PUBLIC / "ib" / "ibstat-h100-node-ib-ndr-3-ports-down.txt").read_text())
    sysfs_trees.write(tmp_path / "sys/class/net/lo/operstate", "unknown")
    from nodecheck.assemble.fusion import merge
    from nodecheck.assemble.paths import path_specs
    from nodecheck.probes import Probe, run_probes

    results = run_probes(TreeHost(tmp_path), [Probe("nics", lambda host, t: collect(host), 5)])
    report = merge(results, {}, "test", 0)
    specs = {p.path: p for p in path_specs(report)}
    assert specs["nic:mlx5_0"].bytes_per_second == 400e9 / 8 and specs["nic:mlx5_0"].kind == "infiniband"
    assert specs["nic:mlx5_1"].bytes_per_second == 100e9 / 8 and specs["nic:mlx5_1"].kind == "ethernet"  # RoCE
    assert specs["nic:mlx5_2"].bytes_per_second is None  # Down/Disabled: no negotiated rate to trust
    assert {n.name: n.state for n in report.nics}["mlx5_2"] == "down"


def test_pci_address_and_routes():
    assert pci_address_from_path("../../devices/pci0000:00/0000:00:03.0/virtio2/net/eth0") == "0000:00:03.0"
    assert pci_address_from_path("../../devices/virtual/net/lo") is None
    routes = parse_proc_route("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
                              "eth0\t00000000\t010012C6\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
                              "eth0\t000012C6\t00000000\t0001\t0\t0\t0\t0000FEFF\t0\t0\t0\n")
    assert [(r.iface, r.destination, r.gateway) for r in routes] == [
        ("eth0", "0.0.0.0/0", "198.18.0.1"), ("eth0", "198.18.0.0/15", None)]


# --- real interfaces in network namespaces -------------------------------------------------------

def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=10, capture_output=True)


@pytest.fixture
def netns():
    """Two namespaces: 'node' holds veth n0 (198.18.7.2/24, MTU 9000) and a down veth; 'peer' bridges
    the other end of n0 on br0 (198.18.7.1/24)."""
    requires_root()
    tag = uuid.uuid4().hex[:6]
    node, peer = f"nc-node-{tag}", f"nc-peer-{tag}"
    try:
        ip("netns", "add", node)
        ip("netns", "add", peer)
        ip("link", "add", f"n0-{tag}", "netns", node, "type", "veth", "peer", "name", f"p0-{tag}", "netns", peer)
        ip("link", "add", f"d0-{tag}", "netns", node, "type", "veth", "peer", "name", f"d1-{tag}", "netns", peer)
        ip("-n", peer, "link", "add", "br0", "type", "bridge")
        ip("-n", peer, "link", "set", f"p0-{tag}", "master", "br0")
        ip("-n", peer, "addr", "add", "198.18.7.1/24", "dev", "br0")
        for link in ("br0", f"p0-{tag}", "lo"):
            ip("-n", peer, "link", "set", link, "up")
        ip("-n", node, "link", "set", f"n0-{tag}", "mtu", "9000")
        ip("-n", node, "addr", "add", "198.18.7.2/24", "dev", f"n0-{tag}")
        ip("-n", node, "link", "set", f"n0-{tag}", "up")
        ip("-n", node, "link", "set", f"d0-{tag}", "up")  # its peer stays down: no carrier
        ip("-n", node, "link", "set", "lo", "up")
        wait_until_up(node, f"n0-{tag}")
        yield {"node": node, "peer": peer, "up": f"n0-{tag}", "down": f"d0-{tag}"}
    except subprocess.CalledProcessError as error:
        pytest.skip(f"cannot build network namespaces here: {error.stderr.decode().strip()}")
    finally:
        for ns in (node, peer):
            subprocess.run(["ip", "netns", "del", ns], timeout=10, capture_output=True)


def wait_until_up(ns: str, link: str, seconds: float = 5.0) -> None:
    """The kernel reports a fresh veth 'down' for a moment after both ends are set up."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        shown = subprocess.run(["ip", "-n", ns, "-j", "link", "show", "dev", link], capture_output=True, text=True, timeout=5)
        if json.loads(shown.stdout or "[{}]")[0].get("operstate") == "UP":
            return
        time.sleep(0.05)
    raise AssertionError(f"{link} in {ns} did not come up within {seconds} s")


def inspect_in(ns: str, *args: str):
    return nodecheck("inspect", "--json", *args) if ns is None else subprocess.run(
        ["ip", "netns", "exec", ns, *nodecheck_argv(), "inspect", "--json", *args],
        capture_output=True, text=True, timeout=60)


def nodecheck_argv():
    import sys
    return [sys.executable, "-m", "nodecheck"]


def test_real_veth_and_bridge_in_namespaces(netns, tmp_path):
    result = inspect_in(netns["node"])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    nics = {n["name"]: n for n in report["nics"]}
    up = nics[netns["up"]]
    assert (up["state"], up["speed_mbps"], up["mtu"], up["virtual"]) == ("up", 10000, 9000, True)
    assert {"family": "inet", "address": "198.18.7.2", "prefixlen": 24} in up["addresses"]
    assert nics[netns["down"]]["state"] == "down"  # its peer is down: no carrier
    spec = next(p for p in report["paths"] if p["path"] == f"nic:{netns['up']}")
    assert spec["bytes_per_second"] == 10000e6 / 8

    peer = json.loads(inspect_in(netns["peer"]).stdout)
    assert {"family": "inet", "address": "198.18.7.1", "prefixlen": 24} in {n["name"]: n for n in peer["nics"]}["br0"]["addresses"]


def test_a_real_carrier_down_counts_once_on_the_other_end(netns):
    """The kernel's carrier_down_count (what nic_link_errors judges on a physical NIC), read by the real reader in
    the namespace: the peer's end set down and up again is one carrier drop on n0 (a veth is virtual: read, not
    judged)."""
    read = ("import json, sys; from nodecheck.host.live import LiveHost; from nodecheck.probes.nics import read_netdev; "
            "print(json.dumps(read_netdev(LiveHost(), sys.argv[1])))")

    def counters() -> dict:
        out = subprocess.run(["ip", "netns", "exec", netns["node"], *nodecheck_argv()[:1], "-c", read, netns["up"]],
                             capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)

    before = counters()
    if before["carrier_down_count"] is None:
        pytest.skip("this kernel has no carrier_down_count (before Linux 5.8)")
    ip("-n", netns["peer"], "link", "set", netns["up"].replace("n0-", "p0-"), "down")
    ip("-n", netns["peer"], "link", "set", netns["up"].replace("n0-", "p0-"), "up")
    wait_until_up(netns["node"], netns["up"])
    after = counters()
    assert int(after["carrier_down_count"]) == int(before["carrier_down_count"]) + 1
    assert int(after["carrier_changes"]) == int(before["carrier_changes"]) + 2


def test_config_expectations_on_real_nics(netns, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'[nics."{netns["up"]}"]\nspeed_mbps = 25000\n\n[nics."{netns["down"]}"]\nstate = "up"\n\n'
                      '[nics.ib0]\nspeed_mbps = 200000\n')
    result = inspect_in(netns["node"], "--config", str(config))
    assert result.returncode == 1, result.stderr
    # the NIC checks' findings: a namespace shares the host's kernel log, whose Xid events (other tests write
    # some into /dev/kmsg) are not this test's
    findings = {(f["kind"], f["subject"]) for f in json.loads(result.stdout)["findings"] if f["kind"].startswith("nic_")}
    assert findings == {("nic_slow", netns["up"]), ("nic_down", netns["down"]), ("nic_missing", "ib0")}


def peer_tree(case: str) -> Path:
    from helpers import SHARED, need

    return need(SHARED / "peer" / "sysfs" / case)


def test_node_exporters_sysfs_tree_bonding_masters_is_not_a_nic():
    """node_exporter's fixture: bonding_masters is a plain file in /sys/class/net whenever the bonding
    driver is loaded; every other entry is a netdev."""
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.probes.nics import collect

    tree = peer_tree("node_exporter-sys")
    facts = collect(SnapshotHost(tree))
    entries = sorted(p.name for p in (tree / "fs/sys/class/net").iterdir() if p.is_dir())
    assert [n.name for n in facts.nics] == entries and "bonding_masters" not in entries
    assert all(n.state == "up" for n in facts.nics)
    eth0 = next(n for n in facts.nics if n.name == "eth0")
    assert (eth0.speed_mbps, eth0.pci_address) == (1000, "0000:03:00.0")


@pytest.mark.parametrize("case", ["node_exporter-sys", "procfs-fixtures"])
def test_every_ib_rate_in_the_peer_trees_gets_a_data_rate_spec(case):
    """Each port's spec is its data rate: 8b/10b for SDR/DDR/QDR (the kernel prints SDR without a name:
    '10 Gb/sec (4X)'), 64b/66b from FDR on."""
    from nodecheck.core import specs
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.probes.nics import collect

    facts = collect(SnapshotHost(peer_tree(case)))
    ports = [port for ports in facts.rdma_devices.values() for port in ports]
    assert ports
    data_per_lane = {"": 2.0, "DDR": 4.0, "QDR": 8.0, "EDR": 25.0}  # IBTA: SDR-QDR 8b/10b, EDR 25 Gbit/s per lane
    for port in ports:
        spec = specs.infiniband(port.rate)
        assert spec is not None and "rate as reported" not in spec.basis, (port.device, port.rate)
        lanes, _, name = port.rate.split("(")[1].rstrip(")").partition("X")
        assert spec.bytes_per_second * 8 / 1e9 == pytest.approx(int(lanes) * data_per_lane[name.strip()]), port.rate


def metrics_of(text: str) -> dict[str, list[dict]]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: [s.labels for s in f.samples] for f in text_string_to_metric_families(text)}


def test_real_virtual_nics_are_left_out_of_the_metrics_unless_configured(netns, tmp_path):
    """A real bridge, veths and an ifb: on a Kubernetes node every pod's veth would be a short-lived series."""
    ip("-n", netns["peer"], "link", "add", "ifb7", "type", "ifb")
    out = tmp_path / "metrics"
    out.mkdir()

    def exported(*args: str) -> dict[str, list[dict]]:
        result = subprocess.run(["ip", "netns", "exec", netns["peer"], *nodecheck_argv(), "check", "--textfile-dir", str(out),
                                 *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return metrics_of((out / "nodecheck.prom").read_text())

    default = exported()
    assert default["nodecheck_nic_info"] == [] and default["nodecheck_nic_up"] == []
    assert not [s for s in default["nodecheck_path_spec_bytes_per_second"] if s["path"].startswith("nic:")]
    config = tmp_path / "config.toml"
    config.write_text('[metrics]\nvirtual_nics = ["br*", "ifb*"]\n')
    chosen = exported("--config", str(config))
    assert {(s["nic"], s["virtual"]) for s in chosen["nodecheck_nic_info"]} == {("br0", "true"), ("ifb7", "true")}
    assert {s["nic"] for s in chosen["nodecheck_nic_up"]} == {"br0", "ifb7"}


def test_physical_nics_and_bonds_are_exported_by_default(tmp_path):
    """node_exporter's sysfs tree: eth0 on PCI, and the bond masters bond0, dmz and int (no PCI device). dmz and int
    are bonds by their bonding/ directory, not their names: exported by default too, with their members."""
    from nodecheck.config import loads
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.pipeline import build_report
    from nodecheck.prometheus.exposition import write_textfile

    report = build_report(SnapshotHost(peer_tree("node_exporter-sys")))
    default = metrics_of(write_textfile(report, tmp_path).read_text())
    physical = {n.name for n in report.nics if not n.virtual}
    assert "eth0" in physical and {"bond0", "dmz", "int"}.isdisjoint(physical)
    assert {(s["nic"], s["virtual"]) for s in default["nodecheck_nic_info"]} == \
        {(name, "false") for name in physical} | {("bond0", "true"), ("dmz", "true"), ("int", "true")}
    members = {n.name: n.bond_members for n in report.nics if n.bond_members is not None}
    assert members == {"bond0": [], "dmz": ["eth0", "eth4"], "int": ["eth5", "eth1"]}  # bonding/slaves as the kernel lists them
    every = metrics_of(write_textfile(report, tmp_path, loads('[metrics]\nvirtual_nics = ["*"]\n', "t").virtual_nics).read_text())
    assert {s["nic"] for s in every["nodecheck_nic_info"]} == physical | {"bond0", "dmz", "int"} == {n.name for n in report.nics}


def test_interface_addresses_are_what_ip_addr_shows(netns):
    """src/nodecheck/host/netif.py (getifaddrs through ctypes, which replaced psutil) against iproute2's own listing, in a
    namespace whose NIC has a secondary IPv4 address, a /30 and an IPv6 one."""
    node, link = netns["node"], netns["up"]
    for address in ("198.18.7.9/24", "198.19.0.5/30", "2001:db8:7::2/64"):
        subprocess.run(["ip", "-n", node, "addr", "add", address, "dev", link], check=True, capture_output=True, timeout=10)
    code = "import json; from nodecheck.host.netif import interface_addresses; print(json.dumps(interface_addresses()))"
    ours = json.loads(subprocess.run(["ip", "netns", "exec", node, *nodecheck_argv()[:1], "-c", code], capture_output=True,
                                     text=True, timeout=30, check=True).stdout)
    shown = json.loads(subprocess.run(["ip", "-n", node, "-j", "addr", "show"], capture_output=True, text=True, timeout=10,
                                      check=True).stdout)
    # fe80:: link-local addresses are left out: the kernel adds one when a link's carrier comes up, which may
    # fall between the two listings
    theirs = {entry["ifname"]: sorted((a["family"], a["local"], a["prefixlen"]) for a in entry["addr_info"]
                                      if not a["local"].startswith("fe80:"))
              for entry in shown}
    mine = {name: sorted((a["family"], a["address"], a["prefixlen"]) for a in found if not a["address"].startswith("fe80:"))
            for name, found in ours.items()}
    assert {k: v for k, v in mine.items() if v} == {k: v for k, v in theirs.items() if v}
    assert ("inet", "198.19.0.5", 30) in theirs[link] and ("inet6", "2001:db8:7::2", 64) in theirs[link]
