"""A saved Report read back: `inspect --from REPORT.json` shows it as judged when written (a job's rank 0 prints one
for the whole job; a support ticket carries one), `scale --from` and `fleet` read it with the same reader, which
refuses whatever is not a Report, and takes a Report of any size a job writes; `config check --from` judges its
facts again with another config, or every Report of a sweep's directory."""

from __future__ import annotations

import dataclasses
import json

from helpers import REPO, cli, make_measurement

from nodecheck.cli.app import load_report
from nodecheck.report.findings import Finding
from nodecheck.report.model import Report

JOB = REPO / "examples" / "job-8node-allreduce.json"
NODE = REPO / "examples" / "hgx-h100-8gpu"


def _job() -> dict:
    return json.loads(JOB.read_text())


def test_a_jobs_saved_report_is_shown_with_its_bandwidth_table_as_judged_then(tmp_path):
    out = cli("inspect", "--from", str(JOB))
    assert out.returncode == 0, out.stderr
    assert f"a saved Report ({JOB}), written 2026-11-24 06:00:00 UTC: shown as it was judged then" in out.stdout
    row = next(line for line in out.stdout.splitlines() if "allreduce:64-ranks" in line)
    assert "386.6 GB/s" in row and "0.97" in row  # the figure and ratio the job measured, not measured again
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


def test_a_port_rate_holding_markup_is_shown_as_written(tmp_path):
    """Found by the whole-snapshot fuzzer: a port's `rate` file read "400[/] Gb/sec" and `inspect` ended in rich's
    MarkupError, the NIC row's speed cell being the one not made plain text."""
    import shutil

    snap = tmp_path / "node"
    shutil.copytree(NODE, snap, symlinks=True)
    (snap / "fs/sys/class/infiniband/mlx5_3/ports/1/rate").write_text("400[/] Gb/sec [bold]x[/bold] (4X NDR)")
    out = cli("inspect", "--from", str(snap))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-1000:]
    assert "400[/] Gb/sec [bold]x[/bold]" in out.stdout.replace("\n", ""), out.stdout


def _node_and_configs(tmp_path):
    """Recorded nodes (the example HGX node, this project's H100 VM assembled from its captures, the CPU VM the
    suite was first written on), each with no config, the config `config init` writes for it, and that config
    with a typo (80 GPUs) that fails the node."""
    from helpers import h100_node_snapshot

    from nodecheck.config.init import generate

    nodes = [NODE, h100_node_snapshot(tmp_path / "h100"), REPO / "tests/fixtures/cpu-vm-2core"]
    for snapshot in nodes:
        report, _ = load_report(snapshot, None)
        written = tmp_path / f"{snapshot.name}.toml"
        written.write_text(generate(report))
        typo = tmp_path / f"{snapshot.name}-typo.toml"
        typo.write_text(written.read_text().replace("count = ", "count = 8", 1))
        yield snapshot, [None, written, typo]


def test_a_saved_report_judged_again_gets_what_the_node_got(tmp_path):
    """`config check --from REPORT.json` judges a Report's facts again: for the same config it must find what the
    node found when it was probed (the same findings, path specs and advice), or it checks a config against
    something other than the node."""
    from nodecheck.pipeline import judged_again

    compared = 0
    for snapshot, configs in _node_and_configs(tmp_path):
        for path in configs:
            live, config = load_report(snapshot, path)
            saved = Report.from_dict(json.loads(json.dumps(live.to_dict())))
            again = judged_again(saved, config)
            shown = [(f.kind, f.severity, f.subject, f.message) for f in live.findings]
            assert [(f.kind, f.severity, f.subject, f.message) for f in again.findings] == shown, (snapshot, path)
            assert again.paths == live.paths and again.advice == live.advice, (snapshot, path)
            compared += bool(shown)
    assert compared >= 3  # the typo at least fails each node: the comparison had findings to compare


