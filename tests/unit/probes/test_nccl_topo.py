"""NCCL's topology XML (src/nodecheck/probes/nccl_topo.py) on what real nodes and providers published
(tests/fixtures/nccl-topo, each with its source in SOURCES.md), each against an answer key derived from the file
by hand, and on what a hostile or broken one holds."""

import pytest
from helpers import REPO

from nodecheck.core.errors import ParseError
from nodecheck.probes.nccl_topo import MAX_DEPTH, MAX_ELEMENTS, parse_nccl_topo_xml

FIXTURES = REPO / "tests" / "fixtures" / "nccl-topo"


def read(name: str):
    return parse_nccl_topo_xml((FIXTURES / name).read_text())


def paired(topo) -> dict[str, list[str]]:
    """GPU busid -> the NIC busids under the same first bridge below its CPU (the answer keys' pairing)."""
    return {g.busid: sorted(n.busid for n in topo.nics if n.cpu == g.cpu and n.chain[0].busid == g.chain[0].busid)
            for g in topo.gpus}


def test_azures_nd_h100_v5_file_pairs_each_gpu_with_its_nic_under_a_made_up_bridge():
    """Azure's ndv5-topo.xml: two NUMA nodes of four GPU+NIC pairs, each pair under a bridge ffff:ff:0N.0 of its own;
    GPUs and NICs are bare <pci> of class 0x030200 and 0x020700, at 32.0 GT/s x16."""
    topo = read("azure-ndv5-topo.xml")
    assert (topo.version, topo.ends_early, [c.numaid for c in topo.cpus]) == (1, None, [0, 1])
    assert [g.busid for g in topo.gpus] == ["0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0008:00:00.0",
                                            "0009:00:00.0", "000a:00:00.0", "000b:00:00.0", "000c:00:00.0"]
    assert paired(topo)["0008:00:00.0"] == ["0104:00:00.0"] and paired(topo)["000c:00:00.0"] == ["0108:00:00.0"]
    assert all(len(ns) == 1 for ns in paired(topo).values())
    assert {(h.link_gts, h.link_width) for g in topo.gpus for h in g.chain} == {(32.0, 16)}
    assert [g.cpu for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1] and all(g.dev is None and not g.nvlinks for g in topo.gpus)
    assert not any(g.cut for g in topo.gpus)


def test_azures_nd_a100_v4_file_puts_two_gpus_and_two_nics_under_each_bridge():
    """ndv4-topo.xml: four NUMA nodes, each a bridge over 2 GPUs and 2 HDR HCAs, speeds written "16 GT/s"."""
    topo = read("azure-ndv4-topo.xml")
    assert [c.numaid for c in topo.cpus] == [0, 1, 2, 3] and (len(topo.gpus), len(topo.nics)) == (8, 8)
    assert paired(topo)["0003:00:00.0"] == ["0103:00:00.0", "0104:00:00.0"]
    assert {h.link_gts for g in topo.gpus for h in g.chain} == {16.0}
    assert [c.vendor for c in topo.cpus] == ["AuthenticAMD"] * 4


def test_a_file_of_bare_devices_without_a_class_keeps_them_unclassed():
    """aws-ofi-nccl#466's g5.12xlarge file: four <pci busid> and nothing else. NCCL reads each one's class from sysfs,
    so the file alone does not say they are GPUs: kept as unclassed, in order, under CPU 0, never dropped."""
    topo = read("aws-ofi-nccl466-g5-topo.xml")
    assert (topo.version, topo.ends_early, topo.gpus, topo.nics) == (1, None, [], [])
    assert [(b.busid, b.cpu, [h.busid for h in b.chain]) for b in topo.unclassed] == [
        (f"0000:00:{dev}.0", 0, [f"0000:00:{dev}.0"]) for dev in ("1b", "1c", "1d", "1e")]
    assert all(b.chain[0].link_gts is None and b.chain[0].link_width is None for b in topo.unclassed)


def test_a_gb10_dump_has_no_numa_id_no_gdr_and_its_gpu_on_c2c():
    topo = read("gb10-dgx-spark-dump.xml")
    ((cpu,), (gpu,)) = topo.cpus, topo.gpus
    assert (cpu.numaid, cpu.arch) == (None, "arm64")
    assert (gpu.busid, gpu.dev, gpu.sm, gpu.gdr, gpu.c2c) == ("000f:01:00.0", 0, 121, False, {"bw": 43125, "count": 8})
    assert (gpu.chain[-1].link_gts, gpu.chain[-1].link_width) == (2.5, 16)  # emulated: what NCCL was told
    assert [(n.busid, n.nets[0]["name"], n.nets[0]["speed"], n.nets[0]["gdr"], n.chain[-1].link_width) for n in topo.nics] == [
        ("0000:01:00.0", "rocep1s0f0", 200000, False, 4), ("0002:01:00.0", "roceP2p1s0f0", 200000, False, 4)]


