"""GPUDirect RDMA's peer-memory module and the IOMMU's treatment of GPUs and RDMA NICs: read through the
host (this machine's real /sys and /proc; snapshots laid out as the kernel lays them out), recorded and
replayed, judged."""

import json

from helpers import REPO, gpu_node_with_rdma, hgx_h100_with_ndr, nodecheck

from nodecheck.host.live import LiveHost
from nodecheck.probes.platform import collect, parse_cmdline


def test_this_machine():
    """The CI kind of VM: modules listed, no peer-memory module, an IOMMU groups folder with no group."""
    facts = collect(LiveHost(), 5.0)
    assert facts.modules_known and facts.peer_memory is None and facts.iommu == {}


def test_a_snapshot_replays_the_live_facts(tmp_path):
    assert nodecheck("snapshot", str(tmp_path / "snap")).returncode == 0
    live = json.loads(nodecheck("inspect", "--json").stdout)["platform"]
    replayed = json.loads(nodecheck("inspect", "--json", "--from", str(tmp_path / "snap")).stdout)["platform"]
    assert replayed == live and live["modules_known"]


def test_the_command_lines_iommu_parameters():
    assert parse_cmdline("BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt quiet amd_iommu=off") == [
        "intel_iommu=on", "iommu=pt", "amd_iommu=off"]
    assert parse_cmdline("") == []


def with_platform(tmp_path, modules: list[str], groups: dict[str, tuple[str, list[str]]], cmdline: str = "",
                  driver: str | None = None, kernel: str | None = None):
    """An HGX H100 node with NDR rails whose /sys/module and /sys/kernel/iommu_groups are as given."""
    report = hgx_h100_with_ndr(tmp_path)  # builds tmp_path/hgx
    snap = tmp_path / "hgx"
    for name in modules:
        (snap / "fs/sys/module" / name).mkdir(parents=True)
    for group, (kind, devices) in groups.items():
        folder = snap / "fs/sys/kernel/iommu_groups" / group
        (folder / "devices").mkdir(parents=True)
        (folder / "type").write_text(kind + "\n")
        for device in devices:
            (folder / "devices" / device).mkdir()
    (snap / "fs/proc").mkdir(parents=True, exist_ok=True)
    (snap / "fs/proc/cmdline").write_text(cmdline + "\n")
    if driver is not None:
        (snap / "fs/proc/driver/nvidia").mkdir(parents=True)
        (snap / "fs/proc/driver/nvidia/version").write_text(driver)
    if kernel is not None:
        (snap / "identity.json").write_text(json.dumps({"hostname": "hgx", "kernel": kernel}))
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.pipeline import build_report

    assert report.gpus
    return build_report(SnapshotHost(snap))


def kinds(report):
    return sorted((f.kind, f.subject) for f in report.findings if f.kind in ("gpudirect_rdma_unavailable", "iommu_translated"))


def test_gpudirect_rdma_needs_its_module(tmp_path):
    assert kinds(with_platform(tmp_path / "a", ["nvidia", "mlx5_core"], {})) == [("gpudirect_rdma_unavailable", "node")]
    assert kinds(with_platform(tmp_path / "b", ["nvidia", "mlx5_core", "nvidia_peermem"], {})) == []
    assert kinds(with_platform(tmp_path / "c", ["nvidia", "nv_peer_mem"], {})) == []


def test_a_translated_iommu_group_is_named(tmp_path):
    """gpu0 (0000:18:00.0 on this board) in a DMA-FQ group, gpu1 in an identity one."""
    report = with_platform(tmp_path, ["nvidia_peermem"], {"27": ("DMA-FQ", ["0000:18:00.0"]), "28": ("identity", ["0000:28:00.0"])},
                           "intel_iommu=on")
    assert kinds(report) == [("iommu_translated", "gpu0")]
    (finding,) = [f for f in report.findings if f.kind == "iommu_translated"]
    assert "DMA-FQ" in finding.message and "intel_iommu=on" in finding.message and "iommu=pt" in finding.message


def test_without_rdma_nics_no_module_is_needed(tmp_path):
    from helpers import hgx_nvml

    report = gpu_node_with_rdma(tmp_path / "plain", "hgx-h100-8gpu-8nic-sglang30401.txt", hgx_nvml(), [])
    assert kinds(report) == []


H100_OPEN = (REPO / "tests/fixtures/h100-vm-1gpu/fs/proc/driver/nvidia/version").read_text()  # the H100 node's, as read
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"


def test_dma_buf_stands_in_for_the_peer_memory_module(tmp_path):
    """The open kernel modules (the H100 node's driver) on Linux >= 5.12 give NICs GPU memory through DMA-BUF:
    no finding without nvidia_peermem. The proprietary modules, an older kernel, or an unknown driver do not."""
    base = ["nvidia", "mlx5_core"]
    report = with_platform(tmp_path / "a", base, {}, driver=H100_OPEN, kernel="6.8.0-45-generic")
    assert kinds(report) == [] and report.platform.gpudirect == "dma-buf"
    proprietary = with_platform(tmp_path / "b", base, {}, driver=PROPRIETARY, kernel="6.8.0-45-generic")
    assert kinds(proprietary) == [("gpudirect_rdma_unavailable", "node")]
    (finding,) = [f for f in proprietary.findings if f.kind == "gpudirect_rdma_unavailable"]
    assert "proprietary kernel modules" in finding.message
    old = with_platform(tmp_path / "c", base, {}, driver=H100_OPEN, kernel="5.4.0-216-generic")
    assert kinds(old) == [("gpudirect_rdma_unavailable", "node")] and old.platform.dma_buf is False
    loaded = with_platform(tmp_path / "d", [*base, "nvidia_peermem"], {}, driver=PROPRIETARY, kernel="5.4.0")
    assert loaded.platform.gpudirect == "nvidia_peermem"


def test_dma_buf_capability():
    from nodecheck.probes.platform import dma_buf_capable

    assert [dma_buf_capable(True, "5.12.0"), dma_buf_capable(True, "5.11.22"), dma_buf_capable(False, "6.1"),
            dma_buf_capable(None, "6.1"), dma_buf_capable(True, None), dma_buf_capable(True, "garbage")] == [
        True, False, False, None, None, None]


def test_the_iommu_listing_is_bounded_in_all(tmp_path):
    """4,096 groups of 16,384 names each was 67 million entries read: the devices of all groups together stop at
    MAX_IOMMU_DEVICES."""
    from nodecheck.probes import platform

    class Listing:
        def list_dir(self, path):
            if path.endswith("iommu_groups"):
                return [f"g{n}" for n in range(8)]
            if "iommu_groups/g" not in path:
                return ["nvidia"]  # /sys/module
            group = int(path.split("/")[-2][1:])
            return [f"{group:04x}:{n:06x}.0" for n in range(5000)]

        def read_text(self, path):
            return "DMA\n" if path.endswith("/type") else None

        def identity(self):
            return {}

    found = platform.collect(Listing(), 5.0)
    assert len(found.iommu) == platform.MAX_IOMMU_DEVICES  # 40,000 offered
