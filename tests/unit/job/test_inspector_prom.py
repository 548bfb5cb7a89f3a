"""NCCL Inspector's Prometheus snapshots read (src/nodecheck/job/inspector_prom.py) and a GPU or node below its
peers named (job/peers.py). NVIDIA's published lines (the plugin's README, tests/fixtures/nccl-inspector/SOURCES.md)
are read as printed; jobs are written as inspector_prom.cc writes them (one file per GPU, labels in its order, values
"%.6g"), each GPU's bucket around the README's 678.263 GB/s."""

import json
import random

import pytest
from helpers import REPO, cli

from nodecheck.core.errors import ParseError
from nodecheck.job.inspector_prom import is_inspector_prom, parse_inspector_prom
from nodecheck.job.peers import judge_peers

README = REPO / "tests/fixtures/nccl-inspector/readme-prom-nvl72004-T01-GPU0.prom"


def test_nvidias_published_lines_read_as_one_collective_and_one_p2p_bucket():
    text = README.read_text()
    assert is_inspector_prom(text)
    samples, skipped = parse_inspector_prom(text)
    assert skipped == 0
    coll, p2p = sorted(samples, key=lambda s: s.p2p)
    assert (coll.job, coll.node, coll.gpu, coll.comm_name, coll.nranks, coll.n_nodes, coll.op, coll.message_size,
            coll.algo_proto, coll.busbw, coll.exec_us) == ("unknown", "nvl72004-T01", "GPU0", "DP Group 0", 4, 1, "AllReduce",
                                                           "4-5GB", "Ring_ll", 678.263, 9498.47)
    assert (p2p.p2p, p2p.op, p2p.message_size, p2p.busbw, p2p.exec_us) == (True, "Send", "512-513MB", 464.9, 1154.87)
    named, notes = judge_peers(samples)
    assert named == [] and "fewer than 3 nodes" in notes[0]  # one node: nothing to compare it with


def line(metric: str, node: str, gpu: int, value: float, size: str = "4-5GB", job: str = "81234") -> str:
    labels = (f'version="v5.1",slurm_job_id="{job}",node="{node}",gpu="GPU{gpu}",comm_name="TP Group {gpu // 4}",'
              f'n_nodes="1",nranks="4",collective="AllReduce",message_size="{size}",algo_proto="Ring_ll"')
    return f"{metric}{{{labels}}} {value:.6g}\n"


def job(tmp_path, nodes=4, gpus=8, slow=None, seed=3, size="4-5GB"):
    """Every GPU's file of one snapshot; slow: {(node index, gpu): factor} scales those GPUs' bus bandwidth."""
    rng = random.Random(seed)
    for n in range(nodes):
        for g in range(gpus):
            busbw = 678.263 * rng.uniform(0.97, 1.03) * (slow or {}).get((n, g), 1.0)
            text = line("nccl_bus_bandwidth_gbs", f"nvl72004-T{n + 1:02d}", g, busbw, size)
            text += line("nccl_collective_exec_time_microseconds", f"nvl72004-T{n + 1:02d}", g, 9498.47 * 678.263 / busbw, size)
            (tmp_path / f"nccl_inspector_metrics_GPU-{n:02d}{g:02d}.prom").write_text(text)
    return tmp_path


def read(directory):
    samples = []
    for path in sorted(directory.glob("*.prom")):
        samples += parse_inspector_prom(path.read_text())[0]
    return samples


def test_one_slow_gpu_is_named_and_a_whole_slow_node_as_the_node(tmp_path):
    (tmp_path / "a").mkdir()
    named, _ = judge_peers(read(job(tmp_path / "a", slow={(2, 5): 0.5})))
    assert [(n.why, n.host, n.gpu) for n in named] == [("below_peers", "nvl72004-T03", "5")]
    assert 0.45 < named[0].share < 0.55 and "AllReduce 4-5GB (4 ranks, 1 node(s) a communicator)" in named[0].message
    (tmp_path / "b").mkdir()
    named, _ = judge_peers(read(job(tmp_path / "b", slow={(1, g): 0.6 for g in range(8)})))
    assert [(n.host, n.gpu) for n in named] == [("nvl72004-T02", None)] and "all its GPUs" in named[0].message


def test_healthy_a_late_rank_too_few_nodes_and_small_buckets_name_nobody(tmp_path):
    for name, kwargs in {"healthy": {}, "late": {"slow": {(0, 3): 1.6}}, "two": {"nodes": 2, "slow": {(0, 1): 0.5}},
                         "small": {"size": "1-2KB", "slow": {(0, 1): 0.5}}}.items():
        (tmp_path / name).mkdir()
        named, notes = judge_peers(read(job(tmp_path / name, **kwargs)))
        assert named == [], name
    assert "under 1 MB" in notes[0]


def test_garbage_and_hostile_lines(tmp_path):
    good = line("nccl_bus_bandwidth_gbs", "n1", 0, 600.0)
    text = "\n".join(["# HELP nccl_bus_bandwidth_gbs x", good.strip(), "nccl_bus_bandwidth_gbs{node=\"n1\"} NaN",
                      "nccl_bus_bandwidth_gbs{node=\"n1\"} -1", "nccl_bus_bandwidth_gbs{node=n1} 5", "node_load1 3",
                      "nccl_bus_bandwidth_gbs{" + "a=\"b\"," * 200_000 + "} 1", "x" * (1 << 20)])
    samples, skipped = parse_inspector_prom(text)
    assert len(samples) == 1 and skipped == 6
    for bad in ("hello", "node_load1 3\n", "nccl_bus_bandwidth_gbs{node=\"n\"} inf\n"):
        with pytest.raises(ParseError):
            parse_inspector_prom(bad)


def test_the_command_reads_a_directory_of_snapshots(tmp_path):
    job(tmp_path, slow={(3, 0): 0.4})
    result = cli("nccl-job", str(tmp_path))
    assert result.returncode == 1 and "below peers: nvl72004-T04 GPU0" in result.stdout
    assert "NCCL Inspector (Prometheus): 32 file(s), 32 GPU(s)" in result.stdout
    result = cli("nccl-job", str(tmp_path), "--json")
    document = json.loads(result.stdout)
    assert document["named"][0]["why"] == "below_peers" and document["files"][0]["prometheus_samples"] == 1
    assert cli("nccl-job", str(README)).returncode == 0
