"""NCCL's failed IB transfers ("NET/IB : Got completion ... with error N" / "with status=N"), as published logs print
them across NCCL's versions (tests/fixtures/nccl-debug/SOURCES.md): one judged finding naming the status, what it
means and the end the failed connections share, instead of each line quoted."""

from helpers import PUBLIC, need
from helpers import nccl_form as text_of
from helpers import nccl_judged_alone as judged

from nodecheck.bench.nccl_debug import parse_nccl_debug
from nodecheck.verdicts.nccl_ib_errors import WC_STATUS
from nodecheck.verdicts.nccl_run import nccl_run_from_details


def only_ib_error(findings):
    assert [f.kind for f in findings] == ["nccl_ib_error"], [f.message for f in findings]  # no line quoted one by one
    return findings[0]


def test_status_12_to_one_peer_across_nccl_versions():
    """NVIDIA/nccl#1405 (status=12 ... (Recv) localGid ...) and #1698 (NET/IB: ... hca mlx5_10): one connection each,
    so either end; the reporting host is read from the IB plugin's "host:pid:tid [dev] file.c:line" head."""
    run, findings = judged(text_of("nccl1405-ib-status12-recv-one-peer.txt"))
    assert run.ib_errors == [{"host": "kp-ddp-worker-0", "peer": "10.216.210.236", "status": 12, "hca": None, "count": 3}]
    assert (run.warning_count, run.ib_error_lines, run.warnings) == (3, 3, [])
    finding = only_ib_error(findings)
    assert (finding.severity, finding.subject) == ("warning", "kp-ddp-worker-0 -> 10.216.210.236")
    assert finding.measured == "status 12 (transport retry counter exceeded) x3"
    assert "cannot reach each other" in finding.message and "nccl#902" in finding.message
    run, findings = judged(text_of("nccl1698-ib-status12-hca-named.txt"))
    assert run.ib_errors == [{"host": "mycl-g2", "peer": "192.168.3.5", "status": 12, "hca": "mlx5_10", "count": 2}]
    assert only_ib_error(findings).subject == "mycl-g2 mlx5_10 -> 192.168.3.5"


def test_flushed_work_is_a_consequence_not_the_cause():
    """NVIDIA/nccl#1814: one status 12, then two status 5 (flushed) on the same connection: 12 is the finding's."""
    _, findings = judged(text_of("nccl1814-ib-status12-then-flushed.txt"))
    finding = only_ib_error(findings)
    assert finding.measured == "status 12 (transport retry counter exceeded) x1"
    assert "then status 5 x2" in finding.message
    flushed_only = "\n".join(line for line in text_of("nccl1814-ib-status12-then-flushed.txt").splitlines()
                             if "status=12" not in line)
    finding = only_ib_error(judged(flushed_only)[1])
    assert finding.measured.startswith("status 5 (Work Request Flushed Error)") and "earlier error" in finding.message


def test_a_local_protection_error_names_the_reporting_node_and_acs():
    """NCCL 2.7.6's lines name no peer (NVIDIA/nccl#707); nccl-tests#252's name the peer by its OOB address, which
    the same job's Bootstrap lines (../shared's capture of its start) tie to kolyoz1. Status 4 is local: kolyoz2."""
    run, findings = judged(text_of("nccl707-ib-error4-no-peer-2.7.txt"))
    assert run.ib_errors == [{"host": "10-90-43-152", "peer": None, "status": 4, "hca": None, "count": 2}]
    finding = only_ib_error(findings)
    assert finding.subject == "10-90-43-152" and "ACS" in finding.message and "nccl#928" in finding.message
    start = need(PUBLIC / "nccl-debug" / "2node-h100-ibext-v8-gdrdma-cumem-nccltests-ngc.txt").read_text()
    run, findings = judged(start + text_of("nccltests252-ib-error4-peer-send.txt"))
    assert run.addresses["10.0.35.1"] == "kolyoz1"
    finding = [f for f in findings if f.kind == "nccl_ib_error"][0]
    assert finding.subject == "kolyoz2" and "10.0.35.1 (kolyoz1)" in finding.message


