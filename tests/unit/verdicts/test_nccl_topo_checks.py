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
from nodecheck.verdicts.nccl_topo import topo_findings, with_bare_devices_named

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


def test_a_gpu_link_read_below_its_maximum_is_a_vms_bridge_or_nccl_2_30_7s_current_reading(node):
    """Before 2.30.7 NCCL wrote the lower of the GPU's and its port's max_link_speed (sysfs); from 2.30.7 NVML's current
    generation at its init (src/graph/xml.cc, v2.30.7-1). Where the node's hops show a port that can do no more, the
    low figure is NCCL's sysfs reading of a VM's emulated bridge (a warning); where GPU and port can do Gen5, it is the
    link's state at NCCL's init, which nodecheck's PCIe checks judge themselves (info, never a warning on a healthy
    node whose GPU was still at its idle link speed)."""
    import dataclasses

    from nodecheck.core.pci import Hop

    slow = dump().replace('<pci busid="0000:18:00.0" class="0x030200" link_speed="32.0 GT/s PCIe"',
                          '<pci busid="0000:18:00.0" class="0x030200" link_speed="2.5 GT/s PCIe"')

    def judged(port_max: str):
        hops = {"0000:18:00.0": [Hop("0000:18:00.0", 16, 16, "32.0 GT/s PCIe", "32.0 GT/s PCIe"),
                                 Hop("0000:17:00.0", 16, 16, "32.0 GT/s PCIe", port_max)]}
        found = topo_findings(parse_nccl_topo_xml(slow), dataclasses.replace(node, pcie_paths=hops))
        return [(f.subject, f.severity, f.measured) for f in found if "GT/s" in f.measured]  # not the made-up hops' levels

    assert judged("32.0 GT/s PCIe") == [("gpu0", "info", "2.5 GT/s (Gen1)")]
    assert judged("2.5 GT/s PCIe") == [("gpu0", "warning", "2.5 GT/s (Gen1)")]
    assert [(f.severity, f.measured) for f in topo_findings(parse_nccl_topo_xml(slow), node)] == [("warning", "2.5 GT/s (Gen1)")]


def test_the_command_reads_a_dump_or_a_log_and_exits_by_what_it_found(tmp_path):
    (tmp_path / "ok.xml").write_text(dump())
    (tmp_path / "lost.xml").write_text(dump(nvlinks={1: 0}))
    ok = cli("nccl-topo", str(tmp_path / "ok.xml"), "--from", str(EXAMPLE))
    assert ok.returncode == 0 and "NCCL's topology XML (version 1): 2 CPU(s), 8 GPU(s), 8 NIC(s)" in ok.stdout and "agrees" in ok.stdout
    lost = cli("nccl-topo", str(tmp_path / "lost.xml"), "--from", str(EXAMPLE), "--json")
    document = json.loads(lost.stdout)
    assert lost.returncode == 1 and (document["schema"], document["schema_version"], document["form"]) == ("nodecheck.nccl_topo", 1, "xml")
    assert [f["kind"] for f in document["findings"]] == ["nccl_topo_nvlink_missing"] and len(document["topology"]["gpus"]) == 8
    # nccl-tests#182's GRAPH log: testgpu1's GPU 0000:03:00.0, none of the example's: read and shown, not compared
    log = cli("nccl-topo", str(REPO / "tests/fixtures/nccl-topo/nccl-tests182-graph-log.txt"), "--from", str(EXAMPLE))
    assert log.returncode == 2 and log.stdout.startswith("NCCL's topology log (NCCL_DEBUG_SUBSYS=GRAPH): 1 CPU(s), 1 GPU(s), 1 NIC(s)")
    assert "Against snapshot" in log.stdout and "not compared: no device in common" in log.stdout and "agrees" not in log.stdout
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


