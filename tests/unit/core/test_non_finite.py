"""NaN and Infinity in what nodecheck reads. Python's json.loads accepts NaN, Infinity and 1e999 (read as inf),
and every comparison with a NaN is false: a bench file whose ratio was NaN was published by `serve --measurements`
and judged with no finding, a silent pass. Every untrusted JSON is now read by typed_json.loads, which refuses
them naming the value; a figure measured as NaN is a failed test."""

import json
import sys

import pytest
from helpers import REPO, cli

from nodecheck.config import Config
from nodecheck.core import typed_json
from nodecheck.core.errors import NodecheckError
from nodecheck.report.model import Measurement
from nodecheck.verdicts.bandwidth import measurement_findings

NOT_NUMBERS = ["NaN", "[Infinity]", '{"ratio": -Infinity}', "1e999", "-1e400", "1" + "0" * 309]


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_json_that_holds_no_finite_number_is_refused_naming_it(text):
    json.loads(text)  # what Python's reader takes
    with pytest.raises(ValueError, match="not a number JSON allows|past a float's range"):
        typed_json.loads(text)


def test_finite_numbers_read_as_pythons_reader_reads_them():
    text = '{"a": [1.5, -2, 1e308, 5e-324, 18446744073709551615, 0.0, -0.0], "b": "NaN"}'
    assert typed_json.loads(text) == json.loads(text)


def job_report(ratio_text: str) -> str:
    """The example job's bench Report (examples/job-8node-allreduce.json) with its all-reduce at this ratio, as a
    bench that divided by a zero time or a garbled copy would write it."""
    document = json.loads((REPO / "examples/job-8node-allreduce.json").read_text())
    document["findings"] = []
    text = json.dumps(document)
    (m,) = document["measurements"]
    return text.replace(f'"ratio": {json.dumps(m["ratio"])}', f'"ratio": {ratio_text}', 1)


@pytest.mark.parametrize("ratio", ["NaN", "Infinity", "1e999"])
def test_serve_refuses_a_bench_file_whose_ratio_is_not_a_number(tmp_path, ratio):
    from nodecheck.bench.plan import read_measurements_file

    text = job_report(ratio)
    (m,) = [Measurement(**raw) for raw in json.loads(text)["measurements"]]  # as Python's reader took it
    if ratio == "NaN":
        assert measurement_findings([m], Config()) == []  # the silent pass
    (tmp_path / "bench.json").write_text(text)
    with pytest.raises(NodecheckError, match=f"bench.json: not the output of `nodecheck bench --json` \\({ratio}"):
        read_measurements_file(tmp_path / "bench.json")
    (tmp_path / "good.json").write_text(job_report("0.5"))
    (good,) = read_measurements_file(tmp_path / "good.json")[0]
    assert [f.kind for f in measurement_findings([good], Config())] == ["bandwidth_below_spec"]


def test_fleet_skips_a_node_whose_report_holds_a_nan_naming_it(tmp_path):
    (tmp_path / "fleet").mkdir()
    for name in ("a", "b"):
        (tmp_path / "fleet" / f"{name}.json").write_text(job_report("0.9" if name == "a" else "NaN"))
    result = cli("fleet", str(tmp_path / "fleet"), "--json")
    assert "Traceback" not in result.stderr, result.stderr
    document = json.loads(result.stdout)
    assert document["nodes"] == 1 and document["skipped"] == [{"file": "b.json", "why": "not a nodecheck Report: NaN is not a number JSON allows"}]


def test_a_rate_measured_as_nan_is_a_failed_test_not_a_figure():
    for rate in (float("nan"), float("inf")):
        m = Measurement.measured("gpu0:host", "h2d", rate, 55e9, 1 << 28, "m", "unidirectional", {"rows": []})
        assert (m.ok, m.ratio, m.details) == (False, None, {"rows": []}) and "no finite rate" in m.error
        assert [f.kind for f in measurement_findings([m], Config())] == ["bench_failed"]


def test_a_worker_that_writes_nan_left_no_readable_result(tmp_path):
    """A bench child's output (gpu_worker, worker) is read by the same reader: a NaN in it is a failed test, named."""
    from nodecheck.bench.results import run_worker

    out = tmp_path / "out.json"
    writer = f"open({str(out)!r}, 'w').write('{{\"rows\": [{{\"busbw\": NaN}}]}}')"
    with pytest.raises(NodecheckError, match="the worker left no readable result: NaN is not a number JSON allows"):
        run_worker([sys.executable, "-c", writer], out, 60)


def test_a_peer_nodes_measurement_of_another_shape_is_skipped_not_judged():
    """The job's Report carries every node's own measurements (other_nodes_results). A peer's entry whose ratio is
    text was taken whole by Measurement(**raw), and judging it raised TypeError ('<' between str and float)."""
    from dataclasses import asdict

    from nodecheck.bench.distributed import other_nodes_results

    good = asdict(Measurement.measured("gpu0:host", "h2d", 50e9, 55e9, 1 << 28, "m", "unidirectional"))
    bad = dict(good, ratio="0.5")
    allreduce = Measurement.measured("allreduce:4-ranks", "allreduce", 40e9, 50e9, 1 << 30, "m", "busbw",
                                     {"node_results": [{"rank": 1, "node": "n1", "results": [good, bad, {"path": "x"}, 7]}]})
    (m,) = other_nodes_results(allreduce, own_rank=0)
    assert (m.path, m.details["node"]) == ("n1/gpu0:host", "n1")
    assert measurement_findings([m], Config()) == []


def test_a_prometheus_sample_of_nan_or_inf_is_no_figure():
    """`fleet --prometheus`: Prometheus writes a sample's value as text ("NaN", "+Inf"); an exporter that published
    +Inf was kept as a figure, NaN was already dropped."""
    from nodecheck.fleet.prometheus import _number

    values = ["0.93", "NaN", "+Inf", "-Inf", "1e999", "x"]
    assert [_number({"value": [1.8e9, v]}) for v in values] == [0.93, None, None, None, None, None]
