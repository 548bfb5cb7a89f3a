"""NCCL failing to set up NVLink SHARP (NVLS) on a node, on published logs (tests/fixtures/nccl-debug/SOURCES.md): one
judged error naming the host and the CUDA error instead of each WARN line quoted, in every head NCCL prints a WARN
with (2.26's time stamp, 2.30's function name), and no finding where NVLS came up or was not offered."""

import json
import subprocess
import sys
from dataclasses import asdict

from helpers import NCCL_FORMS as FORMS
from helpers import REPO
from helpers import nccl_form as text_of
from helpers import nccl_judged_alone as judged

from nodecheck.bench.nccl_debug import parse_nccl_debug
from nodecheck.verdicts.nccl_run import nccl_run_from_details

H800 = "nccl1338-h800-nvls-cuda-failure-1.txt"
STAMPED = "nccl1788-h100-nvls-401-timestamped.txt"


def only_nvls(findings):
    assert [f.kind for f in findings] == ["nccl_nvls_failed"], [f.message for f in findings]  # no line quoted one by one
    return findings[0]


def test_four_ranks_of_an_h800_failing_nvls_are_one_error():
    """NVIDIA/nccl#1338: NCCL 2.21.5 on one H800 node, four ranks' "transport/nvls.cc:158 NCCL WARN Cuda failure 1
    'invalid argument'" (NVIDIA's answer there: Fabric Manager not restarted correctly)."""
    run, findings = judged(text_of(H800))
    assert run.nvls_errors == [{"host": "node2", "code": 1, "error": "invalid argument", "count": 4}]
    assert (run.warning_count, run.nvls_error_lines, run.warnings) == (4, 4, [])
    finding = only_nvls(findings)
    assert (finding.severity, finding.subject, finding.measured) == ("error", "node2", "CUDA error 1 'invalid argument' x4")
    assert "CUDA_ERROR_INVALID_VALUE" in finding.message and "Fabric Manager or NVSwitches" in finding.message
    assert "nvidia-smi -r" in finding.message and "NCCL_NVLS_ENABLE=0" in finding.message


def test_a_warn_line_with_nccl_2_26s_time_stamp_is_read():
    """NVIDIA/nccl#1788: from NCCL 2.26 a WARN line starts with its time ("[2025-07-21 19:05:29] node004:..."), which no
    head was read behind: the line was lost, and the job's failure read as nothing wrong."""
    run, findings = judged(text_of(STAMPED))
    assert run.nodes == ["node004"] and run.warning_count == 1
    finding = only_nvls(findings)
    assert (finding.subject, finding.measured) == ("node004", "CUDA error 401 'the operation cannot be performed in the present state' x1")
    assert "CUDA_ERROR_ILLEGAL_STATE" in finding.message


def test_warn_lines_behind_kubectls_or_dockers_time_stamps_are_read():
    """`kubectl logs --timestamps` and `docker logs -t` put an RFC 3339 time before every line, before NCCL 2.26's own
    stamp where it has one: NVIDIA/nccl#1338's and #1788's lines so."""
    for name, pre in ((H800, "2024-07-03T10:00:00.123456789Z "), (STAMPED, "2025-07-21T19:05:29.000000001+00:00 ")):
        text = "\n".join(pre + line if line.strip() else line for line in text_of(name).splitlines())
        run, findings = judged(text)
        assert run.nvls_errors == judged(text_of(name))[0].nvls_errors != [] and only_nvls(findings).severity == "error"


def test_nccl_2_30s_head_with_the_function_and_the_bind_failure():
    """NCCL 2.30 names the function after file:line in a WARN head (src/debug.cc: "[%d] %s:%d (%s) NCCL WARN"), and
    nvlsAllocateMem's own words for a failed bind run over three lines (src/transport/nvls.cc)."""
    text = ("[2026-08-10 10:37:28] h100-a:2736:2736 [0] transport/nvls.cc:379 (nvlsAllocateMem) NCCL WARN Failed to bind "
            "NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 802 'system not yet initialized'.\n"
            "This is usually caused by a system or configuration error in the Fabric Manager or NVSwitches.\n"
            "Disable NVLS (NCCL_NVLS_ENABLE=0) if you wish to avoid this error in the future.\n"
            "h100-a:2736:2736 [0] NCCL INFO transport/nvls.cc:558 (ncclNvlsSetup) -> 1\n")
    run, findings = judged(text)
    assert run.nvls_errors == [{"host": "h100-a", "code": 802, "error": "system not yet initialized", "count": 1}]
    assert "CUDA_ERROR_SYSTEM_NOT_READY" in only_nvls(findings).message
    # before NCCL 2.19 CUCHECK printed no number ("Cuda failure 'invalid argument'"); the bind words need no head
    older = judged(text_of(H800).replace("Cuda failure 1 'invalid", "Cuda failure 'invalid"))[1]
    assert only_nvls(older).measured == "CUDA error 'invalid argument' x4"
    bare = judged(text.split("\n", 1)[0].split("] ", 1)[1].replace("h100-a:2736:2736 [0] transport/nvls.cc:379 "
                                                                    "(nvlsAllocateMem) ", "h100-a:2736:2736 [0] "))[1]
    assert only_nvls(bare).subject == "h100-a"


