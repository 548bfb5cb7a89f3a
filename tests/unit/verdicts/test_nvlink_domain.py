"""A job across the nodes of one multi-node NVLink domain (GB200 NVL72: every GPU of the rack on the NVLink
switches, NVML's fabric naming one cluster and clique) runs over NVLink, not the rails. bench bounded it by the
rails nearest each rank's GPU (one 400G port, 50 GB/s), so CoreWeave's healthy NVL72 rack (681 GB/s busbw at
1 GiB) read 13.6 x that bound, a "fabric misread" warning on every job, and a rack whose NVLink ran at a third
of its rate still read above the rails' bound: a silent pass. The bound is now the slowest GPU's NVLink rate
where every rank shares one domain, and nothing (said why) for a job across domains."""

import json
import os
import subprocess
import sys

import pytest
from gpu_fabric_cases import published
from helpers import PUBLIC, free_port, gpu_node_with_rdma, hgx_nvml, need

from nodecheck.assemble.rails import rank_nvlink
from nodecheck.bench import distributed
from nodecheck.bench.distributed import DistEnv, run_allreduce
from nodecheck.bench.nccl_tests import parse_nccl_log
from nodecheck.config import Config
from nodecheck.core.pairing import exchange_spec, job_bound, one_nvlink_domain
from nodecheck.report.findings import Finding
from nodecheck.report.model import Imex
from nodecheck.verdicts.bandwidth import measurement_findings
from nodecheck.verdicts.signal_join import joined

DOMAIN = "9c6f5af3-53bf-49b5-a436-b66766c413c3/4026"  # gpud's GB200: ClusterUUID / CliqueId
IMEX_READY = Imex("READY", "UP")  # nvidia-imex-ctl -q READY, -N -j status UP
NVLINK5 = 900e9  # 18 NVLink 5 links at 50 GB/s one way
RAIL = 50e9  # one 400 Gbit/s NDR port


def gb200_tray(tmp_path, fabric=None, imex: Imex | None = IMEX_READY):
    """A GB200 compute tray as the worker's inputs see it: Blackwell GPUs (NVML architecture 10) with 18 active
    NVLink 5 links each (version enum 7), registered in gpud's GB200 domain, a 400G NDR rail per GPU, and IMEX
    READY with its domain UP (without IMEX no GPU shares memory with another node's: a job takes the rails)."""
    gpus = hgx_nvml(18, version=7, arch=10, name="NVIDIA GB200", fabric=fabric or published()["gb200-healthy"])
    devices = [(f"mlx5_{i}", "400 Gb/sec (4X NDR)", "InfiniBand") for i in range(8)]
    report = gpu_node_with_rdma(tmp_path / "gb200", "hgx-h100-8gpu-8nic-sglang30401.txt", gpus, devices)
    report.imex = imex
    return report


def member(rank, node, domain=DOMAIN, rate=NVLINK5):
    said = {"rank": rank, "node": node, "address": f"198.18.0.{rank + 1}", "local_rank": 0,
            "rails": [{"name": f"mlx5_{rank}", "rate": RAIL}]}
    return said | ({"nvlink": {"domain": domain, "rate": rate}} if domain else {})


def test_a_ranks_gpu_in_a_registered_domain_is_bound_by_its_nvlink(tmp_path):
    report = gb200_tray(tmp_path)
    said = rank_nvlink(report, report.gpus[5], {})
    assert (said["domain"], said["rate"]) == (DOMAIN, NVLINK5) and "NVLink 5 x18" in said["basis"]
    assert rank_nvlink(report, report.gpus[5], {"NCCL_MNNVL_ENABLE": "0"}) is None  # NCCL told to keep off it
    hgx = gb200_tray(tmp_path / "hgx", fabric=published()["gb200-healthy"] | {"clusterUuid": bytes(16)})
    assert rank_nvlink(hgx, hgx.gpus[5], {}) is None  # an HGX board's NVSwitch: no cluster, the rails carry a job
    pending = gb200_tray(tmp_path / "p", fabric=published()["gb200-healthy"] | {"state": 2})
    assert rank_nvlink(pending, pending.gpus[5], {}) is None  # not registered: CUDA refuses work, NCCL cannot take NVLink
    for imex in (None, Imex("READY", "DEGRADED"), Imex("INITIALIZING", None)):  # IMEX unread or not ready: the rails
        no_imex = gb200_tray(tmp_path / f"i{id(imex)}", imex=imex)
        assert rank_nvlink(no_imex, no_imex.gpus[5], {}) is None


