"""examples/: the shipped 8-GPU snapshot and job Report are what tests/examples_builder.py makes from the real
captures in ../shared, and what the README does with them works (inspect --from, scale --from)."""

import filecmp
import json
import os

import examples_builder as builder
import pytest
from helpers import REPO, nodecheck

EXAMPLES = REPO / "examples"


def test_shipped_examples_are_what_the_builder_makes(tmp_path):
    if os.environ.get("NODECHECK_REGENERATE_EXAMPLES"):
        builder.build()
    node = builder.build_node(tmp_path / "hgx-h100-8gpu")
    compared = filecmp.dircmp(node, builder.NODE)
    differing = []

    def walk(c, where=""):
        differing.extend(f"{where}{name}" for name in c.left_only + c.right_only + c.diff_files)
        for name, sub in c.subdirs.items():
            walk(sub, f"{where}{name}/")
    walk(compared)
    assert not differing, f"examples/ is stale (NODECHECK_REGENERATE_EXAMPLES=1 rebuilds it): {differing}"
    assert builder.build_job(builder.NODE) == json.loads(builder.JOB.read_text())


def test_inspect_from_the_example_node():
    result = nodecheck("inspect", "--json", "--from", str(EXAMPLES / "hgx-h100-8gpu"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [g["index"] for g in report["gpus"]] == list(range(8))
    assert all(sum(link["active"] for link in g["nvlinks"]) == 18 for g in report["gpus"])
    nics = {n["name"]: n for n in report["nics"]}
    assert sorted(nics) == [f"mlx5_{k}" for k in range(8)] and all(n["kind"] == "infiniband" for n in nics.values())
    specs = {p["path"]: p["bytes_per_second"] for p in report["paths"]}
    assert specs["nic:mlx5_0"] == 50e9 and specs["gpu0:host"] == pytest.approx(63.0e9, rel=0.01)
    assert report["findings"] == []
    text = nodecheck("inspect", "--from", str(EXAMPLES / "hgx-h100-8gpu"), env={"COLUMNS": "200"}).stdout
    # its HCAs have no netdev: naming one as NCCL's socket interface would leave NCCL without any
    assert "NCCL_IB_HCA=mlx5_4" in text and "NCCL_SOCKET_IFNAME" not in text


def test_scale_from_the_example_job():
    result = nodecheck("scale", "--from", str(EXAMPLES / "job-8node-allreduce.json"), "--params", "7B", "--step-time", "1.0",
                       "--nodes", "16", "--json")
    assert result.returncode == 0, result.stderr
    fabric = json.loads(result.stdout)["fabric"]
    assert fabric["gpus_per_node"] == 8 and fabric["inter_busbw"] == pytest.approx(386.56e9)
    assert "measured: allreduce:64-ranks" in fabric["source"]
    job = json.loads((EXAMPLES / "job-8node-allreduce.json").read_text())
    (allreduce,) = job["measurements"]
    assert allreduce["spec_bytes_per_second"] == 8 * 50e9 and allreduce["ratio"] == pytest.approx(386.56 / 400)
    assert "not measured by nodecheck" in allreduce["details"]["example"]