def test_warn_lines_behind_a_launchers_prefix_are_read():
    """NVIDIA/nccl#1029: every line behind pdsh's "host: ", the WARN's head after it; and #1788's line behind Ray's
    and vLLM's worker prefixes. Before, a WARN's head was read only at the start of the line: these were lost."""
    run, findings = judged(text_of("nccl1029-pdsh-prefix-nvls-initialization-error.txt"))
    assert run.nvls_errors == [{"host": "rdma-test-gpu-worker-1", "code": None, "error": "initialization error", "count": 1}]
    assert only_nvls(findings).subject == "rdma-test-gpu-worker-1" and run.nvls is False
    for prefix in ("(RayWorkerWrapper pid=2981, ip=169.254.28.198) ", "(VllmWorker rank=1 pid=2345) ",
                   "(EngineCore_DP0 pid=2301) (RayWorkerWrapper pid=2981, ip=169.254.28.198) "):
        text = "\n".join(prefix + line for line in text_of(STAMPED).splitlines())
        assert judged(text)[0].nvls_errors == judged(text_of(STAMPED))[0].nvls_errors != []


def test_other_warnings_of_the_nvls_file_stay_quoted():
    """NCCL_NVLS_ENABLE=1 with two ranks on one GPU (src/transport/nvls.cc) is the job's usage, not the node's fault."""
    line = ("host-a:1:1 [0] transport/nvls.cc:254 NCCL WARN NCCL_NVLS_ENABLE has been set to \"1\" and communicator has "
            "multiple ranks using the same NVML device. This is not compatible with NCCL_NVLS_ENABLE=1.\n")
    run, findings = judged(line)
    assert run.nvls_errors == [] and [f.kind for f in findings] == ["nccl_warning"]


def test_nvls_that_came_up_or_was_not_offered_is_no_finding():
    """NVIDIA/nccl#1646's DGX B200 and #1584's H100 ("NVLS multicast support is available"), and "... is not available"
    on four GPUs of one node (NCCL's own choice: NVLS needs NVSwitch 3 and Hopper, NCCL's NCCL_NVLS_ENABLE docs)."""
    for name in ("nccl1646-dgx-b200-fabric-healthmask-0x80.txt", "nccl1584-no-prefix-h100-fabric-uuid-0.txt"):
        run, findings = judged(text_of(name))
        assert run.nvls_errors == [] and "nccl_nvls_failed" not in [f.kind for f in findings]
    run, findings = judged("".join(f"ng30903:3063025:3066048 [{d}] NCCL INFO NVLS multicast support is not available on dev {d}\n"
                                   for d in range(4)))
    assert run.nvls is False and findings == []


def test_the_records_survive_a_report_and_bad_shapes_do_not():
    run = parse_nccl_debug(text_of(H800))
    back = nccl_run_from_details(json.loads(json.dumps(asdict(run))))
    assert (back.nvls_errors, back.nvls_error_lines) == (run.nvls_errors, 4)
    for bad in ({"extra": 1}, {"code": "1"}, {"count": 0}, {"error": "x" * 81}):
        assert nccl_run_from_details(asdict(run) | {"nvls_errors": [run.nvls_errors[0] | bad]}).nvls_errors == []


def test_nccl_log_exits_1_on_the_h800_log(tmp_path):
    """As written, and compressed as a job's logs are kept (gzip, xz: read as kernel-log reads its logs)."""
    import gzip
    import lzma

    (tmp_path / "nccl.log.gz").write_bytes(gzip.compress((FORMS / H800).read_bytes()))
    (tmp_path / "nccl.log.xz").write_bytes(lzma.compress((FORMS / H800).read_bytes()))
    for path in (tmp_path / "nccl.log.gz", tmp_path / "nccl.log.xz"):
        result = subprocess.run([sys.executable, "-m", "nodecheck", "nccl-log", str(path)], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 1 and "node2" in result.stdout, result.stdout + result.stderr
    result = subprocess.run([sys.executable, "-m", "nodecheck", "nccl-log", str(FORMS / H800), "--from",
                             str(REPO / "tests/fixtures/cpu-vm-2core")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "(NVLS: failed to set up)" in result.stdout
    assert "error: NCCL could not set up NVLink SHARP (NVLS) multicast on node2" in result.stdout
