"""lstopo XML parser on published hwloc XML (answer key), on this machine's real lstopo, and on garbage."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import H100, PUBLIC, SHARED, answer_key, need
from hypothesis import given, settings
from hypothesis import strategies as st

from nodecheck.core.errors import ParseError
from nodecheck.core.units import parse_cpulist
from nodecheck.host.live import LiveHost
from nodecheck.probes.lstopo import ARGV, parse_lstopo_xml

KEY = answer_key("lstopo") if (PUBLIC / "lstopo" / "EXPECTED.json").exists() else {}


@pytest.mark.parametrize("name", sorted(KEY) or ["(captures absent)"])
def test_public_xml_matches_answer_key(name):
    expected = KEY.get(name) or pytest.skip("../shared/captures/public/lstopo is absent")
    facts = parse_lstopo_xml(need(PUBLIC / "lstopo" / name).read_text())
    assert (facts.packages, facts.numa_nodes, facts.cores, facts.pus) == (
        expected["packages"], expected["numa_nodes"], expected["cores"], expected["pus"])
    assert [(g.pci_busid, g.osdevs, g.numa_nodes) for g in facts.gpus] == [
        (g["pci_busid"], g["osdevs"], g["numa_nodes"]) for g in expected["gpus"]]
    assert [g.model for g in facts.gpus] == [g.get("model") for g in expected["gpus"]]
    assert [(n.name, n.kind, n.pci_busid, n.numa_nodes) for n in facts.nics] == [
        (n["name"], n["kind"], n["pci_busid"], n["numa_nodes"]) for n in expected["nics"]]
    assert (facts.dmi_product, facts.cpu_model) == (expected["dmi_product"], expected["cpu_model"])


def test_h100_vm_gpu_is_an_opencl_coprocessor():
    facts = parse_lstopo_xml(need(H100 / "lstopo.xml").read_text())
    assert (facts.packages, facts.numa_nodes, facts.cores, facts.pus) == (1, 1, 16, 16)
    assert facts.numa == {0: "0-15"}
    assert [(g.osdevs, g.model) for g in facts.gpus] == [(["opencl1d0 (OpenCL)"], "NVIDIA H100 80GB HBM3")]
    assert [(n.name, n.pci_busid) for n in facts.nics] == [("eth0", "0000:00:03.0")]


def test_real_lstopo_on_this_machine():
    if shutil.which(ARGV[0]) is None:
        pytest.skip("hwloc's lstopo-no-graphics is not installed (apt install hwloc-nox)")
    facts = parse_lstopo_xml(LiveHost().command("lstopo.xml", ARGV, timeout=30))
    assert facts.pus == len(os.sched_getaffinity(0)) or facts.pus == os.cpu_count()
    nodes = sorted(p.name for p in Path("/sys/devices/system/node").glob("node[0-9]*"))
    assert facts.numa_nodes == max(1, len(nodes))
    for node in nodes:  # the NUMA node cpulists agree with the kernel's
        kernel = parse_cpulist(Path(f"/sys/devices/system/node/{node}/cpulist").read_text())
        assert parse_cpulist(facts.numa[int(node[4:])]) == kernel
    physical = {p.name for p in Path("/sys/class/net").iterdir() if (p / "device").exists()}
    assert physical <= {n.name for n in facts.nics}


@pytest.mark.parametrize("text", ["", "not xml", "<html><body>502</body></html>", "<topology/>",
                                  '<topology version="2.0"><object type="Machine"/></topology>'])
def test_refuses_what_is_not_a_topology(text):
    with pytest.raises(ParseError):
        parse_lstopo_xml(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(['<topology version="2.0">', '<topology version="3.0">', "</topology>",
                                 '<object type="Machine" nodeset="0x1">', '<object type="PU" cpuset="0x1">',
                                 '<object type="NUMANode" os_index="0" cpuset="0xzz">', '<object type="OSDev" osdev_type="2" name="e">',
                                 '<object type="PCIDev" pci_busid="0000:01:00.0">', "</object>", '<info name="CPUModel"/>']),
                max_size=30))
def test_fuzz_xml_shaped_noise(parts):
    try:
        parse_lstopo_xml("".join(parts))
    except ParseError:
        pass


def hwloc_readable_peer_xmls() -> list[Path]:
    """hwloc's own test XMLs (../shared/peer/hwloc-xml) that this machine's hwloc can load."""
    folder = SHARED / "peer" / "hwloc-xml"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    if shutil.which("hwloc-calc") is None or shutil.which("hwloc-info") is None:
        pytest.skip("hwloc's tools are not installed (apt install hwloc-nox)")
    readable = [xml for xml in sorted(folder.glob("*.xml"))
                if subprocess.run(["hwloc-info", "--input", str(xml)], capture_output=True, timeout=30).returncode == 0]
    assert len(readable) >= 40  # hwloc 2.x reads the 1.x and 2.x files; 3.0 ones need hwloc 3
    return readable


def test_counts_agree_with_hwloc_on_its_own_test_xmls():
    """hwloc's tools are the oracle: packages, cores and PUs within the allowed CPUs (hwloc-calc), NUMA
    nodes as objects (hwloc-info, CPU-less ones included). Covers hwloc 1.x `Socket`, topologies without
    NUMANode objects (hwloc says 1), and exports holding disallowed objects."""
    wrong = []
    for xml in hwloc_readable_peer_xmls():
        calc = [int(subprocess.run(["hwloc-calc", "--input", str(xml), "--number-of", kind, "all"], capture_output=True,
                                   text=True, timeout=30).stdout.strip() or 0) for kind in ("package", "core", "pu")]
        info = subprocess.run(["hwloc-info", "--input", str(xml)], capture_output=True, text=True, timeout=30).stdout
        numa = re.search(r"(\d+) NUMANode", info)
        oracle = (calc[0], int(numa[1]) if numa else 0, calc[1], calc[2])
        facts = parse_lstopo_xml(xml.read_text())
        if (facts.packages, facts.numa_nodes, facts.cores, facts.pus) != oracle:
            wrong.append((xml.name, oracle, (facts.packages, facts.numa_nodes, facts.cores, facts.pus)))
    assert wrong == []


def test_nic_numa_nodes_agree_with_hwloc_calc():
    checked, wrong = 0, []
    for xml in hwloc_readable_peer_xmls():
        for nic in parse_lstopo_xml(xml.read_text()).nics:
            out = subprocess.run(["hwloc-calc", "--input", str(xml), "--po", "-I", "numa", f"os={nic.name}"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
            checked += 1
            if sorted(int(v) for v in out.split(",") if v) != nic.numa_nodes:
                wrong.append((xml.name, nic.name, out, nic.numa_nodes))
    assert checked >= 50 and wrong == []
