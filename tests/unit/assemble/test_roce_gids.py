"""The GID NCCL takes on each active RoCE rail, and whether it routes (src/nodecheck/probes/roce_gids.py, src/nodecheck/checks/roce.py).

The GID table is a real one, published in NVIDIA/nccl#769 (`ibv_devinfo -d mlx5_bond_0 -v` on an A100 node):
GID 0 fe80::...:1cfb RoCE v1, 1 the same link-local address as RoCE v2, 2 ::ffff:200.0.209.6 RoCE v1, 3 the same
IPv4 address as RoCE v2. There NCCL_IB_GID_INDEX=1 failed ("Call to ibv_modify_qp failed with error Connection
timed out") and 3 worked. It is written as sysfs holds it (`gids/N`, `gid_attrs/types/N`; an unset entry reads as
zeros and has no readable type) under a RoCE port, and the real sysfs reader runs on it."""

import dataclasses
import json

import pytest
from helpers import IPV4, LINK_LOCAL, NCCL_769, TreeHost, make_report, roce_node

from nodecheck.assemble.roce_gid import nccl_gid_index
from nodecheck.checks.roce import roce_gid_findings
from nodecheck.host.snapshot import RecordingHost, SnapshotHost
from nodecheck.probes.nics import collect
from nodecheck.probes.roce_gids import MAX_GIDS, parse_gid_table
from nodecheck.report.model import Platform


def judged(root, table: dict, conf: dict | None = None, link_layer: str = "Ethernet"):
    facts = collect(roce_node(root, table, link_layer))
    report = make_report(nics=facts.nics, platform=Platform(None, True, nccl_conf=conf))
    return facts.nics[0].ib_ports[0], {f.subject: f for f in roce_gid_findings(report)}


def test_the_published_table_is_read_and_nccl_takes_its_ipv4_roce_v2_gid(tmp_path):
    port, found = judged(tmp_path, NCCL_769)
    assert port.gids == {str(i): gid for i, (gid, _) in NCCL_769.items()}
    assert port.gid_versions == {"0": 1, "1": 2, "2": 1, "3": 2}
    assert nccl_gid_index(port, "AF_INET", 2) == 3 and found == {}  # what worked in #769, chosen by NCCL itself
    from nodecheck.render.report import platform_lines

    report = make_report(nics=collect(TreeHost(tmp_path)).nics, platform=Platform(None, True, nccl_conf={}))
    assert f"RoCE GID NCCL takes: mlx5_bond_0/1 3 ({IPV4}, v2)" in platform_lines(report)  # what inspect says


def test_ipv4_gids_past_the_32nd_entry_are_read(tmp_path):
    """A rail whose netdev also holds 20 global IPv6 addresses (pods' macvlans, VLANs): their 40 GIDs come first and
    the IPv4 address's RoCE v2 GID sits at 43. Reading a fixed 32 entries, NCCL's choice replayed fell back to the
    link-local GID 0 and a healthy rail was named unroutable; the table is read to 32 unset entries in a row."""
    table = {0: (LINK_LOCAL, "IB/RoCE v1"), 1: (LINK_LOCAL, "RoCE v2")}
    for n in range(20):
        v6 = f"2001:0db8:0000:0000:0000:0000:0000:{n + 1:04x}"
        table |= {2 + 2 * n: (v6, "IB/RoCE v1"), 3 + 2 * n: (v6, "RoCE v2")}
    table |= {42: (IPV4, "IB/RoCE v1"), 43: (IPV4, "RoCE v2")}
    port, found = judged(tmp_path, table)
    assert len(port.gids) == 44 and nccl_gid_index(port, "AF_INET", 2) == 43 and found == {}
    holes = judged(tmp_path / "holes", {0: table[0], 1: table[1], 60: table[42], 61: table[43]})[0]
    assert set(holes.gids) == {"0", "1"}  # past 32 unset entries in a row, the rest of the table is not read


def test_the_index_that_failed_in_the_issue_is_named(tmp_path):
    _, found = judged(tmp_path, NCCL_769, {"NCCL_IB_GID_INDEX": "1"})
    finding = found["mlx5_bond_0/1"]
    assert (finding.kind, finding.severity, finding.measured) == ("roce_gid_unroutable", "warning", "GID 1 link-local")
    assert "NCCL_IB_GID_INDEX=1 (/etc/nccl.conf) names GID 1: fe80:0000:0000:0000:0ac0:ebff:feda:1cfb" in finding.message
    assert "bond0" in finding.message
    assert judged(tmp_path / "3", NCCL_769, {"NCCL_IB_GID_INDEX": "3"})[1] == {}
    unset = judged(tmp_path / "9", NCCL_769, {"NCCL_IB_GID_INDEX": "9"})[1]["mlx5_bond_0/1"]
    assert unset.measured == "GID 9 unset" and "an unset entry" in unset.message