# The DGX-1 V100 of NVIDIA/nccl issue 671 as NCCL dumped it: gpu0 (0000:06:00.0) under the PLX switch 0000:03:00.0,
# its six NVLinks to 07 x1, 0a x1, 0b x2, 85 x2 (the hybrid cube mesh); NCCL wrote each target from NVML's remote PCI
# bus id of that link, so NVML's far ends for the same node are those targets, link by link.
DGX1_DUMP = REPO / "tests/fixtures/nccl-topo/nccl671-dgx1-v100-dump-cut.xml"
DGX1_BUSES = ["06", "07", "0a", "0b", "85", "86", "89", "8a"]
DGX1_GPU0_ENDS = ["07", "0a", "0b", "0b", "85", "85"]


def dgx1_report(tmp_path, gpu0_ends=DGX1_GPU0_ENDS, remote_type=0):
    from helpers import h100_nvml_records, make_snapshot

    base = dict(h100_nvml_records()[0], name="Tesla V100-SXM2-32GB", arch=5, fabric=None)
    gpus = []
    for index, bus in enumerate(DGX1_BUSES):
        ends = gpu0_ends if index == 0 else []
        gpus.append(dict(base, uuid=f"GPU-dgx1-{index}", pci=f"00000000:{bus.upper()}:00.0", nvlink_count=6,
                         nvlink=[[link, 1, 2] for link in range(6)],
                         nvlink_remote={link: (f"00000000:{end.upper()}:00.0", remote_type) for link, end in enumerate(ends)}))
    return build_report(SnapshotHost(make_snapshot(tmp_path / "dgx1", nvml_gpus=gpus)))


def test_nvml_records_each_links_far_end_as_nccl_asks_it(tmp_path):
    report = dgx1_report(tmp_path)
    assert [(l["remote"], l["remote_type"]) for l in report.gpus[0].nvlinks[:3]] == [
        ("00000000:07:00.0".lower(), "gpu"), ("00000000:0a:00.0", "gpu"), ("00000000:0b:00.0", "gpu")]
    assert all("remote" not in l for l in report.gpus[1].nvlinks)  # NVML did not say (Not Supported): nothing kept


def test_nccls_nvlink_targets_agree_with_nvmls_far_ends_on_the_published_dgx1(tmp_path):
    topo = parse_nccl_topo_xml(DGX1_DUMP.read_text())
    assert [f for f in topo_findings(topo, dgx1_report(tmp_path)) if "NVLinks to" in f.measured] == []


def test_a_gpu_the_paste_cuts_inside_is_not_judged_by_the_nvlinks_it_shows(tmp_path):
    """nccl#671's paste ends inside gpu1's third NVLink: 4 of its 6 are shown. That is the paste, not NCCL: gpu1's
    NVLinks are unknown (no nccl_topo_nvlink_missing error), while gpu0, whole before the cut, is still judged. The same
    gpu1 closed after those two lines is NCCL's own picture, and its missing links are named."""
    report = dgx1_report(tmp_path)
    text = DGX1_DUMP.read_text()
    cut = parse_nccl_topo_xml(text)
    assert [g.cut for g in cut.gpus] == [False, True]
    assert [f for f in topo_findings(cut, report) if f.kind == "nccl_topo_nvlink_missing"] == []
    assert "gpu1" not in {f.subject for f in topo_findings(cut, report) if "NVLink" in f.measured}
    closed = text[:text.rindex("<nvlink")] + "</gpu></pci></pci></cpu></system>"
    (found,) = [f for f in topo_findings(parse_nccl_topo_xml(closed), report) if f.kind == "nccl_topo_nvlink_missing"]
    assert (found.subject, found.measured, found.expected) == ("gpu1", "4 NVLinks", "6 active (NVML)")
    shown = cli("nccl-topo", str(DGX1_DUMP), "--from", str(EXAMPLE)).stdout
    assert "GPU 0000:07:00.0 rank 1" in shown and "(the paste ends inside it: what follows is unknown)" in shown


