"""Findings from facts: snapshots of real captures, with faults injected where a test needs one."""

import json

import pytest
from helpers import h100_nvml_records, hgx_nvml, make_snapshot, nodecheck, without_gpus
from rich.console import Console

from nodecheck.config import Config, NicExpectation
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.render.report import render
from nodecheck.report.model import Measurement


def report_of(tmp_path, config=None, **sources):
    return build_report(SnapshotHost(make_snapshot(tmp_path / "snap", **sources)), config)


def kinds(report):
    return {(f.kind, f.subject, f.severity) for f in report.findings}


def h100(**changes):
    return [dict(h100_nvml_records()[0], **changes)]


def test_healthy_h100_has_no_findings_and_spec_63(tmp_path):
    report = report_of(tmp_path, topo="1x-h100-pcie-kvm-vm-1nic.txt", nvml_gpus=h100())
    assert report.findings == []
    host = next(p for p in report.paths if p.path == "gpu0:host")
    assert host.bytes_per_second == pytest.approx(63.0e9, rel=1e-3) and "PCIe 5.0 x16" in host.basis


def test_idle_gpu_at_gen1_is_power_saving_not_a_finding(tmp_path):
    report = report_of(tmp_path, topo="1x-h100-pcie-kvm-vm-1nic.txt", nvml_gpus=h100(gen=1, util=0))
    assert not [f for f in report.findings if f.kind == "pcie_downtrained"]
    host = next(p for p in report.paths if p.path == "gpu0:host")
    assert "PCIe 5.0" in host.basis and "idle" in host.basis


def test_busy_gpu_at_gen1_is_a_warning(tmp_path):
    report = report_of(tmp_path, nvml_gpus=h100(gen=1, util=95))
    assert ("pcie_downtrained", "gpu0", "warning") in kinds(report)
    assert next(p for p in report.paths if p.path == "gpu0:host").bytes_per_second == pytest.approx(4.0e9)


def test_width_downtraining_is_an_error_with_the_figure(tmp_path):
    report = report_of(tmp_path, nvml_gpus=h100(width=8))
    (finding,) = [f for f in report.findings if f.kind == "pcie_downtrained"]
    assert (finding.severity, finding.measured, finding.expected) == ("error", "x8", "x16")
    assert finding.message.startswith("gpu0 PCIe x8 < x16")
    assert report.worst_severity() == "error"


def test_a_lowered_power_limit_is_said_and_never_fails_the_node(tmp_path):
    """`nvidia-smi -pl 500` on the H100 (default 700 W, as its `nvidia-smi -q` says): info, with the command that
    restores it; at its default, or where NVML refuses the default, nothing."""
    report = report_of(tmp_path, nvml_gpus=h100(power_limit=500000))
    (finding,) = [f for f in report.findings if f.kind == "gpu_power_limit_lowered"]
    assert (finding.severity, finding.measured, finding.expected) == ("info", "500 W", "700 W")
    assert "`nvidia-smi -i 0 -pl 700` restores it" in finding.message and report.worst_severity() == "info"
    assert not [f for f in report_of(tmp_path / "h", nvml_gpus=h100()).findings if f.kind == "gpu_power_limit_lowered"]
    refused = report_of(tmp_path / "r", nvml_gpus=h100(power_limit=500000, power_limit_default="ERR Not Supported"))
    assert not [f for f in refused.findings if f.kind == "gpu_power_limit_lowered"]