def test_a_paste_cut_mid_tree_is_read_as_far_as_it_goes_and_says_where_it_ends():
    """NVIDIA/nccl#671's DGX-1 dump, cut inside gpu1's third NVLink: gpu0 has its four links (1, 1, 2, 2 to the
    GPUs at 07, 0a, 0b, 85), gpu1 the two before the cut; both behind the PLX switch at 03:00.0."""
    topo = read("nccl671-dgx1-v100-dump-cut.xml")
    assert topo.ends_early.startswith("the XML ends or breaks at line 16, column 10")
    gpu0, gpu1 = topo.gpus
    assert [(link["target"], link["count"]) for link in gpu0.nvlinks] == [
        ("0000:07:00.0", 1), ("0000:0a:00.0", 1), ("0000:0b:00.0", 2), ("0000:85:00.0", 2)]
    assert [link["count"] for link in gpu1.nvlinks] == [2, 2] and gpu1.rank == 1
    assert (gpu0.cut, gpu1.cut) == (False, True)  # the paste ends inside gpu1: its other links are unknown
    assert [h.busid for h in gpu0.chain] == ["0000:03:00.0", "0000:06:00.0"] and gpu0.chain[0].pci_class == "0x060400"


def test_an_a100_three_switch_levels_down_cut_inside_its_nvlinks():
    """nccl#1125's A100 node: gpu0 under three Broadcom switch levels (01, 03, 05), Gen4 x16, on an AMD EPYC; the four
    NVSwitch links pasted before the cut (d5, d2, d4, d7, two each) read, the GPU marked cut."""
    topo = read("nccl1125-a100-amd-three-switch-levels-cut.xml")
    assert topo.ends_early.startswith("the XML ends or breaks at line 12")
    ((cpu,), (gpu,)) = topo.cpus, topo.gpus
    assert (cpu.numaid, cpu.vendor, cpu.affinity) == (0, "AuthenticAMD", "00000000,ffffffff,00000000,ffffffff")
    assert [h.busid for h in gpu.chain] == ["0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"]
    assert {(h.link_gts, h.link_width) for h in gpu.chain} == {(16.0, 16)}
    assert (gpu.dev, gpu.rank, gpu.sm, gpu.gdr, gpu.cut) == (0, 0, 80, True, True)
    assert [(n["target"], n["count"]) for n in gpu.nvlinks] == [(f"0000:{b}:00.0", 2) for b in ("d5", "d2", "d4", "d7")]


def test_rccls_version_2_dump_with_four_levels_above_its_gpu():
    topo = read("rccl1185-mi300-v2-dump-cut.xml")
    assert (topo.version, topo.cpus[0].numaid) == (2, 3) and topo.ends_early
    (gpu,) = topo.gpus  # the second one's <pci> is cut in its start tag
    assert [h.busid for h in gpu.chain] == ["0000:31:00.0", "0000:33:00.0", "0000:35:00.0", "0000:37:00.0"]
    assert gpu.chain[-1].pci_class == "0x038000"


def test_what_real_dumps_write_that_is_not_a_figure_is_unknown_never_a_narrow_link():
    text = """<system version="1"><cpu numaid="0" host_hash="0xabc"><pci busid="0000:1a:00.0" class="0x060400" link_speed="" link_width="0">
    <pci busid="0000:1b:00.0" class="0x030200" link_speed="Unknown" link_width="">
      <gpu dev="0" sm="90" rank="0" gdr="1"><nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/></gpu>
      <gpu dev="1" sm="90" rank="1" gdr="1"/>
    </pci></pci></cpu><cpu numaid="0" host_hash="0xdef"/></system>"""
    topo = parse_nccl_topo_xml(text)
    assert [(h.link_gts, h.link_width) for h in topo.gpus[0].chain] == [(None, None), (None, None)]
    assert topo.gpus[0].nvlinks == [{"target": "fffffff:ff:ff.0", "count": 18, "tclass": "0x068000"}]
    assert [g.dev for g in topo.gpus] == [0, 1] and {g.busid for g in topo.gpus} == {"0000:1b:00.0"}  # two under one <pci>
    assert [c.host_hash for c in topo.cpus] == ["0xabc", "0xdef"]  # a multi-node NVLink dump


@pytest.mark.parametrize(("text", "why"), [
    ("", "no <system> element"),
    ("not xml at all", "no <system> element"),
    ('<topology version="2.0"><object type="Machine"/></topology>', "root element is <topology>"),  # hwloc's, not NCCL's
    ('<!DOCTYPE system [<!ENTITY a "aaaa">]><system version="1">&a;</system>', "a DTD or an entity"),
    ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]><system/>', "a DTD or an entity"),
    ("<system>" + "<pci>" * (MAX_DEPTH + 1), "levels deep"),
    ("<system>" + "<cpu/>" * (MAX_ELEMENTS + 1) + "</system>", f"past {MAX_ELEMENTS} elements"),
    ("<system>" + " " * (5 << 20) + "</system>", "more than 4 MiB"),
])
def test_what_is_not_a_topology_or_past_its_bounds_is_refused_saying_why(text, why):
    with pytest.raises(ParseError, match=why):
        parse_nccl_topo_xml(text)


