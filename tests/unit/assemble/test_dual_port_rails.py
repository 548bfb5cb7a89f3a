"""The two ports of a dual-port card share one PCIe link: a job's bound counts that link once. A 2x200 Gbit/s
HDR card (two functions, mlx5_0 at .0 and mlx5_1 at .1, one below the same root port) in a gen4 x16 slot
moves 31.5 GB/s in all, not 2 x 25 GB/s; judged against 50, a healthy node's all-reduce across nodes read as
63% of spec, a finding on every node of the type. The kernel names such a link at the port above the card
("mlx5_core 0000:b3:00.1: 63.008 Gb/s available PCIe bandwidth, limited by 8 GT/s x8 link at 0000:b2:00.0",
NVIDIA/l2fwd-nv#6); each port's own spec stays its own rate.

The ports' state, physical state and link layer are gpud's H100 node's (../shared/captures/public/health/ib);
their rate is HDR's as the kernel prints it."""

import json
import math

import pytest
from helpers import PUBLIC, make_snapshot, need, write_pci_tree
from hypothesis import given, settings
from hypothesis import strategies as st

from nodecheck.assemble.rails import fabric_nics, rail_rates, ring_bound
from nodecheck.core import specs
from nodecheck.core.pairing import exchange_spec, job_bound, rails_capacity, rank_rounds
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report

GEN5, GEN4 = "32.0 GT/s PCIe", "16.0 GT/s PCIe"
PORT = PUBLIC / "health/ib/gpud-sys-class-infiniband-h100/mlx5_4/ports/1"
HDR = "200 Gb/sec (4X HDR)\n"
CARD_PORT, SINGLE_PORT = "0000:00:02.0", "0000:00:03.0"
CARD = {"mlx5_0": "0000:2a:00.0", "mlx5_1": "0000:2a:00.1"}
SINGLE = {"mlx5_2": "0000:3a:00.0"}


def node(tmp_path, card_link: str = GEN4, single_link: str = GEN4):
    """A CPU node with a dual-port HDR card (its two functions below CARD_PORT) and a single-port HDR card
    (below SINGLE_PORT), every link x16, the card's at `card_link`, the single card's at `single_link`."""
    snap = make_snapshot(tmp_path)
    lo = snap / "fs/sys/class/net/lo"
    lo.mkdir(parents=True)
    for name, value in (("operstate", "unknown"), ("mtu", "65536"), ("type", "772"), ("address", "00:00:00:00:00:00")):
        (lo / name).write_text(value + "\n")
    devices = {CARD_PORT: ("0x060400", f"pci0000:00/{CARD_PORT}", 16, 16, GEN5, card_link),
               SINGLE_PORT: ("0x060400", f"pci0000:00/{SINGLE_PORT}", 16, 16, GEN5, single_link)}
    links = {"/sys/class/net/lo": "../../devices/virtual/net/lo"}
    for port, cards, speed in ((CARD_PORT, CARD, card_link), (SINGLE_PORT, SINGLE, single_link)):
        for device, address in cards.items():
            devices[address] = ("0x020700", f"pci0000:00/{port}/{address}", 16, 16, GEN4, speed)
            links[f"/sys/class/infiniband/{device}/device"] = f"../../../devices/pci0000:00/{port}/{address}"
            folder = snap / f"fs/sys/class/infiniband/{device}/ports/1"
            folder.mkdir(parents=True)
            for name in ("state", "phys_state", "link_layer"):
                (folder / name).write_text(need(PORT / name).read_text())
            (folder / "rate").write_text(HDR)
    (snap / "fs-links.json").write_text(json.dumps(links))
    write_pci_tree(snap, devices)
    return build_report(SnapshotHost(snap))


def test_the_two_ports_of_a_card_in_a_gen4_slot_move_the_slot_not_their_sum(tmp_path):
    report = node(tmp_path)
    rails = fabric_nics(report, {})
    assert sorted(n.rdma_device for n in rails) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    gen4 = specs.pcie(4, 16).bytes_per_second
    assert [report.path_spec(f"nic:{n.name}").bytes_per_second for n in rails] == [25e9] * 3  # each port its own rate
    total, basis = ring_bound(report, rails, None)
    assert total == pytest.approx(gen4 + 25e9)  # not 75 GB/s
    assert "bounded by the PCIe links rails share" in basis
    by_name = {r["name"]: r for r in rail_rates(report, rails, None)}
    assert by_name["mlx5_0"]["link"] == by_name["mlx5_1"]["link"] == CARD_PORT != by_name["mlx5_2"]["link"]
    assert by_name["mlx5_0"]["link_rate"] == gen4