def test_config_check_judges_every_report_of_a_sweep_and_names_the_nodes_it_would_drain(tmp_path):
    """A config checked against one known-good node passes where it fits that node; checked against the Reports a
    sweep wrote (one per node), it names each node the prolog would drain with it."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    node = json.loads(cli("inspect", "--from", str(NODE), "--json").stdout)
    for name, narrow in (("hgx-01", None), ("hgx-02", 3), ("hgx-03", None)):
        document = json.loads(json.dumps(node))
        document["node"]["hostname"] = name
        if narrow is not None:  # this node's gpu3 trained at x8: its own Report says so
            document["gpus"][narrow]["pcie"]["width_current"] = 8
        (sweep / f"{name}.json").write_text(json.dumps(document))
    (sweep / "fleet.json").write_text('{"schema": "nodecheck.fleet"}')
    config = tmp_path / "hgx.toml"
    assert cli("config", "init", "--from", str(NODE), "-o", str(config)).returncode == 0
    out = cli("config", "check", str(config), "--from", str(sweep))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "hgx-02 (hgx-02.json): the prolog would drain it: nodecheck: gpu3 PCIe x8 < x16" in out.stdout
    assert "2 of 3 pass the prolog's node check with this config" in out.stdout
    assert "skipped fleet.json: not a nodecheck Report: its schema is 'nodecheck.fleet'" in out.stdout
    shown = cli("inspect", "--from", str(sweep))
    assert shown.returncode == 2 and f"{sweep} is a directory of Reports, not a snapshot" in shown.stderr, shown.stderr
    one = cli("config", "check", str(config), "--from", str(sweep / "hgx-01.json"))
    assert one.returncode == 0 and f"the prolog's node check passes on Report {sweep / 'hgx-01.json'}" in one.stdout
    config.write_text(config.read_text().replace("count = 8", "count = 80"))
    out = cli("config", "check", str(config), "--from", str(sweep))
    assert out.returncode == 1 and "0 of 3 pass" in out.stdout and out.stdout.count("nodecheck: GPUs 8 < 80") == 3
    broken = tmp_path / "broken.toml"
    broken.write_text("[gpus]\ncount = 'eight'\n")
    out = cli("config", "check", str(broken), "--from", str(sweep))
    assert out.returncode == 2 and "broken.toml" in out.stderr and not out.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.json").write_text("{}")
    out = cli("config", "check", str(config), "--from", str(empty))
    assert out.returncode == 2 and "no Report could be read" in out.stdout, out.stdout


H100_BENCH = REPO / "tests" / "fixtures" / "h100-vm-1gpu" / "live-bench-full.json"  # h2d and d2h 0.87 of spec


def test_config_check_judges_a_saved_reports_measurements_by_the_configs_thresholds(tmp_path):
    """A config that moves a threshold is checked against what a node measured: the H100's h2d at 0.87 of spec
    passes the calibrated 0.75 and fails an operator's 0.9. Counted where the prolog runs the test ([prolog]
    bench), shown and not counted where it does not; before, `config check` passed both, measurements unjudged."""
    strict = tmp_path / "strict.toml"
    strict.write_text('[thresholds.tests]\nh2d = 0.9\n[prolog]\nbench = ["h2d"]\n')
    out = cli("config", "check", str(strict), "--from", str(H100_BENCH))
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert f"    h2d on gpu0:host: 54.8 GB/s = 0.87 x spec, threshold 0.90 ([thresholds.tests] h2d in {strict}): " \
           "error: bandwidth_below_spec" in lines
    assert any(line.startswith("    d2h on gpu0:host: 55.0 GB/s = 0.87 x spec, threshold 0.75 (calibrated for d2h over pcie")
               and line.endswith("passes (not in [prolog] bench: the prolog does not run it)") for line in lines), lines
    assert lines[-1] == (f"the prolog would drain Report {H100_BENCH} with this config: "
                         "nodecheck: gpu0:host bandwidth 0.87 of spec, >= 0.9 expected")
    assert "  thresholds.tests.h2d        expects 0.9" in out.stdout and "  prolog.bench" in out.stdout

    shown_only = tmp_path / "shown.toml"  # the same threshold, but the prolog runs no test: bench and serve judge it
    shown_only.write_text("[thresholds.tests]\nh2d = 0.9\n")
    out = cli("config", "check", str(shown_only), "--from", str(H100_BENCH))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "error: bandwidth_below_spec (not in [prolog] bench: the prolog does not run it)" in out.stdout

    calibrated = tmp_path / "calibrated.toml"
    calibrated.write_text('[prolog]\nbench = ["h2d", "d2h"]\n')
    out = cli("config", "check", str(calibrated), "--from", str(H100_BENCH))
    assert out.returncode == 0 and out.stdout.count(": passes\n") == 2, out.stdout


def test_config_check_counts_measurements_in_a_sweeps_reports(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "h100-a.json").write_text(H100_BENCH.read_text())
    slow = json.loads(H100_BENCH.read_text())
    slow["node"]["hostname"] = "h100-b"
    for m in slow["measurements"]:  # this node's copies ran at half its neighbour's rate
        m["bytes_per_second"], m["ratio"] = m["bytes_per_second"] / 2, m["ratio"] / 2
    (sweep / "h100-b.json").write_text(json.dumps(slow))
    config = tmp_path / "prolog.toml"
    config.write_text('[prolog]\nbench = ["h2d"]\n')
    out = cli("config", "check", str(config), "--from", str(sweep))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "h100-b (h100-b.json): the prolog would drain it: nodecheck: gpu0:host bandwidth 0.44 of spec, >= 0.72 expected" \
        in out.stdout and "1 of 2 pass" in out.stdout, out.stdout


def test_a_report_with_more_gpus_nics_or_links_than_a_node_is_refused(tmp_path):
    """10,000 GPUs in a saved Report took `inspect --from` 150 s and 2.7 GB (50,000: a MemoryError): a Report is
    bounded as a snapshot is (src/nodecheck/core/limits.py), and refused naming the count."""
    document = _job()
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "pci_bus_id": "00000000:18:00.0"}
    for key, entry, count in (("gpus", gpu, 10_000), ("nics", {"name": "eth0"}, 5_000),
                              ("links", {"a": 0, "b": 1, "type": "NV18"}, 60_000)):
        big = dict(document, **{key: [dict(entry, index=n) if key == "gpus" else entry for n in range(count)]})
        (tmp_path / f"{key}.json").write_text(json.dumps(big))
        run = cli("inspect", "--from", str(tmp_path / f"{key}.json"))
        assert run.returncode == 2 and f"{count} {key}, more than a node holds" in run.stderr, run.stderr