def test_a_graph_log_without_nvlinks_on_a_whole_gpu_is_named_and_a_cut_one_is_not(node, tmp_path):
    """NCCL's GRAPH log prints each GPU with all its NVLinks below it, then the block's closing line: a GPU printed
    whole without one, on a node whose NVML counts 18 active, is NCCL routing it over PCIe (the GB300 case, from a
    log). The same lines cut at the GPU (as nccl-tests#100's paste is) say nothing of its NVLinks."""
    from nodecheck.probes.nccl_topo import parse_nccl_topo_log

    lines = ["n1:1:2 [0] NCCL INFO === System : maxBw 24.0 totalBw 24.0 ===", "n1:1:2 [0] NCCL INFO CPU/0-0 (1/1/2)",
             "n1:1:2 [0] NCCL INFO + PCI[24.0] - PCI/0-17000", "n1:1:2 [0] NCCL INFO               + PCI[24.0] - GPU/0-18000 (0)"]
    closing = "n1:1:2 [0] NCCL INFO =========================================="
    (found,) = topo_findings(parse_nccl_topo_log("\n".join(lines + [closing])), node)
    assert (found.kind, found.severity, found.subject, found.measured) == ("nccl_topo_nvlink_missing", "error", "gpu0", "no NVLink")
    assert "the log's NCCL_DEBUG_SUBSYS=GRAPH lines before the block say why" in found.message  # not "rerun with" it
    assert topo_findings(parse_nccl_topo_log("\n".join(lines)), node) == []
    with_links = lines + ["n1:1:2 [0] NCCL INFO                             + NVL[720.0] - NVS/0", closing]
    assert topo_findings(parse_nccl_topo_log("\n".join(with_links)), node) == []
    (tmp_path / "graph.txt").write_text("\n".join(lines + [closing]) + "\n")
    assert cli("nccl-topo", str(tmp_path / "graph.txt"), "--from", str(EXAMPLE)).returncode == 1


def test_an_nvlink_that_ends_elsewhere_than_nccl_routes_it_is_named(tmp_path):
    """One of gpu0's two links to gpu3 (0b) ends at gpu7 (8a) by NVML: NCCL's picture is of another wiring."""
    ends = DGX1_GPU0_ENDS[:3] + ["8a"] + DGX1_GPU0_ENDS[4:]
    topo = parse_nccl_topo_xml(DGX1_DUMP.read_text())
    (found,) = [f for f in topo_findings(topo, dgx1_report(tmp_path, ends)) if "NVLinks to" in f.measured]
    assert (found.kind, found.severity, found.subject) == ("nccl_topo_mismatch", "warning", "gpu0")
    assert found.measured == "NVLinks to gpu1 x1, gpu2 x1, gpu3 x2, gpu4 x2"
    assert found.expected == "gpu1 x1, gpu2 x1, gpu3 x1, gpu4 x2, gpu7 x1 (NVML)"


def test_nvswitch_ends_are_counted_not_matched_by_bus_id(tmp_path):
    """An HGX GPU's links end at NVSwitches whose bus ids differ between bare metal and a VM: no target finding."""
    report = dgx1_report(tmp_path, ["c4"] * 6, remote_type=2)
    text = DGX1_DUMP.read_text().split("<nvlink")[0] + '<nvlink target="fffffff:ffff:ff" count="6" tclass="0x068000"/></gpu></pci></pci></cpu></system>'
    assert [f for f in topo_findings(parse_nccl_topo_xml(text), report) if "NVLinks to" in f.measured] == []


def hop(bdf):
    from nodecheck.core.pci import Hop

    return Hop(bdf, 16, 16, "8.0 GT/s PCIe", "8.0 GT/s PCIe")


