"""Error signals joined to the bandwidth verdict of their path (src/nodecheck/verdicts/signal_join.py through
verdicts.with_measurements, the way bench and serve judge): a slow path's finding names the signals on it; an
error-only signal on a path that measured fine is a warning; a drain-now class stays an error."""

from helpers import h2d, judged, make_measurement, make_nic, report_with

from nodecheck.checks.fabric import fabric_findings
from nodecheck.config import Config
from nodecheck.report.findings import Finding
from nodecheck.report.model import GpuFabric, IbPort
from nodecheck.verdicts.bandwidth import with_measurements

AER = Finding("pcie_link_errors", "error", "pci:0000:16:00.0", "AER correctable 40/min", "<= 31/min", "pci:0000:16:00.0 (gpu3): ...")
FATAL = Finding("pcie_aer_fatal", "error", "pci:0000:16:00.0", "AER fatal 1", "none", "pci:0000:16:00.0 (gpu3): fatal")
SYMBOLS = Finding("ib_port_errors", "error", "mlx5_0/1", "symbol_error 20.0/s", "<= 10/s", "mlx5_0/1 (ibp26s0): ...")


def test_a_slow_path_names_the_error_signals_on_it():
    findings = judged(report_with(AER), h2d(0.41))
    assert findings["bandwidth_below_spec"].message.endswith(
        "; error signals on this path: pci:0000:16:00.0 AER correctable 40/min")
    assert findings["pcie_link_errors"].severity == "error"


def test_an_error_only_signal_on_a_path_that_measured_fine_is_a_warning():
    findings = judged(report_with(AER), h2d(0.95))
    assert findings["pcie_link_errors"].severity == "warning"
    assert "h2d on gpu3:host 0.95 of spec" in findings["pcie_link_errors"].message
    assert judged(report_with(AER))["pcie_link_errors"].severity == "error"  # nothing measured: nothing tempers it


def test_a_drain_now_class_stays_an_error_whatever_was_measured():
    assert judged(report_with(FATAL), h2d(0.95))["pcie_aer_fatal"].severity == "error"
    drain = Finding("gpu_xid", "error", "gpu3", "Xid 79 fallen off the bus", "no Xid", "gpu3 ...")
    assert judged(report_with(drain), h2d(0.95))["gpu_xid"].severity == "error"
    repeated = Finding("gpu_xid", "error", "gpu3", "Xid 13 Graphics Engine Exception", "< 5 in 3600 s", "gpu3 ...")
    assert judged(report_with(repeated), h2d(0.95))["gpu_xid"].severity == "warning"


def test_another_nodes_measurement_neither_tempers_nor_names_this_nodes_signals():
    """Rank 0's Report of a job holds the other nodes' in-node figures ("node5/gpu3:host"). Joined as this node's, a
    fine copy on node5 tempered this node's gpu3 AER error to a warning (no drain), and node5's slow copy named this
    node's AER as its cause."""
    elsewhere = make_measurement("node5/gpu3:host", "h2d", rate=0.95 * 50e9, spec=50e9, direction="unidirectional",
                                 details={"path_kind": "pcie", "node": "node5"})
    assert judged(report_with(AER), elsewhere)["pcie_link_errors"].severity == "error"
    slow_elsewhere = make_measurement("node5/gpu3:host", "h2d", rate=0.41 * 50e9, spec=50e9, direction="unidirectional",
                                      details={"path_kind": "pcie", "node": "node5"})
    assert "error signals on this path" not in judged(report_with(AER), slow_elsewhere)["bandwidth_below_spec"].message


def test_an_infiniband_port_joins_the_all_reduce_across_nodes():
    across = make_measurement("allreduce:16-ranks", "allreduce", rate=45e9, spec=50e9, details={"path_kind": "infiniband"})
    assert judged(report_with(SYMBOLS), across)["ib_port_errors"].severity == "warning"
    assert judged(report_with(SYMBOLS), h2d(0.95))["ib_port_errors"].severity == "error"  # not its path


