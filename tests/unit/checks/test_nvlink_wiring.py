"""NVLink slots no bridge is wired to are not links that went down; a wired link that goes down still is. And the
NVLink rate of the board in hand (NVML's speed field, the board, the architecture).

NVML lists every slot of the chip and answers NVML_FEATURE_DISABLED for an unwired one. Published cases: an H100
PCIe/NVL with its 3 bridges has links 4, 5, 10, 11, 16, 17 inactive by design (Azure/azurehpc-health-checks#162); an
A100 80GB PCIe without a bridge reports all 12 links down (NVIDIA/NVSentinel#1481, DCGM's false NVLINK_DOWN)."""

import pytest
from helpers import A100_SXM4, PUBLIC, h100_nvml_records, hgx_nvml, make_snapshot, need

from nodecheck.assemble.paths import pair_spec
from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.prometheus.exposition import exposition
from nodecheck.report.model import Gpu, PathSpec
from nodecheck.slurm.prolog import failing_findings

NVL_UNWIRED = (4, 5, 10, 11, 16, 17)  # Azure/azurehpc-health-checks#162: inactive by design on H100 PCIe/NVL


def cards(name: str, slots: int, down: dict[int, tuple], arch: int, count: int = 2, **fields) -> list[dict]:
    """`count` PCIe cards of `name`, each listing `slots` NVLink slots, `down[gpu]` of them inactive."""
    base = {**h100_nvml_records()[0], "name": name, "arch": arch, **fields}
    return [dict(base, uuid=f"GPU-card-{i}", pci=f"00000000:{0x18 + i * 0x10:02x}:00.0",
                 nvlink=[[link, 0 if link in down.get(i, ()) else 1, 6 if arch == 9 else 5] for link in range(slots)])
            for i in range(count)]


def report_of(tmp_path, gpus, config=None, **sources):
    return build_report(SnapshotHost(make_snapshot(tmp_path / "snap", nvml_gpus=gpus, **sources)), config)


def drains(report) -> bool:
    """Whether the prolog would drain on these findings (its default fail severity)."""
    return bool(failing_findings(report.findings, Config().fail_severity))


def nvlink_findings(report):
    return sorted((f.kind, f.subject, f.severity, f.measured, f.expected) for f in report.findings if f.kind.startswith("nvlink"))


def test_an_h100_nvl_pair_with_its_three_bridges_is_healthy(tmp_path):
    report = report_of(tmp_path, cards("NVIDIA H100 NVL", 18, {0: NVL_UNWIRED, 1: NVL_UNWIRED}, arch=9))
    assert nvlink_findings(report) == []
    assert not drains(report)
    assert [g.nvlinks_wired for g in report.gpus] == [12, 12]
    metrics = exposition(report).decode()
    assert 'nodecheck_gpu_nvlink_wired_links{gpu="0"} 12.0' in metrics  # NodecheckNvlinkDown: 12 < 12 is no alert
    assert 'nodecheck_gpu_nvlink_active_links{gpu="0"} 12.0' in metrics


def test_a_wired_link_down_on_an_nvl_pair_is_still_an_error(tmp_path):
    """11 of 12: both ends lose the link, so siblings agree on 11; the board's 12 bridged links say otherwise."""
    down = NVL_UNWIRED + (0,)
    report = report_of(tmp_path, cards("NVIDIA H100 NVL", 18, {0: down, 1: down}, arch=9))
    assert nvlink_findings(report) == [("nvlink_inactive", "gpu0", "error", 11, 12), ("nvlink_inactive", "gpu1", "error", 11, 12)]
    message = next(f.message for f in report.findings if f.subject == "gpu0")
    assert "11 of 12 NVLinks active (its board's 12 bridged links)" in message and "0, 4, 5, 10, 11, 16, 17" in message
    assert drains(report)


@pytest.mark.parametrize("count", [1, 2, 4])
def test_a100_pcie_without_a_bridge_lists_twelve_down_slots_and_passes(tmp_path, count):
    gpus = cards("NVIDIA A100 80GB PCIe", 12, {i: tuple(range(12)) for i in range(count)}, arch=7, count=count, maxgen=4)
    report = report_of(tmp_path, gpus)
    assert nvlink_findings(report) == [] and not drains(report)
    assert [g.nvlinks_wired for g in report.gpus] == [None] * count
    assert "nodecheck_gpu_nvlink_wired_links{" not in exposition(report).decode()


