"""Why NCCL ran without GPUDirect RDMA, read from the lines it prints (published logs), and whether that is a fault on
the node: the NIC side and a node whose GPUs share a PCIe switch with their NIC warn; a node whose NICs sit past every
GPU's PCIe switch is NCCL's design (NVIDIA/nccl#465), said as info."""

import dataclasses
import json
from pathlib import Path

from helpers import PUBLIC, REPO, gpu_node_with_rdma, hgx_h100_with_ndr, hgx_nvml, nodecheck

from nodecheck.bench.nccl_debug import parse_nccl_debug
from nodecheck.verdicts.nccl_run import NcclRun, nccl_findings, nccl_run_from_details

FIXTURES = REPO / "tests" / "fixtures" / "nccl-debug"
NO_MODULE = FIXTURES / "nccl899-gdr-disabled-no-module.txt"  # NVIDIA/nccl#899: "(no module)" on mlx5_1..3
DISTANCE = FIXTURES / "nvpeermem56-nccl247-gdr-distance.txt"  # Mellanox/nv_peer_memory#56: NCCL 2.4.7's distance rule
NO_CAUSE = PUBLIC / "nccl-debug" / "2node-a100-ib-no-gdr-p2p-direct-pointer-read.txt"  # NVIDIA/nccl#629: no cause said


def no_gdr(run, report) -> list:
    return [f for f in nccl_findings(run, report) if f.kind == "nccl_no_gdr"]


def far_nic_node(tmp_path: Path):
    """ASUS ESC8000A-E12, 4x RTX 6000 Ada and 4 ConnectX ports, its published topo -m: every GPU meets every NIC
    through the CPU (NODE or SYS), each port an ACTIVE 200G InfiniBand link."""
    devices = [(f"mlx5_{i}", "200 Gb/sec (4X HDR)", "InfiniBand") for i in range(4)]
    return gpu_node_with_rdma(tmp_path / "asus", "asus-esc8000a-e12-4x-rtx6000ada-4nic.txt",
                              hgx_nvml(0, name="NVIDIA RTX 6000 Ada Generation", arch=8)[:4], devices)


def test_what_nccl_says_of_gdr_is_read():
    """The NIC side ("Disabled for HCA N 'name'", with 2.5-2.12's "(no module)"), the distance rule in each version's
    words, aws-ofi-nccl's own; NET/Socket's HCAs (never GPUDirect, NVIDIA/nccl#901) are nothing."""
    run = parse_nccl_debug(NO_MODULE.read_text())
    assert (run.gdr, run.gdr_off_nics, run.gdr_off_distance) == (False, ["mlx5_1 (no module)", "mlx5_2 (no module)",
                                                                         "mlx5_3 (no module)"], [])
    run = parse_nccl_debug(DISTANCE.read_text())
    assert run.gdr is False and run.gdr_off_nics == []
    assert run.gdr_off_distance == ["GPU 2[2] / HCA 0 (distance 3 >= 2)", "GPU 3[3] / HCA 0 (distance 3 >= 2)"]
    lines = [  # NVIDIA/DeepLearningExamples#383 (NCCL 2.5-2.12), NVIDIA/nccl#1537 (2.13+), NVIDIA/nccl#901 (sockets)
        "node-1:32726:33054 [0] NCCL INFO GPU Direct RDMA Disabled for GPU 18000 / HCA 0 (distance 5 > 4)",
        "node-1:32726:33054 [0] NCCL INFO GPU Direct RDMA Enabled for GPU 86000 / HCA 0 (distance 4 <= 4), read 0",
        "hostname1:25668:27396 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'",
        "qygpu047:411931:411931 [3] NCCL INFO NET/Socket : GPU Direct RDMA Disabled for HCA 1 'lan3'",
        # NCCL 2.29.2's form (src/graph/paths.cc at that release), a PXN path's words before the distance
        "h:1:1 [0] NCCL INFO GPU Direct RDMA Disabled for GPU/0-98304 (rank 0) - NET/0-0 ( using PXN via GPU/0-1, distance 9 > 5)",
    ]
    run = parse_nccl_debug("\n".join(lines))
    assert run.gdr_off_nics == ["mlx5_0"]
    assert run.gdr_off_distance == ["GPU 18000 / HCA 0 (distance 5 > 4)",
                                    "GPU/0-98304 (rank 0) - NET/0-0 ( using PXN via GPU/0-1, distance 9 > 5)"]
    g5 = parse_nccl_debug((PUBLIC / "nccl-debug" / "2node-g5-efa-aws-libfabric-gdr-disabled-nccl2234.txt").read_text())
    assert g5.gdr_off_nics == ["NET/OFI Could not disable CUDA API usage for HMEM, disabling GDR"]


