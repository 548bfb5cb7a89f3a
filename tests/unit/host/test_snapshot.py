"""Snapshots assembled from a real node's captured sources, and one this project captured itself."""

import json

import pytest
from helpers import REPO, h100_node_snapshot, nodecheck

from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report

CPU_VM = REPO / "tests" / "fixtures" / "cpu-vm-2core"


def test_h100_node_end_to_end(tmp_path):
    report = build_report(SnapshotHost(h100_node_snapshot(tmp_path / "h100")))
    # every source the capture holds reads (no /sys/module, /proc/cmdline or PCI tree in it: those give no data)
    assert all(p.ok or (p.name in ("platform", "pcie_paths", "pcie_acs", "imex", "kernel_log", "history") and p.no_data) for p in report.probes), [
        (p.name, p.error) for p in report.probes]
    (gpu,) = report.gpus
    assert (gpu.name, gpu.cpu_affinity, gpu.numa_node, gpu.pcie["gen_max"], gpu.pcie["width_current"]) == (
        "NVIDIA H100 80GB HBM3", "0-15", 0, 5, 16)
    host = next(p for p in report.paths if p.path == "gpu0:host")
    assert host.bytes_per_second == pytest.approx(63.0e9, rel=1e-3)
    eth0 = next(n for n in report.nics if n.name == "eth0")
    assert (eth0.speed_mbps, eth0.numa_node, eth0.mtu) == (None, 0, 1400)  # speed -1: unknown; NUMA from hwloc
    assert report.cpu.pus == 16 and report.node["driver_version"] == "580.159.04"
    assert report.findings == []
    assert report.advice[0]["lines"][0] == "CUDA_VISIBLE_DEVICES=0"
    assert report.advice[0]["lines"][-1] == "numactl --cpunodebind=0 --membind=0 <command>"


def test_driver_version_from_the_kernel_module(tmp_path):
    snap = tmp_path / "s"
    (snap / "fs/proc/driver/nvidia").mkdir(parents=True)
    (snap / "fs/proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  (dvs-builder@U16-I3-B03-4-3)\n")
    assert build_report(SnapshotHost(snap)).node["driver_version"] == "570.133.20"


def test_self_captured_cpu_node_fixture():
    """`nodecheck snapshot` taken on this project's 2-core CI-kind VM (no GPU), kept as a regression fixture."""
    result = nodecheck("inspect", "--json", "--from", str(CPU_VM))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["cpu"]["packages"], report["cpu"]["numa_nodes"], report["cpu"]["pus"]) == (1, 1, 2)
    assert report["gpus"] == [] and "nvidia-smi not found on PATH" in report["gpus_absent_reason"]
    eth0 = {n["name"]: n for n in report["nics"]}["eth0"]
    assert (eth0["driver"], eth0["pci_address"], eth0["speed_mbps"], eth0["numa_node"]) == ("virtio_net", "0000:00:03.0", None, 0)
    assert {p["name"]: (p["ok"], p["no_data"]) for p in report["probes"]} == {
        "nvidia_smi_topo": (False, True), "nvml": (False, True), "lstopo": (True, False), "nics": (True, False),
        "platform": (False, True), "pcie_paths": (True, False),  # captured before nodecheck read /sys/module and /proc/cmdline
        "pcie_acs": (False, True), "imex": (False, True), "kernel_log": (False, True), "history": (False, True)}  # ... lspci, dmesg
