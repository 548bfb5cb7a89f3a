"""nccl-tests' own data check (-c 1): the #wrong rows and the 'Out of bounds values' line of published logs that
failed it are an error whatever their speed; the `error` column of versions before 2.13 (a rounding difference) and
healthy published runs are not. Rows with per-iteration columns (-I 1), a timestamp (-S 1) or MPICH's rank tags
read as plain rows."""

import json
import re

import pytest
from helpers import PUBLIC, REPO, json_report, need, nodecheck

from nodecheck.bench.collective_rows import collective_name, ranks_from_rows
from nodecheck.bench.nccl_binary import measurement_from_log
from nodecheck.bench.nccl_tests import failed_check, parse_nccl_log
from nodecheck.config import Config
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.verdicts.bandwidth import measurement_findings

FIXTURES = REPO / "tests" / "fixtures" / "nccl-tests"
HGX = REPO / "examples" / "hgx-h100-8gpu"


def _log(name: str):
    return parse_nccl_log((FIXTURES / name).read_text())


def _findings(log, name="nccl-log"):
    report = build_report(SnapshotHost(HGX))
    measurement = measurement_from_log(log, report, "nccl-log", "a saved log", name=name)
    return [f for f in measurement_findings([measurement], Config()) if f.kind == "bench_wrong_result"]


def test_wrong_elements_in_a_row_are_an_error():
    """NVIDIA/nccl#1184: at 512 KiB both halves' #wrong read 237858 and 238038 (summed over the ranks)."""
    log = _log("nccl1184-dgx-h100-bond0-proto-simple-wrong.txt")
    assert (log.check_column, log.out_of_bounds) == ("#wrong", None)  # the paste stops before the footer
    check = failed_check(log)
    assert check["wrong_elements"] == 237858 + 238038
    assert check["wrong_rows"] == [{"size_bytes": 524288, "wrong_elements": 475896}]
    (finding,) = _findings(log)
    assert (finding.severity, finding.measured) == ("error", "475896 wrong")
    assert "475896 wrong elements in 1 row from 512 KiB" in finding.message


def test_the_cli_fails_a_log_whose_check_failed():
    path = FIXTURES / "nccl1184-dgx-h100-bond0-proto-simple-wrong.txt"
    result = nodecheck("bench", "--nccl-log", str(path), "--from", str(HGX), "--json")
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert [f["kind"] for f in out["findings"]] == ["bench_wrong_result"]
    assert out["measurement"]["details"]["data_check"]["wrong_elements"] == 475896
    human = nodecheck("bench", "--nccl-log", str(path), "--from", str(HGX))
    assert human.returncode == 1
    assert "nccl-tests' data check: Out of bounds values: not in the log; #wrong 475896 at 524288 B" in human.stdout
    assert "error: nccl_tests on nccl-log returned wrong data" in human.stdout  # said though no spec bounds the log


def test_out_of_bounds_failed_in_a_table_without_hashes():
    """nccl-tests#37: all_gather at 129 GB/s on 8 V100, its footer without '#' says 2 FAILED; its `error` column (1e+00)
    is a difference, not a count."""
    log = _log("nccltests37-dgx1-v100-all_gather-4g-out-of-bounds-failed.txt")
    assert (log.check_column, log.out_of_bounds, log.avg_busbw_gbytes) == ("error", 2, 128.942)
    assert failed_check(log)["wrong_elements"] == 0
    (finding,) = _findings(log)
    assert finding.measured == "2 wrong" and "'Out of bounds values : 2 FAILED'" in finding.message
    # its busbw is its algbw, as nccl-tests wrote all-gather's before 2020: no rank count in it, not a 12,906-rank job
    assert ranks_from_rows(log, "all_gather") is None
    measurement = measurement_from_log(log, build_report(SnapshotHost(HGX)), "nccl-log", "a log", name="all_gather_perf")
    assert "across_nodes" not in measurement.details and measurement.spec_bytes_per_second == 450e9


@pytest.mark.parametrize("name", ["nccltests176-128gpu-all_reduce-error-column-1e-06.txt",
                                  "npkit19-4x-rtx2080ti-all_reduce-error-column-3e-08.txt"])
