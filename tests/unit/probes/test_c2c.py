"""A Grace-Hopper or Grace-Blackwell GPU reaches the host over NVLink-C2C, not PCIe. NVML's C2C fields (as a real
GH200 reports them: ten links at 44.712 GB/s, `nvidia-smi c2c -s` in xgboost's tests) now make its host path: before,
its host copies were judged against its PCIe link, so the 346 GB/s nvbandwidth measured on a healthy GH200 read
5.5 x "spec", and a C2C running at a quarter of its rate passed as well."""

import json
import sys

import pytest
from fakes import fake_pynvml
from helpers import h100_nvml_records

from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.probes.nvml import dump_nvml
from nodecheck.report.model import Measurement
from nodecheck.verdicts.bandwidth import judge_measurements

GH200_LINK_MBPS = 44712  # `nvidia-smi c2c -s` on a GH200: "C2C Link 0: 44.712 GB/s" ... "C2C Link 9"
GH200_H2D = 346e9  # nvbandwidth host_to_device_memcpy_ce on a healthy GH200 (NVIDIA/nvbandwidth#23)


def grace_gpu(tmp_path, monkeypatch, c2c, **changes):
    record = dict(h100_nvml_records()[0], name="NVIDIA GH200 480GB", c2c=c2c, **changes)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying([record]))
    snap = tmp_path / f"snap-{len(list(tmp_path.iterdir()))}"
    snap.mkdir()
    (snap / "nvml.json").write_text(json.dumps(dump_nvml()))
    return build_report(SnapshotHost(snap))


def h2d(report, rate: float) -> tuple[Measurement, list]:
    spec = report.path_spec("gpu0:host")
    m = Measurement.measured("gpu0:host", "h2d", rate, spec.bytes_per_second, 1 << 30, "copy", "h2d",
                             {"path_kind": spec.kind})
    (judged,), findings = judge_measurements(report, [m], Config())
    return judged, findings


def test_a_gh200s_host_path_is_its_c2c_links(tmp_path, monkeypatch):
    report = grace_gpu(tmp_path, monkeypatch, [(1, GH200_LINK_MBPS)] * 10)
    assert report.gpus[0].c2c == {"links": 10, "link_mbps": GH200_LINK_MBPS, "inactive": []}
    host = report.path_spec("gpu0:host")
    assert (host.kind, host.bytes_per_second) == ("c2c", pytest.approx(447.12e9))
    assert host.basis == "NVLink-C2C 10 links x 44712 MB/s (NVML)"
    healthy, findings = h2d(report, GH200_H2D)
    assert healthy.ratio == pytest.approx(0.774, abs=0.001) and findings == []
    assert "GH200" in healthy.details["threshold_basis"]
    slow, findings = h2d(report, 110e9)  # a quarter of the links' rate: 1.7 x the PCIe "spec" it was judged by
    (finding,) = findings
    assert (finding.kind, finding.severity, finding.measured) == ("bandwidth_below_spec", "error", "0.25")
    assert "nvidia-smi c2c -s" in finding.message
    assert not [f for f in report.findings if f.kind == "c2c_link_down"]
    from rich.console import Console

    from nodecheck.render.report import render

    console = Console(record=True, width=200)
    render(report, console=console)
    assert "447.1 GB/s (C2C)" in console.export_text()


def test_an_inactive_c2c_link_is_an_error_and_leaves_the_spec_of_the_others(tmp_path, monkeypatch):
    """A GB300 tray's GPU, as NCCL's topology dump shows one (`<c2c bw="44712" count="5"/>`), with one more link
    that NVML says is inactive."""
    from nodecheck.prometheus.exposition import exposition

    report = grace_gpu(tmp_path, monkeypatch, [(1, GH200_LINK_MBPS)] * 5 + [(0, GH200_LINK_MBPS)], arch=10)
    metrics = exposition(report).decode()
    assert 'nodecheck_gpu_c2c_links{gpu="0"} 6.0' in metrics and 'nodecheck_gpu_c2c_active_links{gpu="0"} 5.0' in metrics
    (finding,) = [f for f in report.findings if f.kind == "c2c_link_down"]
    assert (finding.severity, finding.subject, finding.measured, finding.expected) == ("error", "gpu0", 5, 6)
    assert "link(s) 5 inactive" in finding.message
    assert report.path_spec("gpu0:host").bytes_per_second == pytest.approx(5 * 44.712e9)


def test_a_c2c_link_idling_in_low_power_is_not_down(tmp_path, monkeypatch):
    """NVML's per-link power state (NVML_FI_DEV_C2C_LINK_POWER_STATE): a link idling in low power that NVML reports
    not active wakes with traffic, as an NVLink asleep does; it counts in the spec and raises nothing. One reported
    not active at full power is down."""
    asleep = grace_gpu(tmp_path, monkeypatch, [(1, GH200_LINK_MBPS, 0)] * 9 + [(0, GH200_LINK_MBPS, 1)])
    assert asleep.gpus[0].c2c == {"links": 10, "link_mbps": GH200_LINK_MBPS, "inactive": []}
    assert not [f for f in asleep.findings if f.kind == "c2c_link_down"]
    assert asleep.path_spec("gpu0:host").bytes_per_second == pytest.approx(447.12e9)
    down = grace_gpu(tmp_path, monkeypatch, [(1, GH200_LINK_MBPS, 0)] * 9 + [(0, GH200_LINK_MBPS, 0)])
    assert [f.measured for f in down.findings if f.kind == "c2c_link_down"] == [9]


def test_a_busy_grace_gpus_idle_pcie_link_is_no_finding(tmp_path, monkeypatch):
    """Its PCIe link carries no host copy: a busy GPU at gen1 there is not downtrained; a PCIe GPU so is warned."""
    busy = grace_gpu(tmp_path, monkeypatch, [(1, GH200_LINK_MBPS)] * 10, gen=1, util=95)
    assert not [f for f in busy.findings if f.kind == "pcie_downtrained"]
    pcie = grace_gpu(tmp_path, monkeypatch, None, gen=1, util=95)
    assert pcie.gpus[0].c2c is None and [f.severity for f in pcie.findings if f.kind == "pcie_downtrained"] == ["warning"]
    assert pcie.path_spec("gpu0:host").kind == "pcie"


def test_c2c_answers_nvml_refuses_or_garbles_are_no_c2c():
    from nodecheck.probes.nvml_c2c import parse_c2c

    errors: dict = {}
    assert parse_c2c({"error": "Not Supported"}, errors) is None and errors == {"c2c": "Not Supported"}
    for raw in (None, [], {"count": 2, "links": "x"}, {"links": [{"status": 1, "max_bw_mbps": -5}]},
                {"links": [{"status": 1, "max_bw_mbps": True}]}, {"links": []}):
        assert parse_c2c(raw, {}) is None, raw
    unread = parse_c2c({"links": [{"status": {"error": "Unknown Error"}, "max_bw_mbps": 1}, {"status": 1, "max_bw_mbps": 9}]}, {})
    assert unread == {"links": 1, "link_mbps": 9, "inactive": []}  # a status NVML failed to say is not "inactive"