def test_gpus_without_persistence_are_named_in_one_warning(tmp_path):
    """nvidia-persistenced not running on an HGX node: its eight GPUs say "Persistence Mode: Disabled". One warning
    for the node naming them; the H100 capture's "Enabled", or NVML not saying, is nothing."""
    from helpers import hgx_nvml

    gpus = [dict(g, persistence=0 if i in (2, 5) else 1) for i, g in enumerate(hgx_nvml())]
    report = report_of(tmp_path, nvml_gpus=gpus, topo="hgx-h100-8gpu-8nic-sglang30401.txt")
    (finding,) = [f for f in report.findings if f.kind == "gpu_persistence_off"]
    assert (finding.severity, finding.subject, finding.measured) == ("warning", "node", "off on gpu2, gpu5")
    assert "(2 of 8 GPUs)" in finding.message and "nvidia-persistenced" in finding.message
    assert [g.persistent for g in report.gpus].count(True) == 6
    from nodecheck.checks import unmade_checks

    for quiet in (h100(), h100(persistence="ERR Not Supported")):
        report = report_of(tmp_path / str(id(quiet)), nvml_gpus=quiet)
        assert not [f for f in report.findings if f.kind == "gpu_persistence_off"]
    assert unmade_checks(report)["gpu_persistence_off"] == "gpu0: NVML did not report its persistence mode"  # unknown


def test_gpu_count_below_expected_says_why(tmp_path):
    report = report_of(tmp_path, config=Config(gpu_count=8), topo="1x-h100-pcie-kvm-vm-1nic.txt")
    (finding,) = [f for f in report.findings if f.kind == "gpu_count_low"]
    assert (finding.measured, finding.expected, finding.severity) == (1, 8, "error")
    empty = report_of(tmp_path / "none", config=Config(gpu_count=1))
    assert "not in the snapshot" in [f for f in empty.findings if f.kind == "gpu_count_low"][0].message


def test_nvlink_inactive_and_pair_spec(tmp_path):
    report = report_of(tmp_path, config=Config(nvlinks_per_gpu=18), topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                       nvml_gpus=hgx_nvml(inactive={3: [5, 6]}))
    assert ("nvlink_inactive", "gpu3", "error") in kinds(report)
    assert ("nvlink_count_low", "gpu3", "error") in kinds(report)
    assert not [f for f in report.findings if f.subject == "gpu2"]
    pair = next(p for p in report.paths if p.path == "gpu0:gpu1")
    assert pair.bytes_per_second == 450e9 and "NVLink 4 x18" in pair.basis


def test_a_link_asleep_in_its_low_power_state_is_not_down(tmp_path):
    """nvmlDeviceGetNvLinkState answers only enabled or not; NVML's per-link field state (NVML_FI_DEV_NVLINK_GET_STATE)
    tells NVML_NVLINK_STATE_SLEEP (2: trained, idle at low power, woken by traffic) from a link that is down (0)."""
    gpus = hgx_nvml(inactive={3: [5, 6]})
    gpus[3] = dict(gpus[3], nvlink_field_state={5: 2, 6: 0})
    report = report_of(tmp_path, config=Config(nvlinks_per_gpu=18), topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                       nvml_gpus=gpus)
    (finding,) = [f for f in report.findings if f.kind == "nvlink_inactive"]
    assert (finding.subject, finding.measured) == ("gpu3", 17)  # link 6 down; link 5 asleep counts as up
    assert [(l["link"], l["active"]) for l in report.gpus[3].nvlinks if l["link"] in (5, 6)] == [(5, True), (6, False)]