def test_the_old_error_column_is_rounding_not_wrong_data(name):
    """Before 2.10 the column held the largest relative difference: 1e-06 on a healthy 128-GPU run (nccl-tests#52)."""
    log = _log(name)
    assert log.check_column == "error" and any(r.out_of_place.wrong for r in log.rows)
    assert failed_check(log) is None and _findings(log) == []


def test_published_healthy_runs_pass_the_check():
    folder = need(PUBLIC / "nccl")
    for path in sorted(folder.glob("*.txt")):
        log = parse_nccl_log(path.read_text())
        assert failed_check(log) is None, path.name
        said = re.findall(r"Out of bounds values : (\d+) (\w+)", path.read_text())
        assert log.out_of_bounds == (sum(int(n) for n, _ in said) if said else None), path.name
        assert all(word == "OK" for _, word in said)


def test_a_row_cut_after_its_out_of_place_half_keeps_its_count():
    """A row cut before its in-place half still carries the out-of-place #wrong (its root column places it); a
    root-less row cut the same way is not read for a count: its last cell may be the in-place time."""
    lines = (FIXTURES / "nccl1184-dgx-h100-bond0-proto-simple-wrong.txt").read_text().splitlines()
    cut = "\n".join(lines[:3] + [lines[-1][:lines[-1].index("237858") + 6]])
    assert failed_check(parse_nccl_log(cut))["wrong_elements"] == 237858
    rootless = "\n".join(lines[:3] + ["      524288        131072     float     sum    663.1    0.79    0.79      0    19189"])
    log = parse_nccl_log(rootless)
    assert log.rows[0].partial and failed_check(log) is None


def test_json_report_check():
    row = {"size": 524288, "count": 131072, "type": "float", "redop": "sum", "root": -1,
           "out_of_place": {"time": 663.1, "alg_bw": 0.79, "bus_bw": 0.79, "nwrong": 237858.0},
           "in_place": {"time": 569.4, "alg_bw": 0.92, "bus_bw": 0.92, "nwrong": 238038.0}}
    log = parse_nccl_log(json_report([row], out_of_bounds=2))
    assert log.out_of_bounds == 2 and failed_check(log)["wrong_elements"] == 475896
    healthy = dict(row, out_of_place=dict(row["out_of_place"], nwrong=0.0), in_place=dict(row["in_place"], nwrong=None))
    assert failed_check(parse_nccl_log(json_report([healthy]))) is None
    hostile = dict(row, out_of_place=dict(row["out_of_place"], nwrong="many"))
    assert parse_nccl_log(json_report([hostile], out_of_bounds=True)).out_of_bounds is None  # a bool is no count


def test_a_saved_report_with_a_hostile_check_is_not_believed():
    report = build_report(SnapshotHost(HGX))
    measurement = measurement_from_log(_log("nccl1184-dgx-h100-bond0-proto-simple-wrong.txt"), report, "nccl-log", "a log")
    for check in ({"wrong_elements": "475896"}, {"wrong_elements": True}, {"out_of_bounds": -3}, "FAILED", None,
                  {"wrong_elements": 0, "out_of_bounds": 0, "wrong_rows": [{"size_bytes": "x"}]}):
        measurement.details["data_check"] = check
        assert [f for f in measurement_findings([measurement], Config()) if f.kind == "bench_wrong_result"] == []
    measurement.details["data_check"] = {"wrong_elements": 7, "wrong_rows": [{"size_bytes": "x"}, 3]}
    (finding,) = [f for f in measurement_findings([measurement], Config()) if f.kind == "bench_wrong_result"]
    assert "found 7 wrong elements:" in finding.message  # rows it cannot read are left out of the words


# Rows of nccl-tests#287's healthy 4x RTX 5090 all-reduce, then the same rows as nccl-tests 2.17 (-S 1: "%21s" of
# "%Y-%m-%d %H:%M:%S" after the in-place half) and 2.19 (-I 1: "  %7s" x4 after each half) print them (src/util.cu
# writeBenchmarkLineBody, writePerIterReport, writeTimestamp, writeResultHeader).
HEALTHY = "4x-rtx5090-genoa-no-p2p-all_reduce_perf-nccltests287.txt"