def test_the_net_plugin_turning_gdr_off_is_quoted(tmp_path):
    """AWS's two g5 instances: aws-ofi-nccl "Could not disable CUDA API usage for HMEM, disabling GDR": its words, and
    the plugin and libfabric to look at, not a peer-memory module."""
    g5 = parse_nccl_debug((PUBLIC / "nccl-debug" / "2node-g5-efa-aws-libfabric-gdr-disabled-nccl2234.txt").read_text())
    (finding,) = no_gdr(g5, hgx_h100_with_ndr(tmp_path))
    assert "the net plugin turned it off (\"NET/OFI Could not disable CUDA API usage for HMEM, disabling GDR\")" in finding.message
    assert "aws-ofi-nccl and libfabric" in finding.message and "peermem" not in finding.message


def test_a_nic_without_gpudirect_is_named(tmp_path):
    """NVIDIA/nccl#899's HCAs "(no module)" on an HGX node: a warning naming them and the peer-memory module; where
    the node has nvidia_peermem loaded, the log is another node's or the module is not registered."""
    run = parse_nccl_debug(NO_MODULE.read_text())
    (finding,) = no_gdr(run, hgx_h100_with_ndr(tmp_path))
    assert finding.severity == "warning"
    assert "NCCL found none on mlx5_1 (no module), mlx5_2 (no module), mlx5_3 (no module)" in finding.message
    assert "load nvidia_peermem" in finding.message
    snap = tmp_path / "hgx"
    (snap / "fs/sys/module/nvidia_peermem").mkdir(parents=True)
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.pipeline import build_report

    (finding,) = no_gdr(run, build_report(SnapshotHost(snap)))
    assert "this node has nvidia_peermem loaded: the log is another node's, or the module is not registered" in finding.message


def test_no_gdr_where_no_gpu_shares_a_switch_with_a_nic_is_nccls_design(tmp_path):
    """On a node whose NICs are NODE or SYS from every GPU, NCCL stages through the CPU by design: the published run
    with NCCL's distance lines, and the one that says no cause, are info (no warning); on the HGX node, where each GPU
    has its NIC on its PCIe switch, the same lines mean NCCL's picture is not the node's: a warning."""
    asus, hgx = far_nic_node(tmp_path), hgx_h100_with_ndr(tmp_path)
    for log in (DISTANCE, NO_CAUSE):
        run = parse_nccl_debug(log.read_text())
        (finding,) = no_gdr(run, asus)
        assert finding.severity == "info", log.name
        assert "no GPU shares a PCIe switch with an RDMA NIC (gpu0-mlx5_0 NODE, gpu1-mlx5_0 NODE, gpu2-mlx5_2 NODE, " \
               "gpu3-mlx5_2 NODE)" in finding.message
    (finding,) = no_gdr(parse_nccl_debug(DISTANCE.read_text()), hgx)
    assert finding.severity == "warning"
    assert "NCCL placed the NICs past its GDR level (NCCL: GPU 2[2] / HCA 0 (distance 3 >= 2)" in finding.message
    assert "gpu0 and mlx5_0 (PIX)" in finding.message
    (finding,) = no_gdr(parse_nccl_debug(NO_CAUSE.read_text()), hgx)
    assert finding.severity == "warning" and "load nvidia_peermem" in finding.message