def test_the_jobs_bound_is_nvlink_in_one_domain_and_none_across_domains():
    one = [member(0, "a"), member(1, "b"), member(2, "c", rate=450e9)]
    assert one_nvlink_domain(one) == DOMAIN and job_bound(one) == 450e9  # the slowest GPU's
    assert exchange_spec(one, [(0, 1)], 0, 1) == NVLINK5  # each GPU over its own links: no sharing
    across = [member(0, "a"), member(1, "b", domain="another-rack/1")]
    assert one_nvlink_domain(across) is None and job_bound(across) is None
    partly = [member(0, "a"), member(1, "b", domain=None)]
    assert job_bound(partly) is None
    assert exchange_spec(partly, [(0, 1)], 0, 1) == RAIL  # a pair not both in the domain: the rails
    unknown = [member(0, "a"), member(1, "b", rate=None)]
    assert job_bound(unknown) is None
    assert job_bound([member(0, "a", domain=None), member(1, "b", domain=None)]) == RAIL  # no domain: as before


def coreweave_1gib_busbw() -> float:
    log = parse_nccl_log(need(PUBLIC / "nccl" / "coreweave-gb200-nvl72-1rack-all_reduce_perf-partial.txt").read_text())
    return next(r for r in log.rows if r.size_bytes == 1 << 30).out_of_place.busbw_gbytes * 1e9


def run_on(report, monkeypatch, busbw: float, peer_domain: str | None = DOMAIN, peer_rate: float | None = NVLINK5):
    """bench's all-reduce on local rank 5 of this tray in a two-node job, the worker answering as the real one does
    from each rank's description (job_bound over what the ranks gathered)."""
    seen = {}

    def worker(argv, out, timeout, env=None):
        seen["argv"] = argv
        mine = {"rank": 0, "node": "tray-a", "address": "198.18.0.1", "local_rank": 5,
                "rails": json.loads(argv[argv.index("--rails") + 1])}
        if "--nvlink" in argv:
            mine["nvlink"] = json.loads(argv[argv.index("--nvlink") + 1])
        members = [mine, member(1, "tray-b", domain=peer_domain, rate=peer_rate)]
        return {"world_size": 2, "backend": "nccl", "nodes": members, "spec_bytes_per_second": job_bound(members),
                "rows": [{"size_bytes": 1 << 30, "seconds": 1.0, "algbw": busbw, "busbw": busbw}], "pair_exchanges": []}

    monkeypatch.setattr(distributed, "run_worker", worker)
    m = run_allreduce(report, Config(), DistEnv(0, 2, "198.18.0.1", 29500), "quick", 30,
                      {"LOCAL_RANK": "5", "CUDA_VISIBLE_DEVICES": "5"})
    return m, seen["argv"]