def _table(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"\s+\d+\s+\d+\s+float", line)]


def test_rows_with_a_timestamp_read_as_the_plain_rows():
    text = need(PUBLIC / "nccl" / HEALTHY).read_text()
    plain = parse_nccl_log(text)
    stamped = parse_nccl_log("\n".join(f"{line}{'2026-07-09 16:03:21':>21}" if line in _table(text) else line
                                       for line in text.splitlines()))
    assert stamped.rows == plain.rows and not stamped.issues


def test_rows_with_per_iteration_columns_read_as_the_plain_rows():
    text = need(PUBLIC / "nccl" / HEALTHY).read_text()
    plain = parse_nccl_log(text)
    per_iteration = "  " + "  ".join(f"{v:>7}" for v in ("130.2", "151.9", "150.8", "3.1"))
    header = ("#        size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99"
              "    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%")
    out = []
    for line in text.splitlines():
        if line in _table(text):
            cells = line.split()
            half = len(cells) - 8
            line = " ".join(cells[:half + 4]) + per_iteration + " " + " ".join(cells[half + 4:]) + per_iteration
        out.append(header if " busbw " in line and line.startswith("#") else line)
    read = parse_nccl_log("\n".join(out))
    assert read.columns_per_half == 8 and read.rows == plain.rows
    wrong = "\n".join(out).replace(" 0" + per_iteration, " 5" + per_iteration, 1)
    assert failed_check(parse_nccl_log(wrong))["wrong_elements"] == 5


def test_alltoallv_is_not_judged_as_alltoall():
    """alltoallv (nccl-tests 2.18.5) sends unevenly by design: busbw of its busiest rank, bounded by no link."""
    assert (collective_name("alltoallv_perf"), collective_name("alltoall_perf.txt")) == ("alltoallv", "alltoall")
    report = build_report(SnapshotHost(HGX))
    log = parse_nccl_log(need(PUBLIC / "nccl" / "superbench-8x-a100-sxm4-40gb-alltoall_perf.txt").read_text())
    as_v = measurement_from_log(log, report, "nccl-log", "a log", name="alltoallv_perf.txt")
    assert as_v.spec_bytes_per_second is None and "alltoallv" in as_v.details["spec_basis"]
    assert measurement_from_log(log, report, "nccl-log", "a log", name="alltoall_perf.txt").spec_bytes_per_second


def test_mpich_rank_tags_mid_line_and_a_run_slow_before_its_plateau():
    """NVIDIA/nccl#1453: MPICH's -prepend-rank writes "[0]" before each write, so mid-row too; its rows say 24 ranks
    (busbw/algbw = 2 x 23/24) and 5.3 GB/s at 512 MiB. Judged across 3 HGX H100 nodes (eight 400G rails each): below
    the 1 GiB where busbw levels off, yet 0.01 of the bound, where a healthy run reads 0.38 of its level by 256 MiB."""
    log = _log("nccl1453-24-h100-mpich-prepend-rank-slow.txt")
    assert [r.size_bytes for r in log.rows][::9] == [1048576, 536870912] and len(log.rows) == 10
    assert log.rows[-1].out_of_place.busbw_gbytes == 5.31 and log.rows[-1].in_place.busbw_gbytes == 5.33
    assert ranks_from_rows(log, "all_reduce") == (24, 24)
    assert len(log.issues) == 1 and "line 1" in log.issues[0]  # the tail of a row split by NCCL's lines: said, not read
    result = nodecheck("bench", "--nccl-log", str(FIXTURES / "nccl1453-24-h100-mpich-prepend-rank-slow.txt"), "--from",
                       str(HGX), "--nodes", "3", "--json")
    assert result.returncode == 1, result.stderr
    (finding,) = json.loads(result.stdout)["findings"]
    assert (finding["kind"], finding["severity"], finding["measured"]) == ("bandwidth_below_spec", "error", "0.01")
    assert "slow even for its payload" in finding["message"] and "near 0.03 of spec" in finding["message"]
