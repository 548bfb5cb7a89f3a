"""A GPU off its board's NVLink mesh (gpu_off_nvlink): `nvidia-smi topo -m` links it by NVLink to none of its
same-model siblings while they all link each other by it. Caught on the published B200 of vllm-project/vllm#16336
(GPU2 reads NODE and SYS to the seven others, which read NV18 among themselves); never raised on the published
healthy topologies (NVSwitch boards, full meshes, bridged pairs, the DGX-1 hybrid cube mesh, PCIe-only nodes)."""

import json
import re
import shutil

import pytest
from helpers import PUBLIC, REPO, make_report, need, nodecheck

from nodecheck.checks.links import left_out_of_mesh
from nodecheck.config import Config
from nodecheck.probes.topo import parse_topo_matrix
from nodecheck.report.model import Gpu, Link

B200_ROWS = REPO / "tests" / "fixtures" / "topo" / "vllm16336-b200-gpu2-off-nvlink-rows.txt"
HGX = REPO / "examples" / "hgx-h100-8gpu"
_GPU_CELLS = 8  # the matrix's GPU columns in B200_ROWS


def _report(links: list[tuple[int, int, str]], gpus: int, name="NVIDIA B200", **gpu) -> object:
    return make_report(gpus=[Gpu(index=i, name=name, **gpu) for i in range(gpus)],
                       links=[Link(a, b, kind, "nvlink" if kind.startswith("NV") else "pcie") for a, b, kind in links])


def _published_b200_pairs() -> list[tuple[int, int, str]]:
    """Every GPU pair the published rows give (rows 0 to 5 name each pair but GPU6-GPU7), each once."""
    pairs = {}
    for line in B200_ROWS.read_text().splitlines():
        label, *cells = line.split()
        row = int(label.removeprefix("GPU"))
        for column, kind in enumerate(cells[:_GPU_CELLS]):
            if column != row:
                pairs[tuple(sorted((row, column)))] = kind
    return [(a, b, kind) for (a, b), kind in sorted(pairs.items())]


def test_the_published_b200_with_gpu2_off_the_mesh_is_an_error():
    (finding,) = left_out_of_mesh(_report(_published_b200_pairs(), 8), Config())
    assert (finding.kind, finding.severity, finding.subject) == ("gpu_off_nvlink", "error", "gpu2")
    assert (finding.measured, finding.expected) == ("NODE, SYS", "NV18")
    assert "none of its 7 siblings (NVIDIA B200)" in finding.message


def test_the_same_board_whole_is_quiet_and_mig_or_a_config_s_links_take_over():
    whole = [(a, b, "NV18") for a in range(8) for b in range(a + 1, 8)]
    assert left_out_of_mesh(_report(whole, 8), Config()) == []
    assert left_out_of_mesh(_report(_published_b200_pairs(), 8, mig_enabled=True), Config()) == []  # no NVLink under MIG
    golden = Config(links={(a, b): "NV18" for a in range(8) for b in range(a + 1, 8)})
    assert left_out_of_mesh(_report(_published_b200_pairs(), 8), golden) == []  # gpu_link_changed names each pair
    unnamed = _report(_published_b200_pairs(), 8, name=None)  # topo -m alone says no model: siblings unknown
    assert left_out_of_mesh(unnamed, Config()) == []


def _published_topologies():
    shared = sorted((PUBLIC / "topo").glob("*.txt")) if (PUBLIC / "topo").is_dir() else []
    return shared + sorted(p for p in B200_ROWS.parent.glob("*.txt") if p != B200_ROWS)  # 4-GPU meshes: three siblings


@pytest.mark.parametrize("path", _published_topologies(), ids=lambda p: p.name)
def test_no_published_healthy_topology_reads_off_the_mesh(path):
    """Every GPU of each published matrix given one model, so that every GPU is every other's sibling: bridged pairs
    (4x A30), the hybrid cube mesh (DGX-1), PCIe-only nodes, NVSwitch boards and 4-GPU full meshes (a GPU and its
    three siblings: the fewest judged) raise nothing."""
    topo = parse_topo_matrix(need(path).read_text())
    pairs = [(l.a, l.b, l.type) for l in topo.links if isinstance(l.a, int) and isinstance(l.b, int)]
    assert left_out_of_mesh(_report(pairs, len(topo.gpus), name="one model"), Config()) == []


def test_inspect_and_the_prolog_name_it_on_the_hgx_example(tmp_path):
    """The HGX example with GPU2's cells as the published B200 has them (NODE to its socket's GPUs, SYS across): inspect
    says gpu_off_nvlink for gpu2 alone, and the prolog would drain the node for it."""
    node = tmp_path / "hgx"
    shutil.copytree(HGX, node)
    topo = node / "nvidia-smi-topo-m.txt"
    lines = topo.read_text().splitlines()
    socket = {f"GPU{i}": "NODE" if i < 4 else "SYS" for i in range(8)}
    out = []
    for line in lines:
        cells = list(re.finditer(r"\S+", line))
        if line.startswith("GPU"):
            row = cells[0].group()
            column = 3  # the GPU2 column: the label, then GPU0, GPU1, GPU2
            targets = range(1, 9) if row == "GPU2" else [column]
            for index in reversed(list(targets)):
                cell = cells[index]
                if cell.group().startswith("NV"):
                    kind = socket[f"GPU{index - 1}"] if row == "GPU2" else socket[row]
                    line = line[:cell.start()] + kind + line[cell.end():]
        out.append(line)
    topo.write_text("\n".join(out) + "\n")
    result = nodecheck("inspect", "--from", str(node), "--json")
    found = [f for f in json.loads(result.stdout)["findings"] if f["kind"] == "gpu_off_nvlink"]
    assert [(f["subject"], f["measured"], f["expected"]) for f in found] == [("gpu2", "NODE, SYS", "NV18")]
    prolog = nodecheck("prolog", "--dry-run", "--from", str(node))
    assert prolog.returncode == 1 and "gpu2 off the NVLink mesh (NODE, SYS)" in prolog.stdout + prolog.stderr


def test_one_gpu_of_a_published_4_gpu_mesh_off_it_is_caught():
    """nccl#1617's four H100 (NV6 each pair) with GPU3's links read as its NICs' SYS: the fewest siblings judged."""
    topo = parse_topo_matrix((B200_ROWS.parent / "nccl1617-4x-h100-nv6-full-mesh-4nic.txt").read_text())
    pairs = [(l.a, l.b, "SYS" if 3 in (l.a, l.b) else l.type) for l in topo.links
             if isinstance(l.a, int) and isinstance(l.b, int)]
    (finding,) = left_out_of_mesh(_report(pairs, 4, name="NVIDIA H100 80GB HBM3"), Config())
    assert (finding.subject, finding.measured, finding.expected) == ("gpu3", "SYS", "NV6")
