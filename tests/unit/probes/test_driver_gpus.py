"""The GPUs the NVIDIA kernel driver manages (/proc/driver/nvidia/gpus) against those NVML lists. A driver upgraded
without a reboot leaves NVML's library and the loaded module of different versions: NVML cannot start ("RM has
detected an NVML/RM version mismatch", nvidia-smi's "Driver/library version mismatch"), nvidia-smi fails too, and
the node listed no GPU with two probe warnings: it passed every check unless [gpus] count was set, and every job on
it failed. Replayed from snapshots: NVML's answers through the stand-in, its failures as a snapshot records them."""

import json

import pytest
from helpers import hgx_nvml, make_snapshot

from nodecheck.checks import evaluate
from nodecheck.config import Config, loads
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report

HGX_BDFS = [f"0000:{0x18 + i * 0x10:02x}:00.0" for i in range(8)]  # hgx_nvml's GPUs, as the driver names them
MISMATCH = "NVML initialisation failed: RM has detected an NVML/RM version mismatch."
NO_DEVICES = "no NVIDIA driver: no /dev/nvidiactl (the NVIDIA driver is not loaded, or its devices are not passed to this container)"


def snapshot(tmp_path, managed: list[str], nvml_gpus: list | None = None, nvml_failure: tuple[str, str] | None = None):
    root = make_snapshot(tmp_path / "snap", nvml_gpus=nvml_gpus)
    for name in managed:
        (root / "fs" / "proc" / "driver" / "nvidia" / "gpus" / name).mkdir(parents=True)
    if nvml_failure:
        outcome, error = nvml_failure
        (root / "sources.json").write_text(json.dumps({"nvml.json": {"outcome": outcome, "error": error}}))
    return root


def count_findings(root, config: Config | None = None) -> list:
    report = build_report(SnapshotHost(root))
    return [f for f in evaluate(report, config or Config()) if f.kind == "gpu_count_low"]


def test_nvml_failing_to_start_beside_the_drivers_gpus_fails_the_node(tmp_path):
    (finding,) = count_findings(snapshot(tmp_path, HGX_BDFS, nvml_failure=("failed", MISMATCH)))
    assert (finding.severity, finding.measured, finding.expected) == ("error", 0, 8)
    assert "the NVIDIA driver manages 8 (0000:18:00.0, 0000:28:00.0" in finding.message
    assert "version mismatch" in finding.message and "reboot the node" in finding.message


def test_nvml_out_of_reach_is_a_warning_not_a_drain(tmp_path):
    """A container the NVIDIA runtime did not set up sees the host's /proc/driver/nvidia and no /dev/nvidiactl: the
    node's GPUs are unchecked from here, which says nothing against them."""
    (finding,) = count_findings(snapshot(tmp_path, HGX_BDFS, nvml_failure=("no_data", NO_DEVICES)))
    assert (finding.severity, finding.measured, finding.expected) == ("warning", 0, 8)
    assert "NVIDIA_VISIBLE_DEVICES" in finding.message


def test_every_gpu_listed_or_counted_says_nothing(tmp_path):
    assert count_findings(snapshot(tmp_path, HGX_BDFS, nvml_gpus=hgx_nvml())) == []


def test_a_gpu_nvml_neither_lists_nor_counts_is_named_at_warning(tmp_path):
    """Inside a Slurm job whose device cgroup holds two of the eight GPUs, NVML lists two while /proc lists all eight:
    NVML running is no proof of a fault, so this says, and never drains (a GPU that failed to come up is counted
    and refused: gpu_inaccessible)."""
    seven = [g for g in hgx_nvml() if g["pci"] != "00000000:68:00.0"]
    (finding,) = count_findings(snapshot(tmp_path, HGX_BDFS, nvml_gpus=seven))
    assert (finding.severity, finding.measured, finding.expected) == ("warning", 7, 8)
    assert "(0000:68:00.0 unseen)" in finding.message and "hides GPUs" in finding.message


def test_a_gpu_nvml_counts_but_cannot_open_is_its_own_finding(tmp_path):
    from fakes import fake_pynvml

    gpus = hgx_nvml()
    gpus[5] = fake_pynvml.NVMLError_GpuIsLost("GPU is lost")
    assert count_findings(snapshot(tmp_path, HGX_BDFS, nvml_gpus=gpus)) == []  # gpu_inaccessible says it


def test_a_container_passed_two_gpus_sees_two(tmp_path):
    """The NVIDIA toolkit mounts a tmpfs over /proc/driver/nvidia and binds the entries of the GPUs it passes alone
    (libnvidia-container, mount_procfs_gpu)."""
    assert count_findings(snapshot(tmp_path, HGX_BDFS[:2], nvml_gpus=hgx_nvml()[:2])) == []


def test_with_a_gpu_count_expected_one_finding_says_it(tmp_path):
    config = loads("[gpus]\ncount = 8\n", "test")
    (finding,) = count_findings(snapshot(tmp_path, HGX_BDFS, nvml_failure=("failed", MISMATCH)), config)
    assert (finding.measured, finding.expected) == (0, 8) and "reboot the node" in finding.message


@pytest.mark.parametrize("name", ["..", "gpu0", "0000:18:00.0x", "0000:zz:00.0"])
def test_other_names_in_the_drivers_list_are_not_gpus(tmp_path, name):
    root = snapshot(tmp_path, [], nvml_failure=("failed", MISMATCH))
    (root / "fs" / "proc" / "driver" / "nvidia" / "gpus").mkdir(parents=True)
    if name != "..":
        (root / "fs" / "proc" / "driver" / "nvidia" / "gpus" / name).mkdir()
    assert count_findings(root) == []