def test_one_bridged_a100_pcie_pair_beside_two_unbridged_cards(tmp_path):
    """A bridge on GPUs 0 and 1 only: 2 and 3 have no bridge (no finding); a bridged GPU that loses a link does."""
    gpus = cards("NVIDIA A100-PCIE-40GB", 12, {2: tuple(range(12)), 3: tuple(range(12))}, arch=7, count=4)
    assert nvlink_findings(report_of(tmp_path, gpus)) == []
    gpus = cards("NVIDIA A100-PCIE-40GB", 12, {0: (3,), 1: (3,), 2: tuple(range(12)), 3: tuple(range(12))}, arch=7, count=4)
    assert [f[1:4] for f in nvlink_findings(report_of(tmp_path / "down", gpus))] == [("gpu0", "error", 11), ("gpu1", "error", 11)]


def test_an_hgx_gpu_whose_links_all_went_down_is_still_an_error(tmp_path):
    """No bridges on an SXM board: a GPU with none of its 18 links up, beside siblings with 18, is broken."""
    report = report_of(tmp_path, hgx_nvml(inactive={5: list(range(18))}), topo="hgx-h100-8gpu-8nic-sglang30401.txt")
    assert nvlink_findings(report) == [("nvlink_inactive", "gpu5", "error", 0, 18)]


@pytest.mark.parametrize("model,slots", [("NVIDIA H800", 18), ("NVIDIA A800-SXM4-80GB", 12)])
def test_an_nv8_switch_board_is_not_drained_for_the_slots_its_chip_lists(tmp_path, model, slots):
    """H800 and A800 boards wire 8 NVLinks per GPU to their NVSwitches (400 GB/s bidirectional), and `topo -m` reads
    NV8 to each peer (NVIDIA/nccl#933's H800 rows). Summed over seven peers, 56 NVLinks passed the slots the chip lists,
    so every GPU with its 8 up read "8 of 18 (or 12) active", an error that drained the node. On a switch board a
    pair's NV# is all of the GPU's links: 8 should be up, and a GPU with 7 is still named. The HGX H100 topology
    sglang#30401 published, with NV18 turned NV8 as on nccl#933's board."""
    topo = need(PUBLIC / "topo" / "hgx-h100-8gpu-8nic-sglang30401.txt").read_text().replace("NV18", "NV8")
    arch = 9 if "H800" in model else 8
    down = {i: list(range(8, slots)) for i in range(8)}
    snapshot = make_snapshot(tmp_path / "snap", nvml_gpus=hgx_nvml(slots, 6 if arch == 9 else 5, down, name=model, arch=arch))
    (snapshot / "nvidia-smi-topo-m.txt").write_text(topo)
    report = build_report(SnapshotHost(snapshot))
    assert nvlink_findings(report) == [] and not drains(report)
    assert {g.nvlinks_wired for g in report.gpus} == {8}
    down[3] = [0, *range(8, slots)]
    snapshot = make_snapshot(tmp_path / "broken", nvml_gpus=hgx_nvml(slots, 6 if arch == 9 else 5, down, name=model, arch=arch))
    (snapshot / "nvidia-smi-topo-m.txt").write_text(topo)
    assert ("nvlink_inactive", "gpu3", "error", 7, 8) in nvlink_findings(build_report(SnapshotHost(snapshot)))


def test_the_golden_topology_says_what_is_wired_when_siblings_cannot(tmp_path):
    """Two GPUs of a model nodecheck has no board row for, both down to 3 of their 4 links: the siblings agree on 3,
    the config's [links] (written by `config init` on the healthy node) says NV4."""
    gpus = cards("NVIDIA Example Bridged", 4, {0: (2,), 1: (2,)}, arch=7)
    assert nvlink_findings(report_of(tmp_path, gpus)) == []  # nothing says 4: the check cannot know, and passes
    config = Config(links={(0, 1): "NV4"})
    assert [f[1:] for f in nvlink_findings(report_of(tmp_path / "c", gpus, config))] == [
        ("gpu0", "error", 3, 4), ("gpu1", "error", 3, 4)]


