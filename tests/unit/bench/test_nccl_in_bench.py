"""bench runs NCCL with NCCL_DEBUG=INFO (INIT,NET) and keeps what NCCL chose with each measurement: from
the debug lines all_reduce_perf mixes into its table, and from the files NCCL_DEBUG_FILE gives every rank
of nodecheck's own NCCL all-reduce. No NCCL runs here: the stand-ins print or write what real NCCL printed
on other nodes (../shared/captures/public/nccl-debug), and the findings are judged as on a live node."""

import dataclasses
import json
import os

from helpers import PUBLIC, hgx_h100_with_ndr, need

from nodecheck.bench import distributed, plan
from nodecheck.bench.nccl_debug import DEBUG_SUBSYS, debug_env, read_debug_files
from nodecheck.config import Config
from nodecheck.report.model import Report
from nodecheck.verdicts.bandwidth import with_measurements

NO_GDR = PUBLIC / "nccl-debug" / "2node-a100-ib-no-gdr-p2p-direct-pointer-read.txt"
TABLE = PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-all_reduce_perf.txt"


def test_the_debug_environment():
    env = debug_env({"PATH": "/bin", "NCCL_DEBUG_FILE": "/tmp/x"})
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"], "NCCL_DEBUG_FILE" in env) == ("INFO", DEBUG_SUBSYS, False)
    assert debug_env({"NCCL_DEBUG": "TRACE"}, "/d") == {"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_FILE": "/d/nccl-debug.%h.%p.log",
                                                        "NCCL_TOPO_DUMP_FILE": "/d/nccl-topo.xml"}


def test_nccl_tests_output_keeps_what_nccl_chose(tmp_path):
    """all_reduce_perf's stand-in prints a published NCCL debug log, then a published table, and records
    the NCCL_* variables it was given; the measurement carries the transports, and the Report names the
    missing GPUDirect RDMA on an HGX node with NDR rails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "all_reduce_perf").write_text(
        f'#!/bin/sh\nenv | grep ^NCCL_ | sort > {tmp_path}/env\ncat {need(NO_GDR)} {need(TABLE)}\n')
    (bin_dir / "all_reduce_perf").chmod(0o755)
    report = hgx_h100_with_ndr(tmp_path)
    (m,) = plan.run(report, Config(), ["nccl_tests"], "quick", 30, {"PATH": f"{bin_dir}:/usr/bin:/bin"}, None)
    given = (tmp_path / "env").read_text().split()
    assert m.ok and given[:2] == ["NCCL_DEBUG=INFO", f"NCCL_DEBUG_SUBSYS={DEBUG_SUBSYS}"]
    assert len(given) == 3 and given[2].startswith("NCCL_TOPO_DUMP_FILE=") and given[2].endswith("/nccl-topo.xml")
    assert (m.details["nccl"]["gdr"], m.details["nccl"]["inter_node_transports"]) == (False, ["NET/IB/0", "NET/IB/1", "NET/IB/2", "NET/IB/3"])
    judged = with_measurements(report, [m], 0.0, Config())
    assert [f.kind for f in judged.findings if f.kind.startswith("nccl_")] == ["nccl_no_gdr"]
    again = Report.from_dict(json.loads(json.dumps(judged.to_dict())))  # `inspect --json` read back: the same
    assert with_measurements(again, again.measurements, 0.0, Config()).findings[-1].kind == "nccl_no_gdr"


def test_every_rank_of_the_node_allreduce_writes_its_debug_file(tmp_path, monkeypatch):
    """The worker's stand-in writes where NCCL_DEBUG_FILE says (%h host, %p pid), as NCCL does, and returns
    a result; the files are read (and removed with their directory) before the measurement is returned. Each
    rank is handed its NVML GPU's UUID, as the across-nodes ranks are."""
    report = hgx_h100_with_ndr(tmp_path)
    lines = need(NO_GDR).read_text().splitlines()
    seen, uuids = [], {}

    def worker(argv, out, timeout, env=None, what=""):
        rank = int(env["RANK"])
        path = env["NCCL_DEBUG_FILE"].replace("%h", "node1").replace("%p", str(1000 + rank))
        with open(path, "w") as f:
            f.write("\n".join(lines[rank::8]) + "\n")  # each rank wrote part of the log
        seen.append(os.path.dirname(path))
        uuids[rank] = argv[argv.index("--gpu-uuid") + 1]
        return {"rows": [{"size_bytes": 1 << 30, "busbw": 380e9, "seconds": 0.01}], "nodes": [], "world_size": 8}

    monkeypatch.setattr(distributed, "run_worker", worker)
    m = distributed.node_allreduce(report, "quick", 30, {"PATH": "/usr/bin:/bin"})
    assert m.ok and m.details["nccl"]["gdr"] is False and len(seen) == 8
    assert uuids == {g.index: g.uuid for g in report.gpus}  # each rank names its NVML GPU, not only a CUDA ordinal
    assert not os.path.exists(seen[0])
    assert "nccl_no_gdr" in [f.kind for f in with_measurements(report, [m], 0.0, Config()).findings]


def test_debug_files_are_read_bounded_and_garbage_is_no_run(tmp_path, monkeypatch):
    from nodecheck.bench import nccl_debug

    (tmp_path / "nccl-debug.a.1.log").write_text("not NCCL\n")
    assert read_debug_files(tmp_path) is None and read_debug_files(tmp_path / "absent") is None
    (tmp_path / "nccl-debug.b.2.log").write_text(need(NO_GDR).read_text())
    monkeypatch.setattr(nccl_debug, "MAX_COMMAND_OUTPUT", 64)  # the second file is past what is left: skipped
    assert read_debug_files(tmp_path) is None


def test_a_hostile_nccl_detail_is_ignored(tmp_path):
    report = hgx_h100_with_ndr(tmp_path)
    m = dataclasses.replace(plan_measurement(), details={"nccl": {"inter_node_transports": [1, 2], "gdr": "no",
                                                                   "gpu_net_devices": {"h": {"0": ["x"]}}, "warnings": "x"}})
    assert [f for f in with_measurements(report, [m], 0.0, Config()).findings if f.kind.startswith("nccl_")] == []


def plan_measurement():
    from nodecheck.report.model import Measurement

    return Measurement.measured("allreduce:node-8-gpus", "allreduce", 380e9, 400e9, 1 << 30, "nccl", "busbw", {})
