"""NCCL's reading of each GPU's NVLink fabric ("MNNVL busId ... state S healthMask H") and each communicator's MNNVL
decision ("comm ... nNodes N ... MNNVL M"), on published logs (tests/fixtures/nccl-debug/SOURCES.md): healthy GB200 trays,
HGX boards in no multi-node domain, and the same lines changed as a broken node would print them."""

import json
import subprocess
import sys
from dataclasses import asdict

from helpers import NCCL_FORMS as FORMS
from helpers import REPO
from helpers import nccl_form as text_of
from helpers import nccl_judged_alone as judged

from nodecheck.bench.nccl_debug import parse_nccl_debug
from nodecheck.probes.nvml_fabric import health_conditions
from nodecheck.render.bench import nccl_run_lines
from nodecheck.report.model import Report
from nodecheck.verdicts.nccl_run import nccl_findings, nccl_run_from_details

TRAY = "nccl2303-gb200-tray-mnnvl-1-p2p-mnnvl.txt"
FOUR = "nccl1769-gb200-4gpu-fabric-healthmask-0xaa.txt"


def fabric_line(run) -> str:
    return next(line for line in nccl_run_lines(run, [], "this node") if line.startswith("NVLink fabric"))


def test_a_gb200_tray_on_mnnvl_is_read_and_healthy():
    """NVIDIA/nccl#2303 run A: NCCL 2.30.7 on a GB200 tray, its fabric line and `MNNVL 1`, P2P/MNNVL channels."""
    run, findings = judged(text_of(TRAY))
    assert run.fabric == [{"host": "watchtower-navy-cn13", "bus_id": "801000", "uuid": "a44167d15423d758.7d6b24c07d32e7b3",
                           "clique_id": 0x2786, "state": 3, "health_mask": 0xAA}]
    assert run.comm_mnnvl == [[1, 1]] and run.nranks == 4 and run.intra_node_transports == ["P2P/MNNVL"]
    assert findings == []
    assert fabric_line(run) == ("NVLink fabric: 1 GPU on 1 host, NVLink domain a44167d15423d758.7d6b24c07d32e7b3 "
                                "clique 0x2786  (multi-node NVLink: on)")


def test_no_fabric_line_for_a_node_without_one():
    """A g5's log (A10G, no NVLink: ../shared's nccl2234 capture) prints "MNNVL 0" in every communicator line: no
    fabric line, no finding from it."""
    from helpers import PUBLIC, need

    run = parse_nccl_debug(need(PUBLIC / "nccl-debug" / "2node-g5-efa-aws-libfabric-gdr-disabled-nccl2234.txt").read_text())
    assert run.comm_mnnvl == [[2, 0]] and run.fabric == []
    assert not any(line.startswith("NVLink fabric") for line in nccl_run_lines(run, [], "this node"))
    assert not [f for f in nccl_findings(run, Report.from_dict({})) if "mnnvl" in f.kind or "fabric" in f.kind]


def test_mnnvl_off_on_one_node_is_no_finding():
    """nccl#2303 run B: NCCL_MNNVL_ENABLE=0 on one tray. NCCL asks for MNNVL only across nodes (src/init.cc: nNodes > 1)."""
    run, findings = judged(text_of("nccl2303-gb200-tray-mnnvl-enable-0.txt"))
    assert run.comm_mnnvl == [[1, 0]] and run.settings["NCCL_MNNVL_ENABLE"] == "0"
    assert findings == [] and fabric_line(run).endswith("(multi-node NVLink: off)")


def test_health_mask_0xaa_is_healthy_and_the_raised_bits_are_named():
    """NVML_GPU_FABRIC_HEALTH_MASK_*: two bits per condition, 1 raised, 2 not, 0 not reported. 0xaa (nccl#1769's four
    GB200 GPUs; nccl#2186's author read it as "4 of 8 NVL paths degraded") raises none; 0x80 (nccl#1646's DGX B200) none;
    0x11a9 (a GB200 rack whose cross-tray all-reduce hung) degraded bandwidth; 0x9a an unhealthy route."""
    run, findings = judged(text_of(FOUR))
    assert [(e["bus_id"], e["health_mask"]) for e in run.fabric] == [("901000", 0xAA), ("1801000", 0xAA), ("1901000", 0xAA),
                                                                      ("801000", 0xAA)]
    assert findings == [] and {e["clique_id"] for e in run.fabric} == {0x7FFE}
    assert health_conditions(0xAA) == [] and health_conditions(0x80) == [] and health_conditions(0x0) == []
    assert health_conditions(0x11A9) == ["bandwidth degraded"]
    assert health_conditions(0x9A) == ["route unhealthy"]
    run, findings = judged(text_of("nccl1646-dgx-b200-fabric-healthmask-0x80.txt"))
    assert findings == [] and run.fabric[0]["uuid"] is None


