"""NCCL's picture against the node's (src/nodecheck/verdicts/nccl_topo.py, `nodecheck nccl-topo`), on the shipped HGX
H100 example (the published topology and the H100 capture's NVML values: 18 active NVLinks a GPU, Gen5 x16, GPUs 0-3
on NUMA node 0, mlx5_N at PIX of gpuN and NODE or SYS of the others). The dump written here is NCCL's format for that
node, as a real one is laid out (one switch per GPU and its NIC, 18 NVLinks to the NVSwitches), each fault planted in
it where the published cases have it: the GB300 dump that lost one GPU's NVLinks, a VM's bridge read narrower, a GPU
under the wrong socket, a NIC placed under another GPU's switch."""

import json

import pytest
from helpers import REPO, cli

from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.probes.nccl_topo import parse_nccl_topo_xml
from nodecheck.verdicts.nccl_topo import topo_findings

EXAMPLE = REPO / "examples" / "hgx-h100-8gpu"
BUSES = ["18", "28", "38", "48", "58", "68", "78", "88"]


def dump(nvlinks=None, width=None, numa=None, moved_nic=None, nic_speed=400000) -> str:
    """NCCL's XML for the example node; nvlinks {gpu: count or 0}, width {gpu: x}, numa {gpu: numaid},
    moved_nic: (gpu, nic) a NIC placed under that GPU's switch instead of its own GPU's."""
    nvlinks, width, numa = nvlinks or {}, width or {}, numa or {}
    cpus = {0: [], 1: []}
    for index, bus in enumerate(BUSES):
        count = nvlinks.get(index, 18)
        links = f'<nvlink target="fffffff:ff:ff.0" count="{count}" tclass="0x068000"/>' if count else ""
        nics = [n for n in [index] if not moved_nic or n != moved_nic[1]] + ([moved_nic[1]] if moved_nic and moved_nic[0] == index else [])
        nic_xml = "".join(f'<pci busid="0000:{int(bus, 16) + 1 + n:02x}:00.0" class="0x020700" link_speed="32.0 GT/s PCIe" link_width="16">'
                          f'<nic><net name="mlx5_{n}" dev="{n}" speed="{nic_speed}" port="1" guid="0x{n}" gdr="1"/></nic></pci>'
                          for n in nics)
        cpus[numa.get(index, 0 if index < 4 else 1)].append(
            f'<pci busid="0000:{int(bus, 16) - 1:02x}:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">'
            f'<pci busid="0000:{bus}:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="{width.get(index, 16)}">'
            f'<gpu dev="{index}" sm="90" rank="{index}" gdr="1">{links}</gpu></pci>{nic_xml}</pci>')
    body = "".join(f'<cpu numaid="{n}" affinity="ff" arch="x86_64" vendor="GenuineIntel">{"".join(parts)}</cpu>' for n, parts in cpus.items())
    return f'<system version="1">{body}</system>'


@pytest.fixture(scope="module")
def node():
    return build_report(SnapshotHost(EXAMPLE))


def test_nccls_picture_of_a_healthy_node_agrees(node):
    assert topo_findings(parse_nccl_topo_xml(dump()), node) == []


