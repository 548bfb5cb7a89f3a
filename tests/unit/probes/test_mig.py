"""A GPU in MIG mode is not a broken NVLink fabric. NVIDIA's driver enables no NVLink on a GPU in MIG mode
(open-gpu-kernel-modules, knvlinkStateLoad: "NvLink is not supported with MIG", enabledLinks = 0) and CUDA has
no peer-to-peer between MIG devices (NCCL issue 1716, NVIDIA: "MIG doesn't support P2P from CUDA using either
PCIE or NVLINK"). Before, an HGX H100 node with one GPU partitioned for inference read as 18 inactive NVLinks:
an error that drained it, a critical alert, and a p2p test that failed. The replayed NVML values are the real
H100's, with NVML's MIG mode answer ([current, pending], 1 = on) and the links as such a GPU shows them."""

import json
import re

import pytest
from helpers import hgx_nvml, make_snapshot

from nodecheck.assemble.fingerprint import sku
from nodecheck.bench.plan import without_mig_gpus
from nodecheck.checks import unmade_checks
from nodecheck.config import Config, loads
from nodecheck.config.init import generate
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.prometheus.exposition import write_textfile

TOPO = "8x-h100-nv18-2numa-noNIC-mlengineering.txt"


def golden_config() -> Config:
    """What `nodecheck config --from` writes for a healthy HGX H100 board: 18 links per GPU, every pair NV18."""
    pairs = "\n".join(f'"gpu{a}-gpu{b}" = "NV18"' for a in range(8) for b in range(a + 1, 8))
    return loads(f"[gpus]\ncount = 8\nnvlinks_per_gpu = 18\n\n[links]\n{pairs}\n", "golden.toml")


def node(tmp_path, mig: dict[int, list], links_off_as="inactive", topo_without_nvlink=False, config=None):
    """The HGX board with the GPUs of `mig` ({gpu: [current, pending]}) in MIG mode: their links inactive
    (or NVML refusing the link state), and `nvidia-smi topo -m` showing SYS for their pairs where asked."""
    on = {g for g, mode in mig.items() if isinstance(mode, list) and mode[0]}  # "ERR": a GPU without MIG
    gpus = hgx_nvml(inactive={g: list(range(18)) for g in on})
    for index, mode in mig.items():
        gpus[index]["mig"] = mode
        if index in on and links_off_as == "refused":
            gpus[index]["nvlink"] = [[0, "ERR Not Supported"]]
    snap = make_snapshot(tmp_path / "snap", topo=TOPO, nvml_gpus=gpus)
    if topo_without_nvlink:  # each NV18 cell of a MIG GPU's row or column becomes SYS, at the same width
        rows = (snap / "nvidia-smi-topo-m.txt").read_text().splitlines()
        header = rows[0].split()
        in_mig = {f"GPU{g}" for g in on}
        fixed = [rows[0]]
        for row in rows[1:]:
            parts = re.split(r"(\s+)", row)
            words = [i for i, part in enumerate(parts) if part and not part.isspace()]
            if parts and parts[words[0]].startswith("GPU"):
                for column, i in enumerate(words[1:9]):
                    if parts[i].startswith("NV") and (parts[words[0]] in in_mig or header[column] in in_mig):
                        parts[i] = "SYS".rjust(len(parts[i]))
            fixed.append("".join(parts))
        (snap / "nvidia-smi-topo-m.txt").write_text("\n".join(fixed) + "\n")
    return build_report(SnapshotHost(snap), config or golden_config())


def test_the_nvml_reader_takes_the_mig_mode(tmp_path):
    report = node(tmp_path, {3: [1, 1], 5: [0, 1]})
    modes = {g.index: (g.mig_enabled, g.mig_pending) for g in report.gpus}
    assert modes[3] == (True, True) and modes[5] == (False, True) and modes[0] == (False, False)


@pytest.mark.parametrize("links_off_as", ["inactive", "refused"])
@pytest.mark.parametrize("topo_without_nvlink", [False, True])
def test_a_gpu_in_mig_mode_is_said_not_failed(tmp_path, links_off_as, topo_without_nvlink):
    """One GPU of eight in MIG mode: its links are off by design, not broken (no error); that its seven siblings are
    whole says it was likely partitioned by mistake, a warning."""
    report = node(tmp_path, {3: [1, 1]}, links_off_as, topo_without_nvlink)
    about_gpu3 = [(f.kind, f.severity) for f in report.findings if "gpu3" in f.subject]
    assert about_gpu3 == [("gpu_mig_mode", "warning")], report.findings
    (said,) = [f for f in report.findings if f.kind == "gpu_mig_mode"]
    assert "most of its siblings are not" in said.message and "-mig 0" in said.message
    assert not [f for f in report.findings if f.severity in ("error", "critical")], report.findings


@pytest.mark.parametrize("in_mig", [range(8), range(4)])
def test_a_node_partitioned_on_purpose_is_said_as_info(tmp_path, in_mig):
    """Every GPU, or half of them, in MIG mode: a node partitioned on purpose, each GPU said as info."""
    report = node(tmp_path, {i: [1, 1] for i in in_mig})
    said = [(f.subject, f.severity) for f in report.findings if f.kind == "gpu_mig_mode"]
    assert said == [(f"gpu{i}", "info") for i in in_mig], report.findings
    first = next(f for f in report.findings if f.kind == "gpu_mig_mode")
    assert "NVLink and GPU peer-to-peer are off by design" in first.message