def test_a_one_gpu_vm_whose_nvlink_peers_are_outside_it_is_not_drained(tmp_path):
    """A one-GPU slice of an SXM board (H200): its 18 slots read inactive, its NVSwitches are outside the VM; nothing
    in the VM says a link should be up."""
    gpus = [dict(h100_nvml_records()[0], name="NVIDIA H200", nvlink=[[link, 0, 6] for link in range(18)])]
    report = report_of(tmp_path, gpus, topo="1x-h100-pcie-kvm-vm-1nic.txt")
    assert nvlink_findings(report) == [] and not drains(report)


def test_nvlinks_per_gpu_still_counts_against_the_config(tmp_path):
    report = report_of(tmp_path, cards("NVIDIA H100 NVL", 18, {0: NVL_UNWIRED, 1: NVL_UNWIRED}, arch=9),
                       Config(nvlinks_per_gpu=18))
    assert ("nvlink_inactive", "gpu0", "error", 12, 18) in nvlink_findings(report)


# ---- the NVLink rate of the GPU in hand ----------------------------------------------------------------------

def gpu(index, name, arch, speed=None, links=4):
    return Gpu(index, name=name, architecture=arch, nvlink_speed_mbps=speed,
               nvlinks=[{"link": i, "active": True, "version": 5} for i in range(links)])


def host(index):
    return PathSpec(f"gpu{index}:host", "pcie", 31.5e9, "PCIe 4.0 x16")


@pytest.mark.parametrize("speed", [None, 14062])
def test_a_ga102_bridged_pair_runs_14_0625_gb_per_link(speed):
    """An RTX A6000 pair over its bridge: 4 links x 14.0625 GB/s = 56.25 GB/s each way (112.5 GB/s bidirectional, the
    datasheet), not Ampere's 25 per link (100 GB/s, under which a healthy 51 GB/s read 0.51)."""
    a, b = gpu(0, "NVIDIA RTX A6000", 7, speed), gpu(1, "NVIDIA RTX A6000", 7, speed)
    spec = pair_spec(a, b, "NV4", {0: host(0), 1: host(1)})
    assert spec.bytes_per_second == pytest.approx(56.25e9)
    assert ("NVML's link speed 14062 MB/s" if speed else "the board 'NVIDIA RTX A6000'") in spec.basis
    assert 51e9 / spec.bytes_per_second > 0.9


def test_nvml_speed_field_decides_and_an_unknown_reading_falls_back_to_the_architecture():
    hopper = pair_spec(gpu(0, "NVIDIA H100 80GB HBM3", 9, 26562, 18), gpu(1, "NVIDIA H100 80GB HBM3", 9, 26562, 18),
                       "NV18", {0: host(0), 1: host(1)})
    assert hopper.bytes_per_second == pytest.approx(450e9) and "NVML's link speed 26562 MB/s" in hopper.basis
    odd = pair_spec(gpu(0, "NVIDIA H100 80GB HBM3", 9, 31000, 18), gpu(1, "NVIDIA H100 80GB HBM3", 9, 31000, 18),
                    "NV18", {0: host(0), 1: host(1)})
    assert odd.bytes_per_second == pytest.approx(450e9) and "NVLink 4" in odd.basis
    a100 = pair_spec(gpu(0, A100_SXM4["name"], 7, links=12), gpu(1, A100_SXM4["name"], 7, links=12), "NV12",
                     {0: host(0), 1: host(1)})
    assert a100.bytes_per_second == pytest.approx(300e9) and "NVLink 3" in a100.basis


def test_the_snapshot_records_nvmls_speed_field(tmp_path):
    gpus = [dict(g, nvlink_speed=26562) for g in hgx_nvml()]
    report = report_of(tmp_path, gpus, topo="hgx-h100-8gpu-8nic-sglang30401.txt")
    assert {g.nvlink_speed_mbps for g in report.gpus} == {26562}
    pair = next(p for p in report.paths if p.path == "gpu0:gpu1")
    assert pair.bytes_per_second == pytest.approx(450e9) and "26562 MB/s" in pair.basis
    garbage = report_of(tmp_path / "g", [dict(g, nvlink_speed=4_000_000_000) for g in hgx_nvml()])
    assert {g.nvlink_speed_mbps for g in garbage.gpus} == {None}
