"""`nvidia-smi topo -m` parser on real outputs (../shared/captures) and on what must be refused."""

import re

import pytest
from helpers import H100, PUBLIC, SHARED, answer_key, need
from hypothesis import given, settings
from hypothesis import strategies as st

from nodecheck.core.errors import ParseError
from nodecheck.core.link_types import link_class
from nodecheck.probes.topo import parse_topo_matrix

KEY = answer_key("topo") if (PUBLIC / "topo" / "EXPECTED.json").exists() else {}


@pytest.mark.parametrize("name", sorted(KEY) or ["(captures absent)"])
def test_public_captures_match_answer_key(name):
    expected = KEY.get(name) or pytest.skip("../shared/captures/public/topo is absent")
    topo = parse_topo_matrix(need(PUBLIC / "topo" / name).read_text())
    assert len(topo.gpus) == expected["gpus"]
    assert len(topo.nics) == expected["nics"]
    pair = next((l.type for l in topo.links if (l.a, l.b) == (0, 1)), None)
    assert pair == expected["gpu0_gpu1"]
    assert topo.gpus[0].cpu_affinity == expected["gpu0_cpu_affinity"]


@pytest.mark.parametrize("name", sorted(KEY) or ["(captures absent)"])
def test_every_cell_matches_the_printed_matrix(name):
    """Each GPU row's tokens, read independently, equal the links the parser reports."""
    if name not in KEY:
        pytest.skip("../shared/captures/public/topo is absent")
    text = (PUBLIC / "topo" / name).read_text().replace("\r", "")
    topo = parse_topo_matrix(text)
    n = len(topo.gpus) + len(topo.nics)
    cells = {(l.a, l.b): l.type for l in topo.links}
    for line in text.splitlines():
        match = re.match(r"^GPU(\d+)\s", line)
        if match:
            row = line.split()[1 : 1 + n]
            for column, cell in enumerate(row):
                if column < len(topo.gpus) and column > int(match[1]):
                    assert cells[(int(match[1]), column)] == cell


def test_h100_vm_capture_with_ansi_escapes_and_empty_cell():
    topo = parse_topo_matrix(need(H100 / "nvidia-smi-topo-m.txt").read_text())
    assert [(g.index, g.cpu_affinity, g.numa_affinity, g.gpu_numa_id) for g in topo.gpus] == [(0, "0-15", [0], None)]
    assert topo.nics == [] and topo.links == []


def test_nic_legend_names_nics_and_links():
    topo = parse_topo_matrix(need(PUBLIC / "topo" / "hgx-h100-8gpu-8nic-sglang30401.txt").read_text())
    assert topo.nics == [f"mlx5_{i}" for i in range(8)]
    assert {(l.a, l.b): l.type for l in topo.links}[(3, "mlx5_3")] == "PIX"
    assert topo.gpus[4].numa_affinity == [1]
    assert link_class("NV18") == "nvlink" and link_class("SYS") == "socket-interconnect"


def test_no_legend_keeps_nic_column_names():
    text = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPHB\tPIX\t0-7\t0\nGPU1\tPHB\t X \tPHB\t0-7\t0\nNIC0\tPIX\tPHB\t X \n"
    topo = parse_topo_matrix(text)
    assert topo.nics == ["NIC0"]
    assert {(l.a, l.b): l.type for l in topo.links} == {(0, 1): "PHB", (0, "NIC0"): "PIX", (1, "NIC0"): "PHB"}


def test_empty_and_na_affinity_cells():
    text = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tSYS\t\t\tN/A\t\tN/A\n"
            "GPU1\tSYS\t X \t8-15\t1\t\t2\n")
    topo = parse_topo_matrix(text)
    assert (topo.gpus[0].cpu_affinity, topo.gpus[0].numa_affinity, topo.gpus[0].gpu_numa_id) == ("", [], None)
    assert (topo.gpus[1].cpu_affinity, topo.gpus[1].numa_affinity, topo.gpus[1].gpu_numa_id) == ("8-15", [1], 2)


def test_legacy_soc_is_the_socket_interconnect():
    topo = parse_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-5\nGPU1\tSOC\t X \t6-11\n")
    assert topo.links[0].type == "SOC" and link_class("SOC") == "socket-interconnect"