def test_a_rail_that_lost_its_ipv4_address_leaves_nccl_on_the_link_local_gid(tmp_path):
    """The same port with its IPv4 address gone (the kernel removes its two GIDs): NCCL's walk stays at GID 0."""
    _, found = judged(tmp_path, {0: NCCL_769[0], 1: NCCL_769[1]})
    finding = found["mlx5_bond_0/1"]
    assert finding.measured == "GID 0 link-local"
    assert "NCCL (AF_INET, RoCE v2) falls back to GID 0" in finding.message and "give bond0 its IPv4 address" in finding.message


def test_a_rail_with_only_roce_v1_gids_is_named(tmp_path):
    """RoCE v2 off on the port (only IB/RoCE v1 entries): NCCL's walk ends on the IPv4 RoCE v1 GID, which does not
    cross a router: named with its version."""
    v1_only = {0: NCCL_769[0], 2: NCCL_769[2]}
    finding = judged(tmp_path, v1_only)[1]["mlx5_bond_0/1"]
    assert finding.measured == "GID 2 RoCE v1" and f"NCCL (AF_INET, RoCE v2) takes GID 2: {IPV4}, RoCE v1" in finding.message
    assert finding.message.endswith("enable RoCE v2 on the NIC")


@pytest.mark.parametrize("value", ["²", "--3", "3" * 5000, "0x3", " 3 "])
def test_a_hostile_gid_setting_is_read_as_nccl_reads_it_or_not_at_all(tmp_path, value):
    """NCCL_IB_GID_INDEX from /etc/nccl.conf or a Report's NCCL run is untrusted: a value int() refuses is no index
    (the finding, if any, comes from NCCL's own walk), never a traceback."""
    _, found = judged(tmp_path, {0: NCCL_769[0], 1: NCCL_769[1]}, {"NCCL_IB_GID_INDEX": value})
    expected = "GID 3 unset" if value.strip() == "3" else "GID 0 link-local"
    assert found["mlx5_bond_0/1"].measured == expected


def test_nccl_picks_by_the_family_and_version_the_conf_file_asks_for(tmp_path):
    assert nccl_gid_index(judged(tmp_path, NCCL_769)[0], "AF_INET", 1) == 2  # NCCL_IB_ROCE_VERSION_NUM=1
    _, found = judged(tmp_path / "v1", NCCL_769, {"NCCL_IB_ROCE_VERSION_NUM": "1"})
    assert found == {}
    _, found = judged(tmp_path / "v6", NCCL_769, {"NCCL_IB_ADDR_FAMILY": "AF_INET6"})  # only link-local IPv6 here
    assert found["mlx5_bond_0/1"].measured == "GID 0 link-local"


def test_ports_nccl_does_not_use_are_not_judged(tmp_path):
    assert judged(tmp_path, {0: NCCL_769[0]}, {"NCCL_IB_HCA": "mlx5_9"})[1] == {}  # not selected
    port, found = judged(tmp_path / "ib", {0: NCCL_769[0]}, link_layer="InfiniBand")  # the subnet manager's GIDs
    assert port.gids is None and found == {}


def test_the_table_is_recorded_and_replayed(tmp_path):
    host = roce_node(tmp_path / "root", NCCL_769)
    recording = RecordingHost(host)
    live = collect(recording).nics[0].ib_ports[0]
    replayed = collect(SnapshotHost(recording.write(tmp_path / "snap"))).nics[0].ib_ports[0]
    assert (replayed.gids, replayed.gid_versions) == (live.gids, live.gid_versions) and replayed.gids


