"""Report.from_dict: the JSON form read back into the model, so `scale --from` and the bench read
structured scopes instead of parsing path strings."""

import json

import pytest
from conftest import hgx_nvml, make_snapshot

from nodecheck.build import build_report
from nodecheck.model import Measurement, Report, path_identity
from nodecheck.snapshot import SnapshotHost


def test_a_report_survives_its_json(tmp_path):
    snap = make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml(inactive={3: [7]}))
    report = build_report(SnapshotHost(snap))
    report.measurements = [Measurement.measured("allreduce:16-ranks", "allreduce", 380e9, 400e9, 1 << 31, "m", "busbw"),
                           Measurement.measured("node2/gpu0:host", "h2d", 50e9, 63e9, 1 << 28, "m", "unidirectional")]
    text = json.dumps(report.to_dict())
    again = Report.from_dict(json.loads(text))
    assert json.dumps(again.to_dict()) == text
    assert {p.scope for p in again.paths} == {"host-link", "gpu-pair", "nic"} and again.nics[0].ib_ports == report.nics[0].ib_ports
    assert [(m.scope, m.ranks) for m in again.measurements] == [("cluster", 16), ("host-link", None)]


def test_a_schema_1_document_and_a_later_ones_keys():
    """A version 1 measurement (no scope) gets its scope from its path; a key a later version adds is
    dropped; a key it lacks takes its default."""
    old = {"schema_version": 1, "measurements": [{"path": "allreduce:node-8-gpus", "test": "allreduce", "ok": True,
                                                  "bytes_per_second": 1e9, "direction": "busbw", "from_the_future": 1}]}
    (m,) = Report.from_dict(old).measurements
    assert (m.scope, m.ranks, m.method, m.details) == ("node", 8, None, {})


@pytest.mark.parametrize("document", [[], {"gpus": {}}, {"gpus": [3]}, {"measurements": "all"}])
def test_what_is_not_a_report_is_refused(document):
    with pytest.raises(ValueError):
        Report.from_dict(document)


def test_the_path_spellings():
    assert path_identity("gpu3:host") == ("host-link", ["gpu3", "host"], None)
    assert path_identity("gpu0->gpu1")[:2] == path_identity("gpu0:gpu1")[:2] == ("gpu-pair", ["gpu0", "gpu1"])
    assert path_identity("nic:mlx5_0") == ("nic", ["mlx5_0"], None)
    assert path_identity("allreduce:3-ranks") == ("cluster", [], 3)
    assert path_identity("gpus") == (None, [], None)