def test_a_healthy_nvl72_job_reads_against_nvlink_and_a_slow_one_is_caught(tmp_path, monkeypatch):
    report = gb200_tray(tmp_path)
    healthy = coreweave_1gib_busbw()  # 681.17 GB/s: 72 GPUs of one rack at bench's quick payload
    m, argv = run_on(report, monkeypatch, healthy)
    assert json.loads(argv[argv.index("--nvlink") + 1]) == {"domain": DOMAIN, "rate": NVLINK5}
    assert float(argv[argv.index("--threshold") + 1]) == Config().ratio_for("allreduce", "nvlink", "busbw")
    assert (m.spec_bytes_per_second, m.details["path_kind"]) == (NVLINK5, "nvlink")
    assert m.ratio == pytest.approx(0.757, abs=0.001) and measurement_findings([m], Config()) == []
    assert "NVLink bound: every rank's GPU is in one multi-node NVLink domain" in m.details["note"]

    slow, _ = run_on(report, monkeypatch, 300e9)  # a third of the rate: a switch tray out, links down
    (finding,) = measurement_findings([slow], Config())
    assert (finding.kind, finding.severity, finding.measured) == ("bandwidth_below_spec", "error", "0.33")
    # the GPU's own NVLink errors are named in that verdict: its traffic crossed them, not the rails
    errors = Finding("nvlink_errors", "error", "gpu5", "crc_flit 900/s", "<= 100/s", "gpu5 NVLink CRC errors")
    rail = Finding("ib_port_errors", "error", "mlx5_5/1", "symbol_error 10/s", "0", "mlx5_5/1 port errors")
    (verdict,) = [f for f in joined(report, [slow], [finding, errors, rail]) if f.kind == "bandwidth_below_spec"]
    assert "error signals on this path: gpu5 crc_flit 900/s" in verdict.message and "mlx5_5" not in verdict.message


def test_a_job_across_domains_has_no_spec_and_says_why(tmp_path, monkeypatch):
    m, _ = run_on(gb200_tray(tmp_path), monkeypatch, coreweave_1gib_busbw(), peer_domain="another-rack/7")
    assert m.spec_bytes_per_second is None and m.ratio is None and measurement_findings([m], Config()) == []
    assert "several multi-node NVLink domains" in m.details["note"]


def test_a_job_in_one_domain_whose_nvlink_rate_is_unknown_says_so(tmp_path, monkeypatch):
    m, _ = run_on(gb200_tray(tmp_path), monkeypatch, coreweave_1gib_busbw(), peer_rate=None)
    assert m.spec_bytes_per_second is None and "a rank's NVLink rate is unknown" in m.details["note"]


def test_an_hgx_node_outside_any_domain_is_still_bound_by_its_rails(tmp_path, monkeypatch):
    hgx = gb200_tray(tmp_path, fabric=published()["gb200-healthy"] | {"clusterUuid": bytes(16)})
    m, argv = run_on(hgx, monkeypatch, 45e9, peer_domain=None)
    assert "--nvlink" not in argv and m.details["path_kind"] == "infiniband"
    assert m.spec_bytes_per_second == RAIL and m.ratio == pytest.approx(0.9)


def test_real_workers_gather_the_domain_and_bound_the_job_by_it(tmp_path):
    """Two real workers (gloo on loopback, each as a node of its own) hand their domains to each other: the job's
    spec is the NVLink rate, not the rails', and each rank's description carries its domain."""
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), LOCAL_RANK="0")
    outs = [tmp_path / "rank0.json", tmp_path / "rank1.json"]

    def argv(rank: int) -> list[str]:
        return [sys.executable, "-m", "nodecheck.bench.worker", "--backend", "gloo", "--sizes", "65536", "--timeout", "100",
                "--init-timeout", "100", "--node", f"tray-{rank}", "--address", f"198.18.0.{rank + 1}",
                "--rails", json.dumps([{"name": f"mlx5_{rank}", "rate": RAIL}]),
                "--nvlink", json.dumps({"domain": DOMAIN, "rate": NVLINK5}), "--out", str(outs[rank])]

    peer = subprocess.Popen(argv(1), env=dict(env, RANK="1"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result = distributed.run_worker(argv(0), outs[0], 200, env=dict(env, RANK="0"))
    finally:
        peer.wait(timeout=200)
    assert result["spec_bytes_per_second"] == NVLINK5
    assert [n["nvlink"] for n in result["nodes"]] == [{"domain": DOMAIN, "rate": NVLINK5}] * 2