@pytest.mark.parametrize("gids, types", [
    ({"0": "not a gid", "1": LINK_LOCAL.upper(), "99": IPV4, "x": IPV4}, {"1": "RoCE v2", "0": "RoCE v9"}),
    ({str(i): IPV4 for i in range(500)}, {str(i): "RoCE v2" for i in range(500)}),
    ({"2": IPV4}, ["not", "a", "dict"]),
    ({"²": IPV4, "٣": IPV4, "9" * 5000: IPV4, "-1": IPV4, "3": IPV4}, {"²": "RoCE v2", "3": "RoCE v2"}),
])
def test_a_hostile_table_is_bounded_and_keeps_only_gids(gids, types):
    table, versions = parse_gid_table(gids, types)
    assert len(table) <= MAX_GIDS and all(int(i) < MAX_GIDS for i in table)
    assert all(len(g) == 39 and g == g.lower() for g in table.values())
    assert set(versions) <= set(table) and set(versions.values()) <= {1, 2}
    json.dumps(table)
    assert parse_gid_table("not a dict", {}) is None


def test_a_slow_all_reduce_across_nodes_names_the_port_nccl_could_not_route(tmp_path):
    """Joined to its path (src/nodecheck/verdicts/signal_join.py): a slow all-reduce across nodes over bond0 names the port; a slow
    host copy does not."""
    from helpers import make_measurement

    from nodecheck.config import Config
    from nodecheck.verdicts.bandwidth import with_measurements

    facts = collect(roce_node(tmp_path, {0: NCCL_769[0], 1: NCCL_769[1]}))
    report = make_report(nics=facts.nics, platform=Platform(None, True, nccl_conf={}))
    report.findings = roce_gid_findings(report)
    across = make_measurement("allreduce:16-ranks", "allreduce", rate=0.1 * 25e9, spec=25e9, details={"path_kind": "roce"})
    host = make_measurement("gpu0:host", "h2d", rate=0.3 * 50e9, spec=50e9, direction="unidirectional",
                            details={"path_kind": "pcie"})
    slow = {f.message.split(" ")[0]: f for f in with_measurements(report, [across, host], 0.0, Config()).findings
            if f.kind == "bandwidth_below_spec"}
    assert slow["allreduce:16-ranks"].message.endswith("; error signals on this path: mlx5_bond_0/1 GID 0 link-local")
    assert "error signals" not in slow["gpu0:host"].message


def test_a_roce_rail_whose_table_was_not_read_is_unknown_not_healthy(tmp_path):
    """A snapshot from before nodecheck read GID tables (or a port whose table is unreadable): the check is unknown
    for the node (nodecheck_check_unknown), never healthy; an InfiniBand port needs no table."""
    from nodecheck.checks import unmade_checks

    facts = collect(roce_node(tmp_path, NCCL_769))
    report = make_report(nics=facts.nics, platform=Platform(None, True, nccl_conf={}))
    assert "roce_gid_unroutable" not in unmade_checks(report)
    facts.nics[0].ib_ports[0].gids = None
    assert unmade_checks(report)["roce_gid_unroutable"].startswith("mlx5_bond_0/1: its GID table was not read")
    facts.nics[0].ib_ports[0].link_layer = "InfiniBand"
    assert "roce_gid_unroutable" not in unmade_checks(report)


def test_the_index_a_jobs_nccl_run_took_from_its_environment_is_judged(tmp_path):
    """bench in a job whose environment pins NCCL_IB_GID_INDEX=1 (#769's failing setting): NCCL logs "NCCL_IB_GID_INDEX
    set by environment to 1." (bench asks for its ENV lines), bench keeps it with the run, and with_measurements (how
    bench and serve attach a run) judges the port by it, not by /etc/nccl.conf's (unset here, where NCCL's own walk
    takes GID 3). A run that pins nothing adds nothing."""
    from helpers import make_measurement

    from nodecheck.bench.nccl_debug import parse_nccl_debug
    from nodecheck.checks import evaluate
    from nodecheck.config import Config
    from nodecheck.verdicts.bandwidth import with_measurements

    facts = collect(roce_node(tmp_path, NCCL_769))
    report = make_report(nics=facts.nics, platform=Platform(None, True, nccl_conf={}))
    report.findings = evaluate(report, Config())
    assert not [f for f in report.findings if f.kind == "roce_gid_unroutable"]
    log = ("node-1:985:1263 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 1.\n"
           "node-1:985:1263 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to bond0\n")
    run = dataclasses.asdict(parse_nccl_debug(log))
    across = make_measurement("allreduce:16-ranks", "allreduce", rate=20e9, spec=25e9, details={"nccl": run})
    judged = with_measurements(report, [across], 0.0, Config())
    (finding,) = [f for f in judged.findings if f.kind == "roce_gid_unroutable"]
    assert finding.measured == "GID 1 link-local"
    assert "NCCL_IB_GID_INDEX=1 (the NCCL run's environment) names GID 1" in finding.message
    quiet = dict(run, settings={"NCCL_SOCKET_IFNAME": "bond0"})
    plain = make_measurement("allreduce:16-ranks", "allreduce", rate=20e9, spec=25e9, details={"nccl": quiet})
    assert not [f for f in with_measurements(report, [plain], 0.0, Config()).findings if f.kind == "roce_gid_unroutable"]


