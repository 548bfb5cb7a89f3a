"""Builds examples/ (shipped, so that `inspect --from` and `scale --from` can be tried without a GPU cluster):

- examples/hgx-h100-8gpu/: a snapshot of an 8-GPU HGX H100 node. Real: its `nvidia-smi topo -m` (a published
  HGX H100 board, captures/public/topo), the NVML values of each GPU (captured on this project's H100, with
  NVLinks as an HGX board reports them: 18 per GPU, all active), the loaded driver's version line (same H100),
  and each InfiniBand port's rate and state files (gpud's H100 NDR node: 400 Gb/sec, 4X NDR, ACTIVE).
  Built: the host name, the pairing of those parts into one node, and no lstopo XML (not in the snapshot).
- examples/job-8node-allreduce.json: the Report `nodecheck bench --tests allreduce --json` gives on 8 such
  nodes, 64 ranks. Its all-reduce rows are CoreWeave's published 64-GPU H100 nccl-tests run (IB with SHARP);
  the job's spec comes from the example node's rails as bench computes it.

`NODECHECK_REGENERATE_EXAMPLES=1 pytest tests/unit/cli/test_examples.py` rewrites them; the test checks the shipped
files are what this builder makes from ../shared."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers import PUBLIC, REPO, hgx_nvml, make_snapshot, need

from nodecheck import __version__

EXAMPLES = REPO / "examples"
NODE = EXAMPLES / "hgx-h100-8gpu"
JOB = EXAMPLES / "job-8node-allreduce.json"
TOPO = "hgx-h100-8gpu-8nic-sglang30401.txt"
TAKEN_AT = 1795500000.0  # fixed, so the examples are rebuilt byte for byte
NODES = 8
_PORT_FILES = ("rate", "state", "phys_state", "link_layer")


def build_node(root: Path) -> Path:
    if root.exists():
        shutil.rmtree(root)
    make_snapshot(root, topo=TOPO, nvml_gpus=hgx_nvml())
    port = need(PUBLIC / "health/ib/gpud-sys-class-infiniband-h100/mlx5_0/ports/1")
    links = {"/sys/class/net/lo": "../../devices/virtual/net/lo"}
    for k in range(8):
        ib = root / f"fs/sys/class/infiniband/mlx5_{k}/ports/1"
        ib.mkdir(parents=True)
        for name in _PORT_FILES:
            (ib / name).write_text((port / name).read_text())
    lo = root / "fs/sys/class/net/lo"
    lo.mkdir(parents=True)
    for name, value in (("type", "772"), ("operstate", "unknown"), ("mtu", "65536"), ("address", "00:00:00:00:00:00")):
        (lo / name).write_text(value + "\n")
    driver = root / "fs/proc/driver/nvidia/version"
    driver.parent.mkdir(parents=True)
    driver.write_text((REPO / "tests/fixtures/h100-vm-1gpu/fs/proc/driver/nvidia/version").read_text())
    (root / "fs-links.json").write_text(json.dumps(links, indent=1) + "\n")
    (root / "identity.json").write_text(json.dumps({"hostname": "hgx-example-01", "kernel": "example (not recorded)",
                                                    "machine": "x86_64", "nodecheck_version": __version__,
                                                    "snapshot_taken_at": TAKEN_AT}, indent=1) + "\n")
    (root / "sources.json").write_text(json.dumps({
        "identity.json": {"outcome": "ok"}, "nvml.json": {"outcome": "ok"},
        "nvidia-smi-topo-m.txt": {"argv": ["nvidia-smi", "topo", "-m"], "outcome": "ok"}}, indent=1) + "\n")
    nvml = json.loads((root / "nvml.json").read_text())
    nvml["asked_by_pid"] = 4000  # the process that read NVML: this build's pid would change the example each time
    (root / "nvml.json").write_text(json.dumps(nvml, indent=1) + "\n")
    return root


def build_job(node: Path) -> dict:
    from nodecheck.assemble.rails import rail_rates, rank_rails
    from nodecheck.bench.distributed import measurement_from_worker
    from nodecheck.bench.nccl_tests import parse_nccl_log
    from nodecheck.config import Config
    from nodecheck.core.pairing import job_bound
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.pipeline import build_report
    from nodecheck.verdicts.bandwidth import with_measurements

    report = build_report(SnapshotHost(node))
    fabric = [n for n in report.nics if n.rdma_device and n.state == "up"]
    members = [{"rank": i * 8 + g.index, "local_rank": g.index, "node": f"hgx-example-{i + 1:02d}", "nic": None,
                "address": f"198.18.0.{i + 1}", "rails": rail_rates(report, rank_rails(report, g, fabric), Config())}
               for i in range(NODES) for g in report.gpus]
    log = parse_nccl_log(need(PUBLIC / "nccl/coreweave-h100-64gpu-ib-sharp-all_reduce_perf-elided.txt").read_text())
    rows = [{"size_bytes": r.size_bytes, "seconds": r.out_of_place.time_us / 1e6, "algbw": r.out_of_place.algbw_gbytes * 1e9,
             "busbw": r.out_of_place.busbw_gbytes * 1e9} for r in log.rows if r.out_of_place]
    result = {"world_size": len(members), "backend": "nccl", "spec_bytes_per_second": job_bound(members), "rows": rows,
              "nodes": members}  # every rank, as the worker gathers them
    measurement = measurement_from_worker(f"allreduce:{len(members)}-ranks", result)
    measurement.details["path_kind"] = "infiniband"  # as bench marks a job over the RDMA rails (distributed.py)
    measurement.details["example"] = ("rows: CoreWeave's published nccl-tests all_reduce_perf over InfiniBand NDR with "
                                      "SHARP (96 H100 ranks by its rows' busbw/algbw, 8 per node, where its README says "
                                      "64), replayed as this 8-node job's; not measured by nodecheck")
    document = with_measurements(report, [measurement], TAKEN_AT + 120, Config()).to_dict()
    document["generated_at"], document["source"] = TAKEN_AT, "examples/hgx-h100-8gpu"
    for probe in document["probes"]:
        probe["duration_seconds"] = 0.0
    return document


def build() -> None:
    build_node(NODE)
    JOB.write_text(json.dumps(build_job(NODE), indent=1) + "\n")