REFUSED = {
    "driver error": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                    "Make sure that the latest NVIDIA driver is installed and running.\n",
    "no devices": "No devices were found\n",
    "amd-smi": "============================ ROCm System Management Interface ============================\n"
               "================================ Weight between two GPUs =================================\n"
               "       GPU0         GPU1\nGPU0   0            15\nGPU1   15           0\n",
    "empty": "",
    "header only": "\tGPU0\tGPU1\tCPU Affinity\n",
    "truncated row": "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-3\nGPU1\tNV4\n",
    "missing GPU row": "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-3\n",
    "unknown link": "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tFAST\t0-3\nGPU1\tFAST\t X \t0-3\n",
    "X off the diagonal": "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tX\t0-3\nGPU1\tNV4\t X \t0-3\n",
    "garbled affinity": "\tGPU0\tCPU Affinity\nGPU0\t X \tzz-top\n",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refuses_what_is_not_the_table(case):
    with pytest.raises(ParseError) as error:
        parse_topo_matrix(REFUSED[case])
    assert "topo" in str(error.value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["GPU0", "GPU1", "NIC0", "mlx5_0", " X ", "NV4", "SYS", "PIX", "0-3", "N/A",
                                 "CPU Affinity", "\t", "  ", "\n", "\x1b[4m", "Legend:", "NIC Legend:", "NIC0: mlx5_0"]),
                max_size=40))
def test_fuzz_table_shaped_noise(tokens):
    try:
        topo = parse_topo_matrix("".join(tokens))
    except ParseError:
        return
    assert topo.gpus, "a parsed table always has GPUs"


def seed_tables() -> list[str]:
    """The `nvidia-smi topo -m` tables printed in seed 002 (blocks starting at a tab-indented GPU0 header)."""
    seed = need(SHARED / "seeds" / "002_ed3703dc5121dde3.txt").read_text().splitlines()
    tables = []
    for i, line in enumerate(seed):
        if line.startswith("\tGPU0"):
            block = [line]
            for row in seed[i + 1 :]:
                if not row.startswith("GPU"):
                    break
                block.append(row)
            tables.append("\n".join(block) + "\n")
    return tables


def test_seed_002_examples():
    parsed = [parse_topo_matrix(t) for t in seed_tables()]
    assert [(len(t.gpus), t.links[0].type, t.gpus[0].cpu_affinity, t.gpus[-1].numa_affinity) for t in parsed] == [
        (2, "NV2", "0-23", []), (2, "PHB", "0-11", []), (8, "NV12", "0-23", [1]), (8, "NV18", "0-51", [1])]


LINKS = st.sampled_from(["NV1", "NV2", "NV4", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"])


@st.composite
def topo_tables(draw):
    """A table as nvidia-smi prints it: 1-16 GPUs, 0-18 NICs, tabs or spaces, legend or not."""
    gpus, nics = draw(st.integers(1, 16)), draw(st.integers(0, 18))
    devices = [f"GPU{i}" for i in range(gpus)] + [f"NIC{i}" for i in range(nics)]
    cell = {}
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            cell[(a, b)] = cell[(b, a)] = draw(LINKS) if a.startswith("GPU") and b.startswith("GPU") else draw(LINKS.filter(lambda t: not t.startswith("NV")))
    affinity = [draw(st.sampled_from(["0-23,48-71", "24-47", "0", "N/A"])) for _ in range(gpus)]
    sep = draw(st.sampled_from(["\t", "    ", " \t"]))
    legend = draw(st.booleans())
    lines = [sep + sep.join(devices + ["CPU Affinity", "NUMA Affinity"])]
    for i, a in enumerate(devices):
        row = [a] + [" X " if a == b else cell[(a, b)] for b in devices]
        if a.startswith("GPU"):
            row += [affinity[i], "0"]
        lines.append(sep.join(row))
    lines += ["", "Legend:", "", "  X    = Self"]
    if legend and nics:
        lines += ["", "NIC Legend:", ""] + [f"  NIC{i}: mlx5_{i}" for i in range(nics)]
    return "\n".join(lines) + "\n", gpus, nics, cell, affinity, legend


@settings(max_examples=150, deadline=None)
@given(topo_tables())
def test_round_trip_1_to_16_gpus_0_to_18_nics(table):
    text, gpus, nics, cell, affinity, legend = table
    topo = parse_topo_matrix(text)
    name = (lambda i: f"mlx5_{i}") if legend and nics else (lambda i: f"NIC{i}")
    assert len(topo.gpus) == gpus and topo.nics == [name(i) for i in range(nics)]
    assert [g.cpu_affinity for g in topo.gpus] == ["" if a == "N/A" else a for a in affinity]
    got = {(l.a, l.b): l.type for l in topo.links}
    assert len(got) == gpus * (gpus - 1) // 2 + gpus * nics
    for (a, b), link in cell.items():
        if not a.startswith("GPU"):
            continue
        if b.startswith("NIC"):
            assert got[(int(a[3:]), name(int(b[3:])))] == link
        elif int(b[3:]) > int(a[3:]):
            assert got[(int(a[3:]), int(b[3:]))] == link
