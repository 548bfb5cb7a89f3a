"""A saved Report read back: `inspect --from REPORT.json` shows it as judged when written (a job's rank 0 prints one
for the whole job; a support ticket carries one), `scale --from` and `fleet` read it with the same reader, which
refuses whatever is not a Report, and takes a Report of any size a job writes."""

from __future__ import annotations

import dataclasses
import json

from helpers import REPO, cli, make_measurement

from nodecheck.findings import Finding
from nodecheck.model import Report

JOB = REPO / "examples" / "job-8node-allreduce.json"
NODE = REPO / "examples" / "hgx-h100-8gpu"


def _job() -> dict:
    return json.loads(JOB.read_text())


def test_a_jobs_saved_report_is_shown_with_its_bandwidth_table_as_judged_then(tmp_path):
    out = cli("inspect", "--from", str(JOB))
    assert out.returncode == 0, out.stderr
    assert f"a saved Report ({JOB}), written 2026-11-24 06:00:00 UTC: shown as it was judged then" in out.stdout
    row = next(line for line in out.stdout.splitlines() if "allreduce:64-ranks" in line)
    assert "3.09248 Tbit/s" in row and "0.97" in row  # the figure and ratio the job measured, not measured again
    assert out.stdout.index("Bandwidth") < out.stdout.index("No findings.") < out.stdout.index("Binding advice")
    # its findings as the job's node judged them: an error there fails here, whatever this machine is
    document = _job()
    document["findings"] = [dataclasses.asdict(Finding("bandwidth_below_spec", "error", "node3 (10.0.0.4)", "0.41", ">= 0.7",
                                                       "allreduce:64-ranks allreduce 1.3 Tbit/s = 0.41 of spec 3.2 Tbit/s"))]
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps(document))
    out = cli("inspect", "--from", str(failing))
    assert out.returncode == 1 and "0.41 of spec" in out.stdout, out.stdout + out.stderr


def test_json_gives_the_saved_report_back_in_todays_shape():
    out = cli("inspect", "--from", str(JOB), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == Report.from_dict(_job()).to_dict()


def test_what_is_not_a_report_is_refused_naming_the_file_and_why(tmp_path):
    cases = {
        "fleet.json": ('{"schema": "nodecheck.fleet", "groups": []}', "its schema is 'nodecheck.fleet', not 'nodecheck.report'"),
        "bare.json": ('{"node": {"hostname": "x"}, "gpus": []}', "it has no schema"),  # leniently read: an empty node
        "cut.json": ('{"schema": "nodecheck.report", "gpus": [', "Expecting value"),
        "bytes.json": (b'{"schema": "nodecheck.report", "source": "\xff"}', "can't decode byte 0xff"),
        "nan.json": ('{"schema": "nodecheck.report", "generated_at": NaN}', "NaN is not a number JSON allows"),
        "shape.json": ('{"schema": "nodecheck.report", "gpus": [{"name": "x"}]}', "Gpu.index: missing"),
    }
    for name, (text, why) in cases.items():
        path = tmp_path / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        out = cli("inspect", "--from", str(path))
        assert out.returncode == 2 and f"nodecheck: {path}: not a nodecheck Report: " in out.stderr and why in out.stderr, \
            (name, out.stdout, out.stderr)
        assert not out.stdout
    out = cli("scale", "--params", "7B", "--step-time", "1", "--from", str(tmp_path / "fleet.json"))
    assert out.returncode == 2 and "its schema is 'nodecheck.fleet'" in out.stderr


def test_a_large_jobs_report_is_read_whole(tmp_path):
    """A 256-node job's Report holds every node's in-node figures (node17/gpu3:host h2d and d2h): 1.5 MB here,
    which `scale` refused as a config file larger than 1 MiB. It reads to the 16 MiB every Report document may be."""
    document = _job()
    copy = dataclasses.asdict(make_measurement("gpu0:host", "h2d", 52e9, 63e9, 1 << 28, "cuda events", "unidirectional",
                                               {"path_kind": "pcie", "threshold": 0.8}))
    document["measurements"] += [dict(copy, path=f"node{n}/gpu{g}:host", test=test)
                                 for n in range(256) for g in range(8) for test in ("h2d", "d2h")]
    path = tmp_path / "job-256-nodes.json"
    path.write_text(json.dumps(document))
    assert path.stat().st_size > 1 << 20
    out = cli("scale", "--params", "7B", "--step-time", "1.5", "--from", str(path), "--nodes", "4", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["fabric"]["source"].startswith("measured: allreduce:64-ranks")
    shown = cli("inspect", "--from", str(path))
    assert shown.returncode == 0 and "node255/gpu7:host" in shown.stdout, shown.stderr


def test_an_infiniband_hca_without_a_netdev_shows_its_port_rate():
    """An HCA in InfiniBand mode has no netdev speed: its NIC row said "speed unknown" beside a 400 Gbit/s spec."""
    out = cli("inspect", "--from", str(NODE))
    rows = [line for line in out.stdout.splitlines() if line.startswith(" mlx5_")]
    assert len(rows) == 8 and all("400 Gb/sec" in row and "unknown  400" not in row for row in rows), rows