def test_without_mig_the_same_links_are_an_error(tmp_path):
    """The control: the same 18 links down on a GPU not in MIG mode are the fault they were."""
    gpus = hgx_nvml(inactive={3: list(range(18))})
    report = build_report(SnapshotHost(make_snapshot(tmp_path / "snap", topo=TOPO, nvml_gpus=gpus)), golden_config())
    assert {("nvlink_inactive", "error"), ("nvlink_count_low", "error")} <= {(f.kind, f.severity) for f in report.findings
                                                                            if f.subject == "gpu3"}


def test_a_node_declared_without_mig_fails_a_gpu_in_mig_mode(tmp_path):
    config = golden_config()
    config.mig = False
    report = node(tmp_path, {3: [1, 1]}, config=config)
    (finding,) = [f for f in report.findings if f.kind == "gpu_mig_mode"]
    assert finding.severity == "error" and finding.subject == "gpu3" and "-mig 0" in finding.message
    config.mig = True
    report = node(tmp_path / "b", {3: [1, 1]}, config=config)
    assert {f.subject for f in report.findings if f.kind == "gpu_mig_mode" and f.severity == "error"} == {
        f"gpu{i}" for i in range(8) if i != 3}


def test_a_mode_waiting_for_the_reset_is_a_warning(tmp_path):
    report = node(tmp_path, {2: [0, 1]})
    (finding,) = [f for f in report.findings if f.kind == "gpu_mig_mode"]
    assert (finding.severity, finding.subject, finding.measured) == ("warning", "gpu2", "off, on pending")
    assert "nvidia-smi -r -i 2" in finding.message


def test_a_gpu_without_mig_says_nothing(tmp_path):
    report = node(tmp_path, {0: "ERR"})
    assert report.gpus[0].mig_enabled is None and not [f for f in report.findings if f.kind == "gpu_mig_mode"]


def test_the_golden_config_keeps_the_mode_and_config_reads_it(tmp_path):
    text = generate(node(tmp_path, {}))
    assert "mig = false" in text
    with pytest.raises(Exception, match="gpus.mig': expected true or false"):
        loads('[gpus]\nmig = "no"\n', "bad.toml")


def test_in_node_tests_leave_mig_gpus_out(tmp_path):
    report = node(tmp_path, {3: [1, 1]})
    kept, tests = without_mig_gpus(report, {"h2d", "d2h", "p2p", "allreduce"})
    assert [g.index for g in kept.gpus] == [0, 1, 2, 4, 5, 6, 7] and tests == {"h2d", "d2h", "p2p", "allreduce"}
    every = node(tmp_path / "all", {i: [1, 1] for i in range(8)})
    kept, tests = without_mig_gpus(every, {"h2d", "p2p", "allreduce"})
    assert kept.gpus == [] and tests == set()  # not run, not failed: nothing there to judge
    assert "every GPU is in MIG mode" in unmade_checks(every)["nvlink_inactive"]
    assert not [f for f in every.findings if f.severity in ("error", "critical")]


def test_a_mig_node_is_not_a_peer_of_the_others_and_publishes_its_mode(tmp_path):
    report = node(tmp_path, {3: [1, 1]})
    assert sku(report) == "7x NVIDIA H100 80GB HBM3 + 1x NVIDIA H100 80GB HBM3 (MIG)"
    text = write_textfile(report, tmp_path).read_text()
    assert 'nodecheck_gpu_mig_enabled{gpu="3"} 1.0' in text and 'nodecheck_gpu_mig_enabled{gpu="0"} 0.0' in text
    assert json.loads(json.dumps(report.to_dict()))["gpus"][3]["mig_enabled"] is True


def test_a_bench_on_a_node_all_in_mig_fails_nothing(tmp_path):
    """`nodecheck bench` with every test asked, nccl-tests' too: nothing runs, so nothing fails and nothing drains;
    the findings say why (before: p2p and the in-node all-reduce failed, and all_reduce_perf -g 8 was started)."""
    from nodecheck.bench import plan

    every = node(tmp_path, {i: [1, 1] for i in range(8)})
    assert plan.run(every, Config(), ["h2d", "d2h", "p2p", "allreduce", "nccl_tests"], "quick", 30, {}, None) == []


def test_inspect_shows_a_mig_gpus_links_as_off_by_design(tmp_path):
    """The GPU table said "0/18 up" for the MIG GPU (read as a fault), and the binding advice named it by index,
    where a MIG GPU is used through its instances' UUIDs."""
    from helpers import nodecheck

    gpus = hgx_nvml(inactive={3: list(range(18))})
    gpus[3]["mig"] = [1, 1]
    snap = make_snapshot(tmp_path / "snap", topo=TOPO, nvml_gpus=gpus)
    shown = nodecheck("inspect", "--from", str(snap), env={"COLUMNS": "200"}).stdout
    (row,) = [line for line in shown.splitlines() if line.startswith("│ 3 ")]
    assert "off (MIG mode)" in row and "0/18" not in row
    assert "gpu3: CUDA_VISIBLE_DEVICES=<MIG-uuid from `nvidia-smi -L`, gpu3>" in shown
    assert "gpu2: CUDA_VISIBLE_DEVICES=2 " in shown and "18/18 up" in shown