def test_the_runs_gdr_level_and_a_node_without_its_layout(tmp_path):
    """NCCL_NET_GDR_LEVEL set below the node's GPU-NIC switch keeps GDR off: a warning naming it (its legacy number
    too); a node whose GPU-NIC paths are unknown leaves NCCL's own distance rule as the cause (info) and a log that
    says no cause a warning; a Grace node (C2C) is never excused by its PCIe layout."""
    hgx = hgx_h100_with_ndr(tmp_path)
    lines = NO_CAUSE.read_text()
    for said, level in (("LOC", "LOC"), ("0", "LOC"), ("PIX", None)):
        run = parse_nccl_debug(f"h:1:1 [0] NCCL INFO NCCL_NET_GDR_LEVEL set by environment to {said}\n" + lines)
        (finding,) = no_gdr(run, hgx)
        assert finding.severity == "warning"
        assert (f"NCCL_NET_GDR_LEVEL={level} keeps it off" in finding.message) == (level is not None), said
    bare = NcclRun(inter_node_transports=["NET/IB/0"], gdr=False)
    distance = NcclRun(inter_node_transports=["NET/IB/0"], gdr=False, gdr_off_distance=["GPU 18000 / HCA 0 (distance 5 > 4)"])
    unknown = dataclasses.replace(hgx, links=[])
    assert [f.severity for f in no_gdr(distance, unknown)] == ["info"]
    assert [f.severity for f in no_gdr(bare, unknown)] == ["warning"]
    asus = far_nic_node(tmp_path)
    assert [f.severity for f in no_gdr(distance, asus)] == ["info"]
    grace = dataclasses.replace(asus, gpus=[dataclasses.replace(g, c2c={"links": 10, "link_mbps": 44712}) for g in asus.gpus])
    # a GB200 tray's topo -m gives each GPU its memory's NUMA node (sgl-project/sglang#11208: 2, 10, 18 ...) and SYS
    # to every NIC, which NCCL reaches over C2C with GDR (NCCL_NET_GDR_C2C)
    coherent = dataclasses.replace(asus, gpus=[dataclasses.replace(g, gpu_numa_id=2 + 8 * g.index) for g in asus.gpus])
    assert [f.severity for f in no_gdr(distance, grace)] == [f.severity for f in no_gdr(distance, coherent)] == ["warning"]


def test_the_causes_survive_a_saved_report_and_hostile_ones_do_not():
    run = parse_nccl_debug(DISTANCE.read_text())
    from dataclasses import asdict

    again = nccl_run_from_details(json.loads(json.dumps(asdict(run))))
    assert again.gdr_off_distance == run.gdr_off_distance and again.gdr_off_nics == []
    hostile = nccl_run_from_details({"gdr_off_nics": ["x" * 5000], "gdr_off_distance": [1, 2]})
    assert hostile.gdr_off_nics == [] and hostile.gdr_off_distance == []


def test_a_hostile_gdr_line_keeps_nothing():
    """Lines of a MiB that start as NCCL's GDR lines but never end as one (benchmarks/bench_parsers.py times them)."""
    lines = ["h:1:1 [0] NCCL INFO GPU Direct RDMA Disabled for GPU " + "(" * (1 << 20),
             "h:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 '" + "a" * (1 << 20)]
    run = parse_nccl_debug("\n".join(lines))
    assert run.gdr_off_distance == [] and run.gdr_off_nics == [] and run.nccl_lines == 2


def test_the_nccl_log_command_says_the_cause(tmp_path):
    example = str(REPO / "examples" / "hgx-h100-8gpu")
    document = json.loads(nodecheck("nccl-log", str(NO_MODULE), "--from", example, "--json").stdout)
    assert document["nccl"]["gdr_off_nics"][0] == "mlx5_1 (no module)"
    (finding,) = [f for f in document["findings"] if f["kind"] == "nccl_no_gdr"]
    assert "mlx5_1 (no module)" in finding["message"]