def test_each_planted_fault_is_named_with_nccls_value_beside_the_nodes(node):
    text = dump(nvlinks={1: 0, 2: 12}, width={3: 8}, numa={4: 0}, moved_nic=(0, 1))
    findings = {(f.kind, f.subject): f for f in topo_findings(parse_nccl_topo_xml(text), node)}
    assert set(findings) == {("nccl_topo_nvlink_missing", "gpu1"), ("nccl_topo_nvlink_missing", "gpu2"),
                             ("nccl_topo_mismatch", "gpu3"), ("nccl_topo_mismatch", "gpu4"), ("nccl_topo_mismatch", "gpu0/mlx5_1"),
                             ("nccl_topo_mismatch", "gpu1/mlx5_1")}
    lost = findings[("nccl_topo_nvlink_missing", "gpu1")]
    assert (lost.severity, lost.measured, lost.expected) == ("error", "no NVLink", "18 active (NVML)")
    assert "NCCL sees no NVLink on gpu1; NVML: 18 active: this GPU's traffic goes over PCIe" in lost.message
    assert findings[("nccl_topo_nvlink_missing", "gpu2")].measured == "12 NVLinks"
    assert (findings[("nccl_topo_mismatch", "gpu3")].measured, findings[("nccl_topo_mismatch", "gpu3")].expected) == ("x8", "x16")
    assert findings[("nccl_topo_mismatch", "gpu4")].message.startswith("NCCL places gpu4 under NUMA node 0; sysfs: NUMA node 1")
    placed, lost_nic = findings[("nccl_topo_mismatch", "gpu0/mlx5_1")], findings[("nccl_topo_mismatch", "gpu1/mlx5_1")]
    assert (placed.measured, placed.expected, lost_nic.measured, lost_nic.expected) == ("near", "NODE", "far", "PIX")
    assert "NCCL places mlx5_1 under the same PCIe switch as gpu0; `nvidia-smi topo -m`: NODE" in placed.message


def test_what_nccl_did_not_write_or_did_not_hold_is_no_finding(node):
    """A width of 0, the GPUs of a job's ranks only, a topology file's bare GPUs: nothing to disagree with."""
    text = dump(width={0: 0})
    shorter = text.replace('<gpu dev="7" sm="90" rank="7" gdr="1"><nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/></gpu>', "")
    assert topo_findings(parse_nccl_topo_xml(shorter), node) == []
    bare = '<system version="1"><cpu numaid="0"><pci busid="0000:17:00.0" class="0x060400"><pci busid="0000:18:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"/></pci></cpu></system>'
    assert topo_findings(parse_nccl_topo_xml(bare), node) == []


def test_a_nics_speed_nccl_reads_otherwise_than_its_port(node):
    import dataclasses

    nics = [dataclasses.replace(n, speed_mbps=400000) for n in node.nics]
    findings = topo_findings(parse_nccl_topo_xml(dump(nic_speed=200000)), dataclasses.replace(node, nics=nics))
    assert {(f.kind, f.subject, f.measured, f.expected) for f in findings} == {
        ("nccl_topo_mismatch", f"mlx5_{n}", "200000 Mb/s", "400000 Mb/s") for n in range(8)}


def test_the_command_reads_a_dump_or_a_log_and_exits_by_what_it_found(tmp_path):
    (tmp_path / "ok.xml").write_text(dump())
    (tmp_path / "lost.xml").write_text(dump(nvlinks={1: 0}))
    ok = cli("nccl-topo", str(tmp_path / "ok.xml"), "--from", str(EXAMPLE))
    assert ok.returncode == 0 and "NCCL's topology XML (version 1): 2 CPU(s), 8 GPU(s), 8 NIC(s)" in ok.stdout and "agrees" in ok.stdout
    lost = cli("nccl-topo", str(tmp_path / "lost.xml"), "--from", str(EXAMPLE), "--json")
    document = json.loads(lost.stdout)
    assert lost.returncode == 1 and (document["schema"], document["schema_version"], document["form"]) == ("nodecheck.nccl_topo", 1, "xml")
    assert [f["kind"] for f in document["findings"]] == ["nccl_topo_nvlink_missing"] and len(document["topology"]["gpus"]) == 8
    log = cli("nccl-topo", str(REPO / "tests/fixtures/nccl-topo/nccl-tests182-graph-log.txt"), "--from", str(EXAMPLE))
    assert log.returncode == 0 and log.stdout.startswith("NCCL's topology log (NCCL_DEBUG_SUBSYS=GRAPH): 1 CPU(s), 1 GPU(s), 1 NIC(s)")
    (tmp_path / "hwloc.xml").write_text('<topology version="2.0"/>')
    refused = cli("nccl-topo", str(tmp_path / "hwloc.xml"), "--from", str(EXAMPLE))
    assert refused.returncode == 2 and "not NCCL's topology XML: root element is <topology>" in refused.stderr