def test_nccls_pci_levels_are_sysfs_hops_after_its_collapse(tmp_path):
    """The DGX-1's gpu0 sits below the PLX switch's downstream port 04:10.0, its upstream port 03:00.0 and the root
    port 00:03.0: NCCL skips the downstream port and stops at the root port, so it writes 03:00.0 alone above it."""
    report = dgx1_report(tmp_path)
    report.pcie_paths = {"0000:06:00.0": [hop("0000:06:00.0"), hop("0000:04:10.0"), hop("0000:03:00.0"), hop("0000:00:03.0")]}
    topo = parse_nccl_topo_xml(DGX1_DUMP.read_text())
    assert [f for f in topo_findings(topo, report) if f.subject == "gpu0" and "sysfs" in f.expected] == []
    # the same GPU behind a second switch level: NCCL's tree lacks a switch the node has
    report.pcie_paths["0000:06:00.0"][2:] = [hop("0000:03:00.0"), hop("0000:02:08.0"), hop("0000:01:00.0"), hop("0000:00:03.0")]
    (found,) = [f for f in topo_findings(topo, report) if f.subject == "gpu0" and "sysfs" in f.expected]
    assert (found.kind, found.measured, found.expected) == ("nccl_topo_mismatch", "0000:03:00.0", "0000:01:00.0 > 0000:03:00.0 (sysfs)")
    assert found.message.startswith("NCCL places gpu0 under 0000:03:00.0; sysfs")


def test_a_flattened_vm_under_a_providers_made_up_switches_is_as_meant(tmp_path):
    """Azure's ND H100 v5 file puts each GPU under a bridge ffff:ff:0N.0 that no node has; the VM's sysfs has the GPU
    straight on the root bus: NCCL's tree is the file's on purpose, no finding."""
    text = (REPO / "tests/fixtures/nccl-topo/azure-ndv5-topo.xml").read_text()
    topo = parse_nccl_topo_xml(text)
    gpu_bus = topo.gpus[0].busid
    report = dgx1_report(tmp_path)
    report.pcie_paths = {gpu_bus: [hop(gpu_bus)]}
    import dataclasses

    report.gpus = [dataclasses.replace(report.gpus[0], pci_bus_id=gpu_bus)] + report.gpus[1:]
    topo.gpus[0].dev = 0  # as a dump NCCL wrote while it ran with the file
    assert [f for f in topo_findings(topo, report) if "sysfs" in f.expected] == []


def test_a_files_devices_without_a_class_are_what_the_node_says_they_are(tmp_path):
    """The g5.12xlarge file (aws-ofi-nccl#466): its four bare devices are the node's four A10Gs where the node has
    GPUs at those addresses (NCCL reads their class there), judged as GPUs: NUMA 0 as the node's, no finding. Held
    against a node with none of them, they stay unclassed and the command says so: nothing compared, exit 2 (before,
    "agrees" and exit 0)."""
    import dataclasses

    fixture = REPO / "tests/fixtures/nccl-topo/aws-ofi-nccl466-g5-topo.xml"
    topo = parse_nccl_topo_xml(fixture.read_text())
    report = dgx1_report(tmp_path)
    g5 = dataclasses.replace(report, gpus=[dataclasses.replace(report.gpus[i], pci_bus_id=f"00000000:00:{dev}.0", numa_node=0)
                                           for i, dev in enumerate(("1b", "1c", "1d", "1e"))])
    named = with_bare_devices_named(topo, g5)
    assert [g.busid for g in named.gpus] == [f"0000:00:{dev}.0" for dev in ("1b", "1c", "1d", "1e")] and named.unclassed == []
    assert all(g.dev is None for g in named.gpus) and topo_findings(topo, g5) == []
    wrong = dataclasses.replace(g5, gpus=[dataclasses.replace(g, numa_node=1) for g in g5.gpus])
    assert {(f.kind, f.subject) for f in topo_findings(topo, wrong)} == {("nccl_topo_mismatch", f"gpu{i}") for i in range(4)}
    elsewhere = cli("nccl-topo", str(fixture), "--from", str(EXAMPLE))
    assert elsewhere.returncode == 2 and "agrees" not in elsewhere.stdout
    assert "0 GPU(s), 0 NIC(s)" in elsewhere.stdout and "4 device(s) without a class, none of them a GPU or NIC" in elsewhere.stdout
    assert f"none of its 4 device(s) is a GPU or NIC of snapshot {EXAMPLE} (its 0000:00:1b.0" in elsewhere.stderr
    document = json.loads(cli("nccl-topo", str(fixture), "--from", str(EXAMPLE), "--json").stdout)
    assert document["topology"]["unclassed"][0]["busid"] == "0000:00:1b.0" and document["findings"] == []
    assert document["not_compared"].startswith("none of its 4 device(s)")