def test_a_link_nvml_cannot_read_is_listed_and_never_counted_up(tmp_path):
    """NVML answers a link's state with Unknown Error (a GPU in trouble): the enumeration used to stop there, so
    gpu3 listed links 0-4, all up, and passed. Every link is now asked; the unread one is a warning without a
    config and missing against `nvlinks_per_gpu`, and the links after it are still read (link 9 down: an error)."""
    gpus = hgx_nvml()
    gpus[3] = dict(gpus[3], nvlink=[[5, "ERR Unknown Error"] if l[0] == 5 else l for l in gpus[3]["nvlink"]])
    report = report_of(tmp_path, topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=gpus)
    links = report.gpus[3].nvlinks
    assert len(links) == 18 and links[5] == {"link": 5, "active": None, "version": None, "error": "Unknown Error"}
    (finding,) = [f for f in report.findings if f.kind.startswith("nvlink")]
    assert (finding.severity, finding.subject, finding.measured, finding.expected) == ("warning", "gpu3", 17, 18)
    assert "link(s) 5: NVML could not read their state (Unknown Error)" in finding.message
    console = Console(record=True, width=250)
    render(report, console=console)
    assert "17/18 up, 1 unreadable" in console.export_text()
    from nodecheck.prometheus.exposition import exposition

    metrics = exposition(report).decode()  # NodecheckNvlinkDown compares active with links NVML read: no alert
    assert 'nodecheck_gpu_nvlink_links{gpu="3"} 17.0' in metrics and 'nodecheck_gpu_nvlink_active_links{gpu="3"} 17.0' in metrics
    assert 'nodecheck_gpu_nvlink_unreadable_links{gpu="3"} 1.0' in metrics and 'unreadable_links{gpu="2"}' not in metrics
    counted = report_of(tmp_path / "c", config=Config(nvlinks_per_gpu=18), topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                        nvml_gpus=gpus)
    assert ("nvlink_count_low", "gpu3", "error") in kinds(counted)
    gpus[3]["nvlink"][9] = [9, 0, 6]
    down = report_of(tmp_path / "d", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=gpus)
    assert {(f.kind, f.severity, f.measured) for f in down.findings if f.subject == "gpu3"} == {("nvlink_inactive", "error", 16)}


def test_a_gpu_listing_fewer_nvlinks_than_its_siblings(tmp_path):
    """NVML stops listing gpu3's links after link 15 (Not Supported for 16 and 17) where its seven siblings list 18:
    no link reads inactive, so nothing was said, and its NVLink traffic ran on 16. Without [gpus] nvlinks_per_gpu it
    is a warning naming the siblings' count; with it, the error it always was. Two GPUs of a node that disagree,
    with no majority, say nothing."""
    gpus = hgx_nvml()
    gpus[3] = dict(gpus[3], nvlink=gpus[3]["nvlink"][:16])
    report = report_of(tmp_path, topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=gpus)
    (finding,) = [f for f in report.findings if f.kind.startswith("nvlink")]
    assert (finding.kind, finding.severity, finding.subject, finding.measured, finding.expected) == (
        "nvlink_count_low", "warning", "gpu3", 16, 18)
    assert "most of its siblings (NVIDIA H100 80GB HBM3) 18: NVML no longer reports 2 of its links" in finding.message
    counted = report_of(tmp_path / "c", config=Config(nvlinks_per_gpu=18), topo="hgx-h100-8gpu-8nic-sglang30401.txt",
                        nvml_gpus=gpus)
    assert [(f.severity, f.subject) for f in counted.findings if f.kind == "nvlink_count_low"] == [("error", "gpu3")]
    two = [dict(gpus[0]), dict(gpus[3])]
    pair = report_of(tmp_path / "p", nvml_gpus=two)
    assert not [f for f in pair.findings if f.kind == "nvlink_count_low"]


def test_a_lost_gpu_lists_every_link_unread(tmp_path):
    """GPU is lost on every link from link 0: eighteen links of unknown state, not a GPU without NVLink."""
    gpus = hgx_nvml()
    gpus[2] = dict(gpus[2], nvlink=[[link, "ERR GPU is lost"] for link in range(18)])
    report = report_of(tmp_path, topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=gpus)
    assert [l["active"] for l in report.gpus[2].nvlinks] == [None] * 18
    assert ("nvlink_inactive", "gpu2", "warning") in kinds(report)