def test_a_peer_is_named_by_the_bootstrap_line_of_nccl_2_24_on():
    """NCCL 2.24.3 prints "Bootstrap: Using enp3s0:10.42.0.4<0>" (no space before the colon; before: "Bootstrap :
    Using"). nccl-tests#284's two hosts (NCCL 2.25.1): both interfaces and addresses are read, so a failed transfer to
    10.42.0.4 (nccl#1405's line, re-addressed) names agzen-master; before, only the worker's NET/Socket line was."""
    start = text_of("nccltests284-bootstrap-2.25-two-hosts-socket.txt")
    run = parse_nccl_debug(start)
    assert run.socket_ifaces == ["enp3s0", "eno2"]
    assert run.addresses == {"10.42.0.4": "agzen-master", "10.42.0.2": "agzen-worker"}
    failed = text_of("nccl1405-ib-status12-recv-one-peer.txt").replace("10.216.210.236", "10.42.0.4")
    finding = only_ib_error(judged(start + failed.replace("kp-ddp-worker-0:", "agzen-worker:"))[1])
    assert "10.42.0.4 (agzen-master)" in finding.message


def test_the_shared_end_of_many_failed_connections():
    """nccl#1405's lines as two reporters would print them (a second host's copy) name one peer: the peer is the
    common end. One reporter failing with three peers (its lines re-addressed) is itself the common end."""
    lines = text_of("nccl1405-ib-status12-recv-one-peer.txt")
    finding = only_ib_error(judged(lines + lines.replace("kp-ddp-worker-0:", "kp-ddp-worker-1:"))[1])
    assert finding.subject == "peer 10.216.210.236" and "2 hosts failed with the same peer" in finding.message
    spread = "\n".join(line.replace("10.216.210.236", f"10.216.210.{230 + i}") for i, line in enumerate(lines.splitlines()))
    finding = only_ib_error(judged(spread)[1])
    assert finding.subject == "kp-ddp-worker-0" and "failed with 3 peers" in finding.message


def test_the_newest_format_with_status_names():
    """NCCL's newest net_ib.cc prints "status=%s(%d) opcode=%s(%d) vendor_err=%u ... hca %s" (libibverbs' name before
    the number): nccl#1698's line rewritten so."""
    line = text_of("nccl1698-ib-status12-hca-named.txt").splitlines()[0].replace(
        "status=12 opcode=129 len=1048576 vendor err 129", f"status={WC_STATUS[12]}(12) opcode=recv(128) vendor_err=129")
    run, findings = judged(line)
    assert run.ib_errors == [{"host": "mycl-g2", "peer": "192.168.3.5", "status": 12, "hca": "mlx5_10", "count": 1}]
    assert only_ib_error(findings).measured == "status 12 (transport retry counter exceeded) x1"


def test_other_warnings_are_still_quoted_and_counted():
    ib = text_of("nccl1405-ib-status12-recv-one-peer.txt")
    others = "".join(f"h:1:1 [0] NCCL WARN Cuda failure {i} 'out of memory'\n" for i in range(12))
    findings = judged(ib + others)[1]
    assert [f.kind for f in findings].count("nccl_warning") == 10 and findings[0].kind == "nccl_ib_error"
    assert findings[-1].message.endswith("(+2 more NCCL WARN lines)")


def test_a_saved_report_s_ib_errors_are_untrusted():
    good = {"host": "h", "peer": "10.0.0.1", "status": 12, "hca": None, "count": 2}
    assert nccl_run_from_details({"ib_errors": [good], "ib_error_lines": 2}).ib_errors == [good]
    for bad in ([good | {"count": 0}], [good | {"status": "12"}], [good | {"peer": 5}], [good | {"extra": 1}],
                [good] * 65, {"a": good}, [good | {"hca": "x" * 81}]):
        assert nccl_run_from_details({"ib_errors": bad}).ib_errors == []


def test_a_warn_behind_nccl_2_26s_time_stamp_or_with_2_30s_function_is_read():
    """From NCCL 2.26 every WARN line starts with its time (src/debug.cc, NCCL_DEBUG_TIMESTAMP_LEVELS=WARN by default:
    "[2025-07-21 19:05:29] node004:27907:27907 [1] transport/nvls.cc:254 NCCL WARN ...", NVIDIA/nccl#1788), and from
    2.30 its head names the function after file:line ("[%d] %s:%d (%s) NCCL WARN"). No head was read behind either:
    NVIDIA/nccl#1698's IB failures, printed so, read as a log without a failure."""
    plain = text_of("nccl1698-ib-status12-hca-named.txt")
    stamped = "\n".join(f"[2025-08-01 12:00:00] {line}" if "NCCL WARN" in line else line for line in plain.splitlines())
    named = plain.replace(" NCCL WARN", " (ncclIbTest) NCCL WARN")
    assert plain != stamped and plain != named and "transport/net_ib.cc" in plain
    for text in (stamped, named):
        run, findings = judged(text)
        assert run.ib_errors == parse_nccl_debug(plain).ib_errors != [] and run.warnings == []
        assert only_ib_error(findings).measured == "status 12 (transport retry counter exceeded) x2"