def test_an_address_range_narrows_nccls_walk_as_nccl_reads_it(tmp_path):
    """NCCL_IB_ADDR_RANGE in /etc/nccl.conf (NCCL's envIbAddrRange and matchGidAddrPrefix): a range holding the
    rail's address changes nothing; one that leaves it out leaves NCCL on the link-local GID, every job over the
    rail hanging, and is named as the cause; one NCCL cannot read (no '/', a length past 32) narrows nothing."""
    from nodecheck.assemble.roce_gid import address_range, in_range

    port = judged(tmp_path, NCCL_769)[0]
    assert nccl_gid_index(port, "AF_INET", 2, address_range("200.0.208.0/23", "AF_INET")) == 3
    assert judged(tmp_path / "in", NCCL_769, {"NCCL_IB_ADDR_RANGE": "200.0.208.0/23"})[1] == {}
    finding = judged(tmp_path / "out", NCCL_769, {"NCCL_IB_ADDR_RANGE": "10.0.0.0/8"})[1]["mlx5_bond_0/1"]
    assert finding.measured == "GID 0 link-local"
    assert "NCCL (AF_INET, RoCE v2, NCCL_IB_ADDR_RANGE=10.0.0.0/8) falls back to GID 0" in finding.message
    assert finding.message.endswith(f"NCCL_IB_ADDR_RANGE (/etc/nccl.conf) leaves out the port's address {IPV4}: set it "
                                    "to the rails' subnet, or unset it")
    hostile = ("/" * 1000, "200.0.209.0/" + "9" * 5000, "\x00/8", "200.0.209.0\n/24")
    for n, unread in enumerate(("200.0.209.6", "10.0.0.0/33", "not-an-address/8", "", "::1/64", *hostile)):
        assert address_range(unread, "AF_INET") is None, unread
        assert judged(tmp_path / f"u{n}", NCCL_769, {"NCCL_IB_ADDR_RANGE": unread})[1] == {}, unread
    # strtol reads the length: its leading digits ("24abc" is 24), none is 0 (every GID); a negative one matches none
    assert address_range("200.0.209.0/24abc", "AF_INET") == ((0xC800D100,), 24)
    assert address_range("200.0.209.0/x", "AF_INET") == ((0xC800D100,), 0) and in_range(IPV4, "AF_INET", ((0,), 0))
    assert not in_range(IPV4, "AF_INET", address_range("200.0.209.0/-1", "AF_INET"))
    # IPv6, word by word: a /64 holding the address, and one that does not
    v6 = "2001:0db8:0000:0001:0000:0000:0000:0002"
    assert in_range(v6, "AF_INET6", address_range("2001:db8:0:1::/64", "AF_INET6"))
    assert not in_range(v6, "AF_INET6", address_range("2001:db8:0:2::/64", "AF_INET6"))
    assert in_range(v6, "AF_INET6", address_range("2001:db8::/31", "AF_INET6"))


def test_a_range_a_jobs_nccl_run_took_from_its_environment_is_judged(tmp_path):
    from helpers import make_measurement

    from nodecheck.bench.nccl_debug import parse_nccl_debug
    from nodecheck.config import Config
    from nodecheck.verdicts.bandwidth import with_measurements

    facts = collect(roce_node(tmp_path, NCCL_769))
    report = make_report(nics=facts.nics, platform=Platform(None, True, nccl_conf={}))
    run = dataclasses.asdict(parse_nccl_debug("node-1:985:1263 [0] NCCL INFO NCCL_IB_ADDR_RANGE set by environment to "
                                              "192.168.0.0/16\n"))
    across = make_measurement("allreduce:16-ranks", "allreduce", rate=20e9, spec=25e9, details={"nccl": run})
    (finding,) = [f for f in with_measurements(report, [across], 0.0, Config()).findings if f.kind == "roce_gid_unroutable"]
    assert "NCCL_IB_ADDR_RANGE=192.168.0.0/16) falls back to GID 0" in finding.message
    assert "NCCL_IB_ADDR_RANGE (the NCCL run's environment) leaves out" in finding.message