def test_a_card_whose_slot_carries_both_ports_is_not_bounded(tmp_path):
    """Gen5 x16 (63 GB/s) carries 2 x 25 GB/s: the bound is the ports' sum, and says nothing of links."""
    report = node(tmp_path, card_link=GEN5, single_link=GEN5)
    total, basis = ring_bound(report, fabric_nics(report, {}), None)
    assert total == pytest.approx(75e9) and "PCIe" not in basis


def ranks(report, nodes: int, per_node: int) -> list[dict]:
    """What each rank of a job reports, as bench gathers it: local rank k drives rail k of the node's."""
    rails = rail_rates(report, fabric_nics(report, {}), None)
    rails.sort(key=lambda r: r["name"])
    return [{"rank": n * per_node + k, "local_rank": k, "node": f"node{n}", "address": f"198.18.0.{n + 1}",
             "rails": [rails[k]]} for n in range(nodes) for k in range(per_node)]


def test_a_job_and_its_exchanges_share_the_card_among_the_ranks_that_use_it(tmp_path):
    """Two ranks a node, each on one port of the card: the job moves the slot's 31.5 GB/s a node, and each
    exchange half of it (the two ranks' pairs run at once); a rank alone on the card has its port's 25."""
    report = node(tmp_path)
    gen4 = specs.pcie(4, 16).bytes_per_second
    job = ranks(report, 2, 2)
    assert job_bound(job) == pytest.approx(gen4)
    rounds = rank_rounds(job)
    assert [exchange_spec(job, rounds[0], a, b) for a, b in rounds[0]] == [pytest.approx(gen4 / 2)] * 2
    assert job_bound(ranks(report, 2, 1)) == 25e9
    three = ranks(report, 2, 3)  # + mlx5_2, alone on its own card
    rounds = rank_rounds(three)
    assert job_bound(three) == pytest.approx(gen4 + 25e9)
    assert [exchange_spec(three, rounds[0], a, b) for a, b in rounds[0]] == [pytest.approx(gen4 / 2)] * 2 + [25e9]


@pytest.mark.parametrize("link_rate", ["31.5e9", True, float("nan"), float("inf"), -1.0, 0, None, [], {}])
def test_a_malformed_link_rate_from_a_rank_bounds_nothing(link_rate):
    """A rank's rails come over the wire from another process: a link_rate that is no positive finite number is
    dropped (the rails then add up), never a crash or a bound of 0."""
    member = {"rank": 0, "node": "a", "address": "198.18.0.1",
              "rails": [{"name": "mlx5_0", "rate": 25e9, "link": "x", "link_rate": link_rate},
                        {"name": "mlx5_1", "rate": 25e9, "link": "x", "link_rate": link_rate}]}
    assert job_bound([member]) == 50e9


@pytest.mark.parametrize("link", [7, None, "", ["x"]])
def test_a_malformed_link_shares_nothing(link):
    member = {"rank": 0, "node": "a", "rails": [{"name": "mlx5_0", "rate": 25e9, "link": link},
                                                {"name": "mlx5_1", "rate": 25e9, "link": link}]}
    assert job_bound([member]) == 50e9


RAIL = st.fixed_dictionaries({"name": st.sampled_from(["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]),
                              "rate": st.floats(1e6, 1e11)},
                             optional={"link": st.sampled_from(["a", "b"]), "link_rate": st.floats(1e6, 1e11)})


@settings(max_examples=300, deadline=None)
@given(st.lists(RAIL, min_size=1, max_size=8))
def test_rails_together_never_move_more_than_their_sum_or_their_links(rails):
    distinct = {r["name"]: r for r in rails}
    total = rails_capacity(rails)
    assert 0 < total <= sum(r["rate"] for r in distinct.values()) * (1 + 1e-12)
    alone = [r for r in distinct.values() if "link" not in r]
    links = {r["link"] for r in distinct.values() if "link" in r}
    ceilings = [min([sum(r["rate"] for r in distinct.values() if r.get("link") == link),
                     *[r["link_rate"] for r in distinct.values() if r.get("link") == link and "link_rate" in r]])
                for link in links]
    own = sum(min(r["rate"], r.get("link_rate", r["rate"])) for r in alone)  # a path bound without a link: its own
    assert math.isclose(total, own + sum(ceilings), rel_tol=1e-9)