def test_boards_in_no_nvlink_domain_are_no_finding_across_nodes():
    """DeepEP#143: an H200 node of a 16-rank job, fabric UUID 0.0 (an NVSwitch board, no multi-node NVLink domain). NCCL
    prints `MNNVL 0` for such a job across nodes, as it must: no finding, even with that line added."""
    text = text_of("deepep143-2x-h200-fabric-uuid-0.txt")
    run, findings = judged(text)
    assert [e["uuid"] for e in run.fabric] == [None] * 4 and run.nranks == 16 and findings == []
    assert "in no multi-node NVLink domain (fabric UUID 0.0)" in fabric_line(run)
    other = text.replace("msm-h200-2", "msm-h200-1").replace("rank 1", "rank ")
    comm = "msm-h200-2:4009:4557 [0] NCCL INFO comm 0x55f70b0f5230 rank 8 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0\n"
    run, findings = judged(text + other + comm)
    assert run.comm_mnnvl == [[2, 0]] and len({e["host"] for e in run.fabric}) == 2 and findings == []


def test_a_log_without_heads_gives_its_fabric_line():
    """nccl#1584: rank 0 of an H100 job under PyTorch, every line without NCCL's head (NCCL 2.24.3): its fabric line
    (UUID 0.0) and its bootstrap interface are read as from a headed log."""
    run, findings = judged(text_of("nccl1584-no-prefix-h100-fabric-uuid-0.txt"))
    assert run.fabric == [{"host": "", "bus_id": "1a000", "uuid": None, "clique_id": 0, "state": 3, "health_mask": 0}]
    assert (run.nccl_version, run.network, run.socket_ifaces) == ("2.24.3", "IBext_v8", ["eth0"])
    assert len(run.ib_devices) == 8 and findings == []


def test_a_gpu_whose_registration_is_not_complete_is_named():
    """nccl#1769's lines with GPU 0x1801000 at state 2 (in progress), as NCCL prints a GPU Fabric Manager has not yet
    registered: an error naming the host and the GPU; NCCL keeps MNNVL off for its communicators, said in the same one."""
    text = text_of(FOUR).replace("0x1801000 fabric UUID 3143b15bc2cd192b.28cc9b5473fb5b93 cliqueId 0x7ffe state 3",
                                 "0x1801000 fabric UUID 3143b15bc2cd192b.28cc9b5473fb5b93 cliqueId 0x7ffe state 2")
    run, findings = judged(text)
    assert [(f.kind, f.severity, f.subject, f.measured) for f in findings] == [
        ("nccl_fabric_not_ready", "error", "gb200a-04", "busId 0x1801000: in progress")]
    assert "multi-node NVLink off" in findings[0].message and "Fabric" in findings[0].message
    assert "1 not registered" in fabric_line(run)


def test_a_raised_health_condition_is_named_by_its_severity():
    """nccl#1769's lines with one GPU's mask raising degraded bandwidth (0xa9: bits 0-1 = 1), then an unhealthy route
    (0x9a: bits 4-5 = 1): a warning, then an error, as the node's own gpu_fabric_unhealthy."""
    for mask, severity, said in (("0xa9", "warning", "bandwidth degraded"), ("0x9a", "error", "route unhealthy")):
        text = text_of(FOUR).replace("0x901000 fabric UUID 3143b15bc2cd192b.28cc9b5473fb5b93 cliqueId 0x7ffe state 3 healthMask 0xaa",
                                     f"0x901000 fabric UUID 3143b15bc2cd192b.28cc9b5473fb5b93 cliqueId 0x7ffe state 3 healthMask {mask}")
        findings = judged(text)[1]
        assert [(f.kind, f.severity, f.subject, f.measured) for f in findings] == [
            ("nccl_fabric_unhealthy", severity, "gb200a-04", said)]
        assert "0x901000" in findings[0].message and f"healthMask {mask}" in findings[0].message


def two_trays(comm: str, second_uuid: str = "a44167d15423d758.7d6b24c07d32e7b3") -> str:
    """nccl#2303 run A as two trays of one domain would print it: the second tray's lines under another host (and, to
    test a job across racks, another domain), each communicator line as NCCL prints it across nodes."""
    tray = text_of(TRAY).replace("nNodes 1", "nNodes 2").replace("nRanks 4", "nRanks 8").replace("MNNVL 1\n", f"{comm}\n")
    other = tray.replace("watchtower-navy-cn13", "watchtower-navy-cn14").replace("a44167d15423d758.7d6b24c07d32e7b3", second_uuid)
    return tray + other