def test_a_reduced_nvlink_bandwidth_mode_is_said_and_named_in_a_slow_p2p_verdict(tmp_path, monkeypatch):
    """`nvidia-smi nvlink -sBwMode HALF`: every link still reads active and the topology still says NV18, so a p2p at
    half its rate was an error pointing at the links; the node's mode (nvmlSystemGetNvlinkBwMode, 3 = HALF) is now
    a warning of its own and named in that verdict. FULL, or a driver that does not say: nothing."""
    import sys

    from fakes import fake_pynvml

    from nodecheck.probes.nvml import dump_nvml
    from nodecheck.verdicts.bandwidth import with_measurements

    snap = make_snapshot(tmp_path / "snap", topo="hgx-h100-8gpu-8nic-sglang30401.txt")
    for mode, expected in ((3, [("warning", "mode HALF")]), (0, []), ("ERR", [])):
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(hgx_nvml(), nvlink_bw_mode=mode))
        (snap / "nvml.json").write_text(json.dumps(dump_nvml()))
        report = build_report(SnapshotHost(snap))
        assert [(f.severity, f.measured) for f in report.findings if f.kind == "nvlink_bw_reduced"] == expected, mode
    pair = report.path_spec("gpu0:gpu1")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(hgx_nvml(), nvlink_bw_mode=3))
    (snap / "nvml.json").write_text(json.dumps(dump_nvml()))
    report = build_report(SnapshotHost(snap))
    slow = Measurement.measured("gpu0:gpu1", "p2p", 0.42 * pair.bytes_per_second, pair.bytes_per_second, 1 << 30,
                                "copy", "unidirectional", {"path_kind": "nvlink"})
    (verdict,) = [f for f in with_measurements(report, [slow], 0.0, None).findings if f.kind == "bandwidth_below_spec"]
    assert verdict.message.endswith("error signals on this path: nvlink mode HALF")
    from nodecheck.prometheus.exposition import exposition

    assert 'nodecheck_nvlink_bw_mode_info{mode="HALF"} 1.0' in exposition(report).decode()
    from nodecheck.render.report import platform_lines

    assert "NVLink bandwidth mode: HALF" in platform_lines(report)


def test_a_blackwell_gpu_below_its_best_nvlink_mode_is_said_on_its_own_paths(tmp_path, monkeypatch):
    """Blackwell sets the reduced bandwidth mode per GPU (nvmlDeviceGetNvlinkBwMode, nvidia-ml-py's own structure
    filled as NVML fills it): gpu5 not at its best is a warning of its own, named in its slow pair's verdict and
    not in the verdict of a pair without it; at its best, or NVML refusing (before Blackwell), nothing."""
    import sys

    from fakes import fake_pynvml

    from nodecheck.probes.nvml import dump_nvml
    from nodecheck.verdicts.bandwidth import with_measurements

    snap = make_snapshot(tmp_path / "snap", topo="hgx-h100-8gpu-8nic-sglang30401.txt")
    for mode, expected in (({"bIsBest": 0, "bwMode": 2}, [("gpu5", "mode 2")]), ({"bIsBest": 1, "bwMode": 0}, []), (None, [])):
        gpus = hgx_nvml()
        gpus[5] = dict(gpus[5], bw_mode=mode)
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(gpus))
        (snap / "nvml.json").write_text(json.dumps(dump_nvml()))
        report = build_report(SnapshotHost(snap))
        assert [(f.subject, f.measured) for f in report.findings if f.kind == "nvlink_bw_reduced"] == expected, mode
    gpus[5] = dict(gpus[5], bw_mode={"bIsBest": 0, "bwMode": 2})
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(gpus))
    (snap / "nvml.json").write_text(json.dumps(dump_nvml()))
    report = build_report(SnapshotHost(snap))
    assert report.gpus[5].fabric.reduced_bw_mode == 2 and report.gpus[4].fabric.reduced_bw_mode is None
    spec = report.path_spec("gpu0:gpu5").bytes_per_second

    def verdict(path: str) -> str:
        slow = Measurement.measured(path, "p2p", 0.42 * spec, spec, 1 << 30, "copy", "unidirectional", {"path_kind": "nvlink"})
        return next(f.message for f in with_measurements(report, [slow], 0.0, None).findings if f.kind == "bandwidth_below_spec")

    assert verdict("gpu0:gpu5").endswith("error signals on this path: gpu5 mode 2")
    assert "error signals" not in verdict("gpu0:gpu1")