def test_a_far_end_from_a_hostile_dump_or_report_is_no_far_end():
    from nodecheck.probes.nvml_nvlink_remote import parse_remotes
    from nodecheck.report.model import Gpu

    raw = [{"link": 0, "remote": {"bus_id": "0000:07:00.0<script>", "type": 0}}, {"link": 1, "remote": {"bus_id": "f" * 1_000_000}},
           {"link": "2", "remote": {"bus_id": "0000:07:00.0"}}, {"link": 3, "remote": {"error": "Not Supported"}},
           {"link": 4, "remote": {"bus_id": "00000000:0B:00.0", "type": 2}}, {"link": 5, "remote": {"bus_id": "0000:0a:00.0", "type": 7}}]
    assert parse_remotes(raw) == {4: {"bus_id": "00000000:0b:00.0", "type": "switch"}, 5: {"bus_id": "0000:0a:00.0", "type": None}}
    gpu = Gpu(0, nvlinks=[{"link": 0, "active": True, "remote": "x" * 100_000, "remote_type": "gpu"},
                          {"link": 1, "active": True, "remote": "0000:07:00.0", "remote_type": "evil"}])
    assert [sorted(link) for link in gpu.nvlinks] == [["active", "link"], ["active", "link", "remote"]]


def test_a_published_h200_dump_agrees_with_nvmls_nvswitch_ends_as_published(tmp_path):
    """NVML's far ends of an HGX H100's GPU 0 as `nvidia-smi nvlink -R` printed them (nccl#1182: NVSwitches 05-08,
    5/5/4/4 links) beside NCCL's dump of an H200 board's gpu0 (nccl-tests#256: the same four switches, the same
    counts): links to NVSwitches agree by their sum, and no peer GPU is named."""
    import re

    from helpers import h100_nvml_records, make_snapshot

    said = (REPO / "tests/fixtures/nccl-topo/nccl1182-h100-nvlink-R-gpu0.txt").read_text()
    ends = {int(link): bus for link, bus in re.findall(r"Link (\d+): Remote Device (\S+): Link", said)}
    assert len(ends) == 18
    gpu = dict(h100_nvml_records()[0], name="NVIDIA H200", pci="00000000:18:00.0", nvlink_count=18,
               nvlink=[[link, 1, 6] for link in range(18)], nvlink_remote={link: (bus, 2) for link, bus in ends.items()})
    report = build_report(SnapshotHost(make_snapshot(tmp_path / "h200", nvml_gpus=[gpu])))
    text = (REPO / "tests/fixtures/nccl-topo/nccl-tests256-h200-dump-cut.xml").read_text()
    topo = parse_nccl_topo_xml(text)
    assert topo.ends_early and [g.busid for g in topo.gpus] == ["0000:18:00.0"]
    assert [f for f in topo_findings(topo, report) if f.subject == "gpu0"] == []
    # three of the links to switch 08 gone from NCCL's picture: named by the sum
    lost = topo_findings(parse_nccl_topo_xml(text.replace('target="0000:08:00.0" count="4"', 'target="0000:08:00.0" count="1"')), report)
    assert [(f.kind, f.measured) for f in lost if f.subject == "gpu0"] == [("nccl_topo_nvlink_missing", "15 NVLinks")]
