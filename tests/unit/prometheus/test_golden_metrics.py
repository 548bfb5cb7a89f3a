"""The whole exposition of an 8-GPU HGX H100 snapshot (published topology, NVML as such a board reports,
one NVLink down on gpu3 and its Xid 74 in the kernel log, gpu3's PCIe path with AER counts) with one all-reduce measurement
and one gemm, compared byte for byte with
tests/golden/hgx-h100-8gpu.prom, as node_exporter's e2e-output test does: a change to any metric's
name, help, labels or value shows here. Regenerate on purpose only:
    NODECHECK_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/prometheus/test_golden_metrics.py"""

import dataclasses
import os

from helpers import REPO, hgx_nvml, make_snapshot, write_pci_tree

from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.prometheus.exposition import write_textfile
from nodecheck.report.model import Measurement
from nodecheck.verdicts.bandwidth import with_measurements

GOLDEN = REPO / "tests" / "golden" / "hgx-h100-8gpu.prom"


def exposition(tmp_path) -> str:
    snap = make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml(inactive={3: [7]}))
    # gpu3 (0000:48:00) logged the NVLink Xid of its link down, as /dev/kmsg records it
    (snap / "kmsg.txt").write_text("4,1812,8312000001,-;NVRM: Xid (PCI:0000:48:00): 74, pid=1234, NVLink: fatal error detected "
                                   "on link 7(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)\n")
    # gpu3 behind a PCIe switch port, each with the AER counts the kernel keeps
    write_pci_tree(snap, {"0000:47:00.0": ("0x060400", "pci0000:40/0000:40:01.0/0000:47:00.0", 16, 16, "32.0 GT/s PCIe"),
                          "0000:48:00.0": ("0x030200", "pci0000:40/0000:40:01.0/0000:47:00.0/0000:48:00.0", 16, 16, "32.0 GT/s PCIe")},
                   {"0000:47:00.0": {"correctable": 3, "nonfatal": 0, "fatal": 0}, "0000:48:00.0": {"correctable": 0, "nonfatal": 0, "fatal": 0}})
    config = Config(nvlinks_per_gpu=18)
    report = build_report(SnapshotHost(snap), config)
    # what differs between two runs by nature: when, and how long each probe took
    report = dataclasses.replace(report, generated_at=1_800_000_000.0, node=dict(report.node, nodecheck_version="golden"),
                                 probes=[dataclasses.replace(p, duration_seconds=0.5) for p in report.probes])
    allreduce = Measurement.measured("allreduce:16-ranks", "allreduce", 380e9, 400e9, 1 << 31,
                                     "torch.distributed nccl all_reduce", "busbw", {"path_kind": "infiniband"})
    gemm = Measurement.computed("gpu0:compute", "gemm", 797.5e12, 989.4e12, 3 * 8192 * 8192 * 2,
                                "BF16 matrix multiplies", "bf16 dense", {"path_kind": "compute"})
    report = with_measurements(report, [allreduce, gemm], 1_800_000_060.0, config)
    return write_textfile(report, tmp_path).read_text().replace(f'version="{_version()}"', 'version="golden"')


def _version() -> str:
    from nodecheck import __version__

    return __version__


def test_the_exposition_is_the_golden_file(tmp_path):
    text = exposition(tmp_path)
    if os.environ.get("NODECHECK_REGENERATE_GOLDEN"):
        GOLDEN.write_text(text)
    golden = GOLDEN.read_text()
    assert without_new_checks(text, golden) == golden, "the exposition changed: regenerate the golden file if that was meant"


def without_new_checks(text: str, golden: str) -> str:
    """The exposition without the check_healthy/check_unknown lines of finding kinds added since the golden
    file was written: a new rule is not a change of the exposition (test_prometheus checks each kind is in
    exactly one of the two series); a kind removed or a verdict changed still is."""
    import re

    known = set(re.findall(r'check="([a-z0-9_]+)"', golden))
    series = ("nodecheck_check_healthy{", "nodecheck_check_unknown{")
    return "".join(line for line in text.splitlines(keepends=True)
                   if not (line.startswith(series) and re.search(r'check="([a-z0-9_]+)"', line)[1] not in known))


def test_docs_metrics_lists_exactly_the_exposed_series(tmp_path):
    """docs/metrics.md names each series in full in its first column; a series added, renamed or dropped
    without its row fails here."""
    import re

    from nodecheck.kubernetes.device_taints import DeviceTaints
    from nodecheck.kubernetes.node_health import NodeHealth

    # serve --kubernetes-conditions adds its own series to /metrics, and --kubernetes-device-taints two more
    publisher = NodeHealth(None, "node-1", device_taints=DeviceTaints(None, "node-1"))
    publisher.record_round(True)
    exposed = set(re.findall(r"^# TYPE (\S+) ", exposition(tmp_path) + publisher.exposition().decode(), re.M))
    rows = [line.split("|")[1] for line in (REPO / "docs" / "metrics.md").read_text().splitlines() if line.startswith("| `")]
    documented = {name for cell in rows for name in re.findall(r"`([a-z0-9_]+)`", cell)}
    assert documented == exposed