def test_nvlink_spec_unknown_without_nvml(tmp_path):
    report = report_of(tmp_path, topo="hgx-h100-8gpu-8nic-sglang30401.txt")
    pair = next(p for p in report.paths if p.path == "gpu0:gpu1")
    assert pair.bytes_per_second is None and "NVLink rate unknown: architecture not reported" in pair.basis


def test_pcie_pair_spec_is_the_slower_gpu(tmp_path):
    nvml = h100() + [dict(h100_nvml_records()[0], width=8, pci="00000000:00:07.0")]
    report = report_of(tmp_path, topo="2gpu-pcie-phb-numa-na-mlengineering.txt", nvml_gpus=nvml)
    pair = next(p for p in report.paths if p.path == "gpu0:gpu1")
    assert pair.bytes_per_second == pytest.approx(31.5e9, rel=1e-3) and pair.basis.startswith("PHB")


def test_nearest_nic_across_sockets(tmp_path):
    report = report_of(tmp_path, topo="4x-a30-nvlink-bridge-pairs-1nic-xeon6342.txt")
    far = {f.subject for f in report.findings if f.kind == "nic_far_from_gpu"}
    assert far == {"gpu0", "gpu1"}  # GPU2 (PXB) and GPU3 (PIX) sit next to mlx5_0


def test_a_grace_gpus_nics_all_read_sys_and_that_is_no_finding(tmp_path):
    """A GB200 tray's topo -m gives each GPU its memory's NUMA node and SYS to every NIC, its own Grace's included
    (sgl-project/sglang#11208: GPU NUMA ID 2, 10, 18 ...; NVIDIA/NVSentinel#1221: on Grace the topology "can't
    distinguish"): the A30 node's far GPUs, made Grace GPUs, give no nic_far_from_gpu."""
    import dataclasses

    from nodecheck.checks.nics import far_nics

    report = report_of(tmp_path, topo="4x-a30-nvlink-bridge-pairs-1nic-xeon6342.txt")
    assert {f.subject for f in far_nics(report, Config())} == {"gpu0", "gpu1"}
    coherent = [dataclasses.replace(g, gpu_numa_id=2 + 8 * g.index) for g in report.gpus]
    assert far_nics(dataclasses.replace(report, gpus=coherent), Config()) == []
    c2c = [dataclasses.replace(g, c2c={"links": 10, "link_mbps": 44712}) for g in report.gpus]
    assert far_nics(dataclasses.replace(report, gpus=c2c), Config()) == []


def test_link_type_changed_from_golden(tmp_path):
    config = Config(links={(0, 1): "NV18", (0, 2): "NV18"})
    report = report_of(tmp_path, config=config, topo="8gpu-pcie-all-sys-2socket-tabs.txt")
    changed = [f for f in report.findings if f.kind == "gpu_link_changed"]
    assert [(f.subject, f.measured, f.expected, f.severity) for f in changed] == [
        ("gpu0-gpu1", "SYS", "NV18", "error"), ("gpu0-gpu2", "SYS", "NV18", "error")]


