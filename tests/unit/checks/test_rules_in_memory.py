"""Rules on an in-memory Report, NHC-style: set the facts, call the rule, read the findings. (The
snapshot tests in test_rules.py take the same facts through the probes.)"""

from helpers import make_gpu, make_nic, make_report

from nodecheck.checks import evaluate
from nodecheck.config import Config
from nodecheck.report.model import Gpu, ProbeOutcome, Report


def node(*gpus: Gpu, probes: list[ProbeOutcome] | None = None) -> Report:
    return make_report(probes=probes or [], gpus=list(gpus))


def found(report: Report, config: Config | None = None) -> set[tuple[str, str, str]]:
    return {(f.kind, f.subject, f.severity) for f in evaluate(report, config or Config())}


def pcie(width: int = 16, gen: int = 5, width_max: int = 16, gen_max: int = 5) -> dict:
    return {"gen_current": gen, "gen_max": gen_max, "gen_gpu_max": gen_max, "width_current": width, "width_max": width_max}


def test_a_healthy_gpu_raises_nothing():
    assert found(node(Gpu(0, pcie=pcie(), ecc_enabled=True, remapped_rows_pending=False, remapped_rows_failed=False))) == set()


def test_a_narrow_link_is_an_error_and_an_idle_low_generation_is_not():
    assert found(node(Gpu(0, pcie=pcie(width=8)))) == {("pcie_downtrained", "gpu0", "error")}
    assert found(node(Gpu(0, pcie=pcie(gen=1), utilization_percent=0))) == set()
    assert found(node(Gpu(0, pcie=pcie(gen=1), utilization_percent=90))) == {("pcie_downtrained", "gpu0", "warning")}


def test_memory_health():
    assert found(node(Gpu(0, ecc_enabled=False))) == {("ecc_disabled", "gpu0", "warning")}
    assert found(node(Gpu(0, ecc_enabled=False)), Config(ecc=True)) == {("ecc_disabled", "gpu0", "error")}
    assert found(node(Gpu(0, ecc_enabled=None))) == set()  # NVML did not say: nothing to judge
    assert found(node(Gpu(1, remapped_rows_pending=True, remapped_rows_failed=True))) == {
        ("row_remap_pending", "gpu1", "warning"), ("row_remap_failed", "gpu1", "error")}


def test_an_inactive_nvlink_and_too_few():
    links = [{"link": i, "active": i != 5, "version": 4} for i in range(18)]
    assert found(node(Gpu(0, pcie=pcie(), nvlinks=links)), Config(nvlinks_per_gpu=18)) == {
        ("nvlink_inactive", "gpu0", "error"), ("nvlink_count_low", "gpu0", "error")}


def test_a_probe_that_hung_is_an_error_and_one_that_garbled_a_warning():
    probes = [ProbeOutcome("nvml", False, False, 15.0, "NVML did not answer within 15 s", timed_out=True),
              ProbeOutcome("lstopo", False, False, 0.1, "lstopo XML is not well-formed"),
              ProbeOutcome("nvidia_smi_topo", False, True, 0.0, "nvidia-smi not found on PATH")]
    assert found(node(probes=probes)) == {("probe_failed", "probe:nvml", "error"), ("probe_failed", "probe:lstopo", "warning")}


def test_too_few_gpus():
    assert found(node(Gpu(0, pcie=pcie())), Config(gpu_count=8)) == {("gpu_count_low", "node", "error")}


def rail(name: str, mtu: int, layer: str = "Ethernet", state: str = "ACTIVE"):
    from helpers import make_nic

    from nodecheck.report.model import IbPort

    port = IbPort(f"mlx5_{name[-1]}", 1, state, "LinkUp", "400 Gb/sec (4X NDR)", layer)
    return make_nic(name, mtu=mtu, rdma_device=port.device, ib_ports=[port])


def test_a_rail_whose_mtu_differs_from_its_peers_is_named():
    """Written by CONTRIBUTING's recipe for a finding kind: the judge in its family module (checks/rail.py), its Kind
    declaration in its check, this test."""
    rails = [rail(f"ens{i}", 9000) for i in range(7)] + [rail("ens7", 1500)]
    assert found(make_report(nics=rails)) == {("nic_mtu_mismatch", "ens7", "warning")}
    (finding,) = evaluate(make_report(nics=rails), Config())
    assert (finding.measured, finding.expected) == (1500, 9000) and "its 7 peer(s) on Ethernet 9000" in finding.message
    assert found(make_report(nics=[rail(f"ens{i}", 9000) for i in range(8)])) == set()
    ipoib = [rail("ib0", 4092, "InfiniBand"), rail("ib1", 2044, "InfiniBand")]  # a tie: the larger is meant
    assert found(make_report(nics=[*rails[:7], *ipoib])) == {("nic_mtu_mismatch", "ib1", "warning")}
    assert found(make_report(nics=[*rails[:7], rail("ens7", 1500, state="DOWN")])) == set()  # not a rail in use


def test_a_rail_that_negotiated_less_than_the_others_is_named():
    """Eight HGX rails, gpuN nearest mlx5_N: one port up at 2X (200 Gbit/s) instead of 4X NDR is named; a slower
    NIC no GPU is near (a storage NIC), a faster one, or rails on another link layer are not compared."""
    from nodecheck.report.model import IbPort

    def hca(i: int, rate: str = "400 Gb/sec (4X NDR)", layer: str = "InfiniBand"):
        return make_nic(f"ibp{i}", rdma_device=f"mlx5_{i}", ib_ports=[IbPort(f"mlx5_{i}", 1, "ACTIVE", "LinkUp", rate, layer)])

    gpus = [make_gpu(i, nearest_nics=[f"mlx5_{i}"]) for i in range(8)]
    rails = [hca(i) for i in range(7)] + [hca(7, "200 Gb/sec (2X NDR)")]
    assert found(make_report(gpus=gpus, nics=rails)) == {("nic_rate_mismatch", "ibp7", "warning")}
    (finding,) = [f for f in evaluate(make_report(gpus=gpus, nics=rails), Config()) if f.kind == "nic_rate_mismatch"]
    assert (finding.measured, finding.expected) == ("200 Gbit/s", "400 Gbit/s")
    assert "InfiniBand 2X NDR" in finding.message and "7 other rail(s) on InfiniBand" in finding.message
    storage = hca(8, "100 Gb/sec (4X EDR)")  # no GPU is nearest to it
    assert found(make_report(gpus=gpus, nics=[*rails[:7], hca(7), storage])) == set()
    faster = [hca(i, "200 Gb/sec (4X HDR)") for i in range(7)] + [hca(7)]
    assert found(make_report(gpus=gpus, nics=faster)) == set()
    roce = [hca(i) for i in range(7)] + [hca(7, "200 Gb/sec (4X HDR)", "Ethernet")]
    assert found(make_report(gpus=gpus, nics=roce)) == set()
    polling = IbPort("mlx5_7", 1, "DOWN", "Polling", "10 Gb/sec (4X SDR)", "InfiniBand")
    down = [*rails[:7], make_nic("ibp7", rdma_device="mlx5_7", ib_ports=[polling])]
    assert found(make_report(gpus=gpus, nics=down)) == {("nic_rail_down", "ibp7", "warning")}  # down, not slow
    assert found(make_report(nics=rails)) == set()  # no GPU: no rail is known
