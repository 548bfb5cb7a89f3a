"""NCCL_SOCKET_IFNAME / NCCL_IB_HCA / GLOO_SOCKET_IFNAME as the libraries read them."""

import pytest
from helpers import make_nic, make_report

from nodecheck.core.ifnames import gloo_selection, nccl_selection

NAMES = ["docker0", "eth0", "eth1", "ib0", "ib1", "lo", "mlx5_0", "mlx5_1", "mlx5_10", "enp1s0f0"]


@pytest.mark.parametrize("spec,chosen", [
    ("eth", ["eth0", "eth1"]),                                   # a prefix
    ("eth,ib", ["eth0", "eth1", "ib0", "ib1"]),                  # several prefixes
    ("=eth0", ["eth0"]),                                         # an exact name
    ("=eth", []),                                                # exact: no interface is called eth
    ("^docker,lo", ["eth0", "eth1", "ib0", "ib1", "mlx5_0", "mlx5_1", "mlx5_10", "enp1s0f0"]),
    ("^=eth0", ["docker0", "eth1", "ib0", "ib1", "lo", "mlx5_0", "mlx5_1", "mlx5_10", "enp1s0f0"]),
    ("mlx5_1", ["mlx5_1", "mlx5_10"]),                           # a prefix matches mlx5_10 too
    ("=mlx5_0:1,mlx5_1:1", ["mlx5_0", "mlx5_1"]),                # NCCL_IB_HCA with ports
    ("", ["eth0", "eth1", "ib0", "ib1", "mlx5_0", "mlx5_1", "mlx5_10", "enp1s0f0"]),  # unset: no docker, no lo
])
def test_nccl_syntax(spec, chosen):
    assert nccl_selection(spec, NAMES) == chosen


def test_gloo_takes_exact_names_in_its_order():
    assert gloo_selection("eth1,eth0", NAMES) == ["eth1", "eth0"]
    assert gloo_selection("eth", NAMES) == [] and gloo_selection(None, NAMES) == []


def test_loopback_is_an_interface_a_one_node_run_may_name():
    """Issue 20 (14): NCCL_SOCKET_IFNAME=lo failed with "NIC 'lo' ... does not exist here"."""
    from nodecheck.bench.distributed import DistEnv, traffic_nic
    from nodecheck.core.errors import NodecheckError

    eth = make_nic("eth0", driver="virtio_net", pci_address="0000:00:03.0", numa_node=0)
    report = make_report(nics=[eth])
    env = DistEnv(0, 2, "127.0.0.1", 29500)
    for variable in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        assert traffic_nic(report, env, {variable: "lo"}) is None  # loopback: no rate to judge, no error
        assert traffic_nic(report, env, {variable: "eth0"}) is eth
    with pytest.raises(NodecheckError, match=r"\(eth0, lo\): it does not exist here"):
        traffic_nic(report, env, {"GLOO_SOCKET_IFNAME": "ib9"})