def test_probe_failure_is_a_finding(tmp_path):
    snap = make_snapshot(tmp_path / "snap")
    (snap / "nvidia-smi-topo-m.txt").write_text("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    report = build_report(SnapshotHost(snap))
    outcome = {p.name: p for p in report.probes}["nvidia_smi_topo"]
    assert not outcome.ok and not outcome.no_data and "no header line" in outcome.error
    assert ("probe_failed", "probe:nvidia_smi_topo", "warning") in kinds(report)


def test_expected_nic_from_topo_only(tmp_path):
    config = Config(nics={"mlx5_0": NicExpectation(speed_mbps=400000)})
    report = report_of(tmp_path, config=config, topo="1x-h100-pcie-kvm-vm-1nic.txt")
    assert ("nic_down", "mlx5_0", "error") in kinds(report)  # state unknown from topo alone: not "up"


def test_ecc_and_row_remapping(tmp_path):
    """The captured H100 (ECC on, no remapping) is healthy; the same GPU with ECC off, a remapping pending
    or one failed (NVML's remapped-rows tuple: corrected, uncorrected, pending, failure), as NVIDIA
    documents them: reset the GPU, or replace it."""
    assert kinds(report_of(tmp_path / "a", nvml_gpus=h100())) == set()
    assert kinds(report_of(tmp_path / "b", nvml_gpus=h100(ecc_mode=[0, 0]))) == {("ecc_disabled", "gpu0", "warning")}
    assert kinds(report_of(tmp_path / "c", Config(ecc=True), nvml_gpus=h100(ecc_mode=[0, 0]))) == {("ecc_disabled", "gpu0", "error")}
    assert kinds(report_of(tmp_path / "d", Config(ecc=False), nvml_gpus=h100(ecc_mode=[0, 0]))) == set()
    # NVML's [current, pending]: off and set back on (awaiting a reset), or on and set to off at the next reset
    (back_on,) = report_of(tmp_path / "g", nvml_gpus=h100(ecc_mode=[0, 1])).findings
    assert back_on.measured == "off" and "set to on and waits for the GPU's reset" in back_on.message
    (going,) = report_of(tmp_path / "h", nvml_gpus=h100(ecc_mode=[1, 0])).findings
    assert (going.kind, going.severity, going.measured) == ("ecc_disabled", "warning", "off at the next reset")
    assert kinds(report_of(tmp_path / "i", Config(ecc=False), nvml_gpus=h100(ecc_mode=[1, 0]))) == set()
    assert kinds(report_of(tmp_path / "e", nvml_gpus=h100(retired=[0, 2, 1, 0]))) == {("row_remap_pending", "gpu0", "warning")}
    failed = report_of(tmp_path / "f", nvml_gpus=h100(retired=[0, 8, 0, 1]))
    (finding,) = failed.findings
    assert (finding.kind, finding.severity) == ("row_remap_failed", "error") and "replace the GPU" in finding.message


def test_a_wrong_all_reduce_result_is_its_own_finding_at_full_speed():
    """Issue 20 (10): a corrupting path passed at full speed. The worker checks one all-reduce of ones (each
    element must be the world size); a wrong count is an error of its own, whatever the bandwidth."""
    from nodecheck.config import Config
    from nodecheck.report.model import Measurement
    from nodecheck.verdicts.bandwidth import measurement_findings

    check = {"expected": 16, "elements": 16 << 28, "wrong_elements": 12}
    m = Measurement.measured("allreduce:16-ranks", "allreduce", 48e9, 50e9, 1 << 30, "nccl", "busbw", {"data_check": check})
    (finding,) = measurement_findings([m], Config())
    assert (finding.kind, finding.severity, finding.subject) == ("bench_wrong_result", "error", "allreduce:16-ranks")
    assert "12 of 4294967296 elements arrived wrong (expected: 16)" in finding.message
    assert measurement_findings([Measurement.measured("allreduce:16-ranks", "allreduce", 48e9, 50e9, 1 << 30, "nccl", "busbw",
                                                      {"data_check": dict(check, wrong_elements=0)})], Config()) == []


def test_no_driver_says_the_driver_is_not_loaded(tmp_path):
    """A real snapshot of this GPU-less machine: NVML finds no driver. Reseating a GPU would not help."""
    without_gpus()
    taken = nodecheck("snapshot", str(tmp_path / "snap"), timeout=120)
    assert taken.returncode == 0, taken.stderr
    config = tmp_path / "config.toml"
    config.write_text("[gpus]\ncount = 8\n")

    def advice() -> str:
        report = json.loads(nodecheck("inspect", "--json", "--from", str(tmp_path / "snap"), "-c", str(config)).stdout)
        (finding,) = [f for f in report["findings"] if f["kind"] == "gpu_count_low"]
        return finding["message"]

    assert "the NVIDIA driver is not loaded" in advice() and "reseat" not in advice()
    module = tmp_path / "snap/fs/proc/driver/nvidia/version"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n")
    assert "kernel module 580.159.04 is loaded but NVML's library is missing" in advice()