def test_garbage_after_a_whole_topology_is_said_and_the_topology_kept():
    topo = parse_nccl_topo_xml((FIXTURES / "gb10-dgx-spark-dump.xml").read_text() + "<system>")
    assert len(topo.gpus) == 1 and topo.ends_early.startswith("the XML ends or breaks at line 16")


# NCCL's topology as its GRAPH log prints it (tests/fixtures/nccl-topo/*-graph-log.txt)
def log(name: str):
    from nodecheck.probes.nccl_topo import parse_nccl_topo_log

    return parse_nccl_topo_log((FIXTURES / name).read_text())


def test_the_graph_log_of_an_hgx_a100_gives_each_gpus_pci_chain_with_nccls_bandwidth():
    """nccl-tests#100: GPU E000 (rank 0) three PCI levels below CPU 0 at 24 GB/s each; CPU 1 is a SYS link, no chain."""
    topo = log("nccl-tests100-a100-graph-log.txt")
    (gpu,) = topo.gpus
    assert (gpu.busid, gpu.rank, [c.numaid for c in topo.cpus]) == ("0000:0e:00.0", 0, [0])
    assert [(h.busid, h.nccl_gbps) for h in gpu.chain] == [
        ("0000:01:00.0", 24.0), ("0000:06:00.0", 24.0), ("0000:0c:00.0", 24.0), ("0000:0e:00.0", 24.0)]
    # the paste ends at the GPU's own line: the NVLinks NCCL prints below it are not there, so unknown
    assert gpu.cut and topo.ends_early == "the block ends before NCCL's closing line of '=': read up to there"


def test_a_vms_graph_log_puts_gpu_and_nic_straight_under_the_cpu():
    """nccl-tests#182: NCCL could not read the bridge's speed and width in the VM; GPU 3000 and NIC 3010 each one PCI
    link below the CPU at 12 GB/s: a flattened tree (no switch between them)."""
    topo = log("nccl-tests182-graph-log.txt")
    ((gpu,), (nic,)) = topo.gpus, topo.nics
    assert [(h.busid, h.nccl_gbps) for h in gpu.chain] == [("0000:03:00.0", 12.0)]
    assert [h.busid for h in nic.chain] == ["0000:03:01.0"]
    assert not gpu.cut  # the NIC's line at the GPU's own depth follows: everything below the GPU was printed


def test_nccl_2_5s_form_with_a_cpu_of_no_numa_id():
    topo = log("nccl340-old-graph-log.txt")
    assert [c.numaid for c in topo.cpus] == [None] and [(g.busid, g.rank) for g in topo.gpus] == [("0000:01:00.0", 0)]


def test_nvlinks_and_nvswitches_in_a_graph_log_and_a_log_without_a_system_block():
    from nodecheck.probes.nccl_topo import parse_nccl_topo_log

    text = """h:1:2 [0] NCCL INFO === System : maxBw 240.0 totalBw 240.0 ===
h:1:2 [0] NCCL INFO CPU/0-0 (1/1/2)
h:1:2 [0] NCCL INFO + PCI[48.0] - PCI/0-17000
h:1:2 [0] NCCL INFO               + PCI[48.0] - GPU/0-18000 (0)
h:1:2 [0] NCCL INFO                             + NVL[240.0] - NVS/0
h:1:2 [0] NCCL INFO               + PCI[48.0] - NIC/0-19000
h:1:2 [0] NCCL INFO                             + NET[50.0] - NET/0 (0/0/50.000000)
h:1:2 [0] NCCL INFO ==========================================
"""
    topo = parse_nccl_topo_log(text)
    ((gpu,), (nic,)) = topo.gpus, topo.nics
    assert gpu.nvlinks == [{"target": "nvswitch", "count": None, "tclass": None, "bw": 240.0}]
    assert (gpu.cut, topo.ends_early) == (False, None)
    lines = text.splitlines()  # another rank's lines in the middle of the block, as several ranks log at once
    mixed = parse_nccl_topo_log("\n".join(lines[:4] + ["h:7:8 [1] NCCL INFO Setting affinity for GPU 1 to ff"] + lines[4:]))
    assert mixed.gpus[0].nvlinks == gpu.nvlinks and len(mixed.nics) == 1 and mixed.ends_early is None
    assert [h.busid for h in gpu.chain] == ["0000:17:00.0", "0000:18:00.0"] and [h.busid for h in nic.chain] == ["0000:17:00.0", "0000:19:00.0"]
    with pytest.raises(ParseError, match="no .=== System. block"):
        parse_nccl_topo_log("h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB\n")