def test_an_hca_the_channels_did_not_use_is_not_the_cause(tmp_path):
    """NCCL 2.13+ says each HCA's GPUDirect support (NVIDIA/nccl#1537's form): a storage NIC without it is not why the
    rails' channels ran without GDR when the log maps NET/IB/N to its HCAs."""
    lines = ["h1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_8:1/RoCE ; OOB ib0:10.0.0.1<0>",
             "h1:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'",
             "h1:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_8'",
             "h1:1:1 [0] NCCL INFO Channel 00/0 : 0[18000] -> 8[18000] [send] via NET/IB/0",
             "h2:1:1 [0] NCCL INFO Channel 00/0 : 0[18000] -> 8[18000] [receive] via NET/IB/0"]
    hgx = hgx_h100_with_ndr(tmp_path)
    run = parse_nccl_debug("\n".join(lines))
    assert run.gdr_off_nics == ["mlx5_8"]
    (finding,) = no_gdr(run, hgx)
    assert "mlx5_8" not in finding.message and "load nvidia_peermem" in finding.message
    over_it = parse_nccl_debug("\n".join(lines).replace("via NET/IB/0", "via NET/IB/1"))
    (finding,) = no_gdr(over_it, hgx)
    assert "NCCL found none on mlx5_8" in finding.message


def dgx_spark(tmp_path: Path):
    """A DGX Spark as its NVML and sysfs show it: one "NVIDIA GB10" (Blackwell) and its ConnectX-7's two RoCE
    functions at 200G (the names NCCL's lines give them: rocep1s0f1, roceP2p1s0f1)."""
    devices = [(name, "200 Gb/sec (4X HDR)", "Ethernet") for name in ("rocep1s0f1", "roceP2p1s0f1")]
    return gpu_node_with_rdma(tmp_path / "spark", None, hgx_nvml(0, name="NVIDIA GB10", arch=10)[:1], devices)


def test_a_dgx_spark_without_gdrdma_is_its_design_not_a_module_to_load(tmp_path):
    """NVIDIA's DGX Spark porting guide: GB10's unified memory gives PCIe devices no GPUDirect RDMA, nvidia-peermem and
    dma-buf do not work. vllm-dgx-spark#1's two Sparks (HPC-X's IBext_v10 says "GPU Direct RDMA (DMABUF) enabled", the
    channels run without /GDRDMA): info naming the guide, never "load nvidia_peermem"; the peer-memory check stays
    silent there. The same log held against the HGX H100 example still warns."""
    from nodecheck.checks.platform import platform_findings
    from nodecheck.config import Config
    from nodecheck.report.model import Platform

    run = parse_nccl_debug((FIXTURES / "vllmdgxspark1-gb10-ray-ibext-dmabuf-no-gdrdma.txt").read_text())
    assert (run.gdr, run.nodes, run.inter_node_transports) == (False, ["spark-3995"], ["NET/IBext_v10/0", "NET/IBext_v10/1"])
    spark = dgx_spark(tmp_path)
    findings = nccl_findings(run, spark)
    assert [(f.kind, f.severity) for f in findings] == [("nccl_no_gdr", "info")]
    assert "DGX Spark porting guide" in findings[0].message and "load nvidia_peermem" not in findings[0].message
    bare = dataclasses.replace(spark, platform=Platform(None, True, open_kernel_modules=False, dma_buf=False))
    assert [f.kind for f in platform_findings(bare, Config())] == []
    hgx = dataclasses.replace(bare, gpus=hgx_h100_with_ndr(tmp_path / "hgx").gpus)
    assert [f.kind for f in platform_findings(hgx, Config())] == ["gpudirect_rdma_unavailable"]
    assert [f.severity for f in no_gdr(run, hgx_h100_with_ndr(tmp_path / "hgx2"))] == ["warning"]