def test_an_nvswitch_sxid_is_named_on_the_nvlink_paths_and_not_on_a_host_link():
    """Every GPU of an HGX board links to every NVSwitch: a slow GPU pair or in-node all-reduce names the switch's
    SXid; a slow host link does not (its traffic never reaches a switch)."""
    sxid = Finding("nvswitch_sxid", "error", "nvswitch0", "SXid 20034 LTSSM Fault Up", "no SXid", "nvswitch0 (0000:05:00.0) ...")
    pair = make_measurement("gpu3<->gpu5", "p2p", rate=0.3 * 450e9, spec=450e9, direction="unidirectional",
                            details={"path_kind": "nvlink"})
    node = make_measurement("allreduce:node-8-gpus", "allreduce", rate=0.5 * 450e9, spec=450e9, details={"path_kind": "nvlink"})
    for slow in (pair, node):
        assert judged(report_with(sxid), slow)["bandwidth_below_spec"].message.endswith(
            "; error signals on this path: nvswitch0 SXid 20034 LTSSM Fault Up"), slow.path
    assert "error signals" not in judged(report_with(sxid), h2d(0.41))["bandwidth_below_spec"].message
    assert judged(report_with(sxid), pair)["nvswitch_sxid"].severity == "error"  # never tempered: the guide's verdict


def test_a_gpus_fabric_health_is_named_on_its_nvlink_paths_only():
    """gpu3's NVLink fabric reports degraded bandwidth (NVML's health mask): a slow pair with gpu3 or a slow in-node
    all-reduce names it; a slow pair of two other GPUs and gpu3's slow host link do not (no NVLink traffic of gpu3)."""
    report = report_with()
    report.gpus[0].fabric = GpuFabric("completed", "Success", 0, None, None, ["bandwidth degraded"])
    report.findings = fabric_findings(report, Config())
    pair = make_measurement("gpu3<->gpu5", "p2p", rate=0.3 * 450e9, spec=450e9, direction="unidirectional",
                            details={"path_kind": "nvlink"})
    others = make_measurement("gpu1<->gpu5", "p2p", rate=0.3 * 450e9, spec=450e9, direction="unidirectional",
                              details={"path_kind": "nvlink"})
    node = make_measurement("allreduce:node-8-gpus", "allreduce", rate=0.5 * 450e9, spec=450e9, details={"path_kind": "nvlink"})
    for slow in (pair, node):
        assert judged(report, slow)["bandwidth_below_spec"].message.endswith(
            "; error signals on this path: gpu3 NVLink fabric bandwidth degraded"), slow.path
    for elsewhere in (others, h2d(0.41)):
        assert "error signals" not in judged(report, elsewhere)["bandwidth_below_spec"].message, elsewhere.path
    assert judged(report, pair)["gpu_fabric_unhealthy"].severity == "warning"


def test_an_all_reduce_across_nodes_joins_only_the_nics_its_ranks_ran_over():
    """bench records each rank's traffic NIC and rails (details["nodes"]). This node's ranks ran over mlx5_0: its
    symbol errors are named on the slow all-reduce and tempered by a passing one; mlx5_5's are not its path, and
    stay an error. Another host's ranks (node9) say nothing of this node's NICs."""
    report = report_with(SYMBOLS, Finding("ib_port_errors", "error", "mlx5_5/1", "symbol_error 30.0/s", "<= 10/s",
                                          "mlx5_5/1 (ibp86s0): ..."))
    report.node = {"hostname": "node0"}
    port = IbPort("mlx5_5", 1, "ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")
    report.nics.append(make_nic("ibp86s0", kind="infiniband", rdma_device="mlx5_5", ib_ports=[port]))
    ranks = [{"rank": 0, "node": "node0", "nic": "eth0", "rails": [{"name": "mlx5_0", "rate": 50e9}]},
             {"rank": 1, "node": "node9", "nic": "eth0", "rails": [{"name": "mlx5_5", "rate": 50e9}]}]

    def across(ratio: float):
        return make_measurement("allreduce:2-ranks", "allreduce", rate=ratio * 50e9, spec=50e9,
                                details={"path_kind": "infiniband", "nodes": ranks})

    slow = [f for f in with_measurements(report, [across(0.3)], 0.0, Config()).findings if f.kind == "bandwidth_below_spec"]
    assert slow[0].message.endswith("; error signals on this path: mlx5_0/1 symbol_error 20.0/s")
    fine = {f.subject: f.severity for f in with_measurements(report, [across(0.95)], 0.0, Config()).findings
            if f.kind == "ib_port_errors"}
    assert fine == {"mlx5_0/1": "warning", "mlx5_5/1": "error"}
    unsaid = {f.subject: f.severity for f in judged(report_with(SYMBOLS), across(0.95)).values() if f.kind == "ib_port_errors"}
    assert unsaid == {"mlx5_0/1": "warning"}  # no hostname: any NIC may have carried it, as before