def test_a_job_across_trays_of_one_domain_kept_off_mnnvl_is_named_with_its_cause():
    run, findings = judged(two_trays("MNNVL 1"))
    assert findings == [] and "between nodes: P2P/MNNVL  (GPUDirect RDMA: -)" in nccl_run_lines(run, [], "this node")
    assert "between nodes: -  (GPUDirect RDMA: -)" in nccl_run_lines(parse_nccl_debug(text_of(TRAY)), [], "this node")  # one tray
    cumem_off = two_trays("MNNVL 0").replace("NCCL_CUMEM_ENABLE set by environment to 1.", "NCCL_CUMEM_ENABLE set by environment to 0.")
    run, findings = judged(cumem_off)
    assert run.comm_mnnvl == [[2, 0]]
    assert [(f.kind, f.severity, f.measured, f.expected) for f in findings] == [
        ("nccl_mnnvl_off", "warning", "MNNVL 0 across 2 nodes", "MNNVL 1")]
    assert "NCCL_CUMEM_ENABLE=0" in findings[0].message and "2 hosts" in findings[0].message
    findings = judged(two_trays("MNNVL 0"))[1]
    assert [f.kind for f in findings] == ["nccl_mnnvl_off"] and "IMEX" in findings[0].message


def test_no_mnnvl_finding_across_domains_or_from_one_host():
    """Trays of two racks (two domains) take the network between them by design, and one host's lines cannot say the
    other nodes are in its domain: no finding."""
    assert judged(two_trays("MNNVL 0", second_uuid="3143b15bc2cd192b.28cc9b5473fb5b93"))[1] == []
    one_host = text_of(TRAY).replace("nNodes 1", "nNodes 2").replace("MNNVL 1\n", "MNNVL 0\n")
    assert judged(one_host)[1] == []


def test_the_readings_survive_a_report_and_bad_shapes_do_not():
    run = parse_nccl_debug(two_trays("MNNVL 0"))
    back = nccl_run_from_details(json.loads(json.dumps(asdict(run))))
    assert (back.fabric, back.comm_mnnvl) == (run.fabric, run.comm_mnnvl)
    bad = asdict(run) | {"fabric": [run.fabric[0] | {"extra": 1}], "comm_mnnvl": [[2, "0"]]}
    back = nccl_run_from_details(bad)
    assert (back.fabric, back.comm_mnnvl) == ([], [])


def test_nccl_log_exits_1_on_an_unregistered_gpu_and_0_on_the_published_tray(tmp_path):
    broken = tmp_path / "broken.log"
    broken.write_text(text_of(FOUR).replace("cliqueId 0x7ffe state 3 healthMask 0xaa\n", "cliqueId 0x7ffe state 1 healthMask 0x0\n", 1))
    for path, code in ((FORMS / TRAY, 0), (broken, 1)):
        result = subprocess.run([sys.executable, "-m", "nodecheck", "nccl-log", str(path), "--from", str(REPO / "tests/fixtures/cpu-vm-2core")],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == code, result.stdout + result.stderr
        assert "NVLink fabric:" in result.stdout
    assert "gb200a-04" in result.stdout and "not started" in result.stdout


def test_a_job_that_ran_mnnvl_across_trays_is_bounded_by_nvlink_not_the_rails(tmp_path):
    """CoreWeave's published one-rack GB200 NVL72 all-reduce (72 ranks, 18 trays), with NCCL's lines of a job that ran
    MNNVL across its trays, judged on a tray whose IMEX state is unknown: NCCL's own word puts the job on NVLink
    (no rail spec), where `MNNVL 0` leaves it on the rails (src/init.cc: the communicator line's MNNVL)."""
    from helpers import PUBLIC, need, tray

    from nodecheck.bench.nccl_binary import measurement_from_log
    from nodecheck.bench.nccl_mnnvl import ran_mnnvl_across_nodes
    from nodecheck.bench.nccl_tests import parse_nccl_log

    log = parse_nccl_log(need(PUBLIC / "nccl" / "coreweave-gb200-nvl72-1rack-all_reduce_perf-partial.txt").read_text())
    report = tray(tmp_path, daemon=None, domain=None)
    kinds = {}
    for said in ("MNNVL 1", "MNNVL 0"):
        run = parse_nccl_debug(two_trays(said))
        kinds[said] = measurement_from_log(log, report, "nccl-log", "m", run=run).details["path_kind"]
        assert ran_mnnvl_across_nodes(run) == (said == "MNNVL 1")
    assert kinds["MNNVL 1"] == "nvlink" and kinds["MNNVL 0"] != "nvlink"
    assert not ran_mnnvl_across_nodes(parse_nccl_debug(text_of(TRAY)))  # MNNVL 1 on one tray says nothing across nodes