def test_bench_asks_nccl_for_its_picture_and_judges_the_one_it_kept(node, tmp_path):
    """bench's NCCL runs dump NCCL's topology next to their debug files; the measurement keeps it and the verdicts
    hold it against the node, as `nccl-topo` does. A kept topology that is not one (a Report is untrusted) is none."""
    import dataclasses

    from nodecheck.bench.nccl_debug import TOPOLOGY_FILE, attach, debug_env, read_topology
    from nodecheck.config import Config
    from nodecheck.report.model import Measurement
    from nodecheck.verdicts.bandwidth import with_measurements

    assert debug_env({}, str(tmp_path))["NCCL_TOPO_DUMP_FILE"] == f"{tmp_path}/{TOPOLOGY_FILE}"
    assert "NCCL_TOPO_DUMP_FILE" not in debug_env({})  # nccl-tests' stdout run: its own folder is set where it runs
    assert read_topology(tmp_path) is None  # NCCL wrote none (a rank other than 0, a run that did not start)
    (tmp_path / TOPOLOGY_FILE).write_text(dump(nvlinks={1: 0}))
    kept = read_topology(tmp_path)
    allreduce = attach(Measurement.measured("allreduce:node-8-gpus", "allreduce", 360e9, 450e9, 1 << 30, "nccl", "busbw",
                                            {"path_kind": "nvlink"}), None, kept)
    judged = with_measurements(node, [allreduce], 1.8e9, Config())
    (lost,) = [f for f in judged.findings if f.kind == "nccl_topo_nvlink_missing"]
    assert lost.subject == "gpu1" and judged.measurements[0].details["nccl_topology"]["gpus"][1]["nvlinks"] == []
    for garbage in ({"gpus": "x"}, {"gpus": [{"cpu": -5, "busid": "0000:18:00.0", "chain": [{"link_width": "wide"}]}]}, [], "x"):
        broken = dataclasses.replace(allreduce, details={"path_kind": "nvlink", "nccl_topology": garbage})
        assert not [f for f in with_measurements(node, [broken], 1.8e9, Config()).findings if f.kind.startswith("nccl_topo")]
    (tmp_path / TOPOLOGY_FILE).write_text("<topology/>")
    assert read_topology(tmp_path) is None


def test_c2c_and_gpudirect_as_nccl_reads_them_against_nvml_and_the_node(node):
    """A Grace GPU whose C2C links NCCL counts otherwise than NVML (a GB10 dump: 8 links), and NICs NCCL marks
    gdr=0 while the node loads nvidia_peermem."""
    import dataclasses

    from nodecheck.report.model import Platform

    gpus = [dataclasses.replace(g, c2c={"links": 10, "link_mbps": 44712}) if g.index == 0 else g for g in node.gpus]
    text = dump().replace('<gpu dev="0" sm="90" rank="0" gdr="1">', '<gpu dev="0" sm="90" rank="0" gdr="1"><c2c bw="43125" count="8"/>')
    text = text.replace('name="mlx5_2" dev="2" speed="400000" port="1" guid="0x2" gdr="1"', 'name="mlx5_2" dev="2" speed="400000" port="1" guid="0x2" gdr="0"')
    platform = Platform(peer_memory="nvidia_peermem", modules_known=True)
    judged = topo_findings(parse_nccl_topo_xml(text), dataclasses.replace(node, gpus=gpus, platform=platform))
    assert {(f.subject, f.measured, f.expected) for f in judged} == {
        ("gpu0", "8 C2C links", "10 active (NVML)"), ("mlx5_2", "gdr=0", "GPUDirect RDMA (nvidia_peermem)")}
    assert topo_findings(parse_nccl_topo_xml(text), dataclasses.replace(node, platform=None)) == []  # nothing to hold it against
