"""Report.from_dict: the JSON form read back into the model, so `scale --from` and the bench read
structured scopes instead of parsing path strings."""

import json

import pytest
from helpers import hgx_nvml, make_snapshot

from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.report.model import Measurement, Report, path_identity


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


@pytest.mark.parametrize("document", [[], {"gpus": {}}, {"gpus": [3]}, {"measurements": "all"},
                                      {"links": [{"a": 0, "b": 1, "type": "NVxx", "path_class": "nvlink"}]},
                                      {"links": [{"a": 0, "b": 1, "type": "NV" + "9" * 5000, "path_class": "nvlink"}]}])
def test_what_is_not_a_report_is_refused(document):
    with pytest.raises(ValueError):
        Report.from_dict(document)


def test_the_path_spellings():
    assert path_identity("gpu3:host") == ("host-link", ["gpu3", "host"], None)
    assert path_identity("gpu0->gpu1")[:2] == path_identity("gpu0:gpu1")[:2] == ("gpu-pair", ["gpu0", "gpu1"])
    assert path_identity("nic:mlx5_0") == ("nic", ["mlx5_0"], None)
    assert path_identity("allreduce:3-ranks") == ("cluster", [], 3)
    assert path_identity("gpus") == (None, [], None)
    # a hostile Report's rank count of 5,000 digits is no path (int() once raised ValueError on Python's digit limit)
    assert path_identity("allreduce:" + "9" * 5000 + "-ranks") == path_identity("gpu" + "9" * 5000 + ":host") == (None, [], None)


def populated(hint, name: str = "x"):
    """A value of `hint` unlike any default: every dataclass field set, every list and mapping non-empty."""
    import dataclasses
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return populated(next(a for a in args if a is not type(None)), name)
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: populated(hints[f.name], f.name) for f in dataclasses.fields(hint)})
    if origin is list:
        return [populated(args[0], name)]
    if origin is dict:
        return {"0000:17:00.0": populated(args[1], name)}
    if (hint, name) == (str, "type"):
        return "NV18"  # Link.type: one nvidia-smi prints, or the Report is refused
    if (hint, name) == (dict, "nvlinks"):
        return {"link": 0, "active": True, "version": 4}  # Gpu.nvlinks: an entry of another shape is left out
    return {bool: True, int: 7, float: 2.5, str: f"{name}-value", dict: {name: 1}, list: [{name: 1}],
            object: f"{name}-object"}[hint]


def unset_fields(value, where: str = "Report") -> list[str]:
    """Every dataclass field under `value` that holds its default or nothing."""
    import dataclasses

    if isinstance(value, list):
        return [m for item in value for m in unset_fields(item, where)]
    if isinstance(value, dict):
        return [m for key, item in value.items() for m in unset_fields(item, f"{where}[{key}]")]
    if not dataclasses.is_dataclass(value):
        return []
    out = []
    for spec in dataclasses.fields(value):
        got = getattr(value, spec.name)
        default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
        if got in (None, [], {}, "") or got == default:
            out.append(f"{where}.{spec.name}")
        out += unset_fields(got, f"{where}.{spec.name}")
    return out


def test_every_field_of_a_fully_populated_report_survives_its_json():
    """A field Report.from_dict cannot read back (a type the reader does not know, a section dropped as
    malformed) fails here the day it is added: no source is lost between `inspect --json` and `--from`."""
    from nodecheck.report.model import SCHEMA_VERSION

    report = populated(Report)
    report.schema_version = SCHEMA_VERSION
    assert unset_fields(report) == ["Report.schema_version"]  # the generator reached every field
    text = json.dumps(report.to_dict(), sort_keys=True)
    again = Report.from_dict(json.loads(text))
    assert again == report
    assert json.dumps(again.to_dict(), sort_keys=True) == text


def test_a_gpus_nvlink_entries_of_another_shape_are_left_out():
    """Gpu.nvlinks is free-form in the JSON: a saved Report's entry without a link number or an active state that
    is none of true, false, null raised KeyError in the rules and the renderer (found by the saved_report fuzz)."""
    links = [{"link": 0, "active": True, "version": 4}, {"link": 1, "active": None, "error": "Unknown Error"},
             {"link": 2}, {"active": True}, {"link": "3", "active": True}, {"link": 4, "active": "yes"}]
    (gpu,) = Report.from_dict({"gpus": [{"index": 0, "nvlinks": links}]}).gpus
    assert gpu.nvlinks == links[:2]


def test_a_malformed_section_is_dropped_and_a_malformed_list_refused():
    report = Report.from_dict({"platform": {"peer_memory": 3, "modules_known": True}, "pcie_paths": {"a": [{"bdf": 7}]},
                               "pcie_acs": {"known": True, "redirect": ["x"]}, "gpus": [{"index": 0, "name": "H100"}]})
    assert (report.platform, report.pcie_paths, report.pcie_acs) == (None, None, None)
    assert report.gpus[0].name == "H100" and report.acs_redirects() is None
    with pytest.raises(ValueError, match="Gpu.name"):
        Report.from_dict({"gpus": [{"index": 0, "name": ["H100"]}]})


def essential_fields(kind, seen=None) -> list[tuple[type, str]]:
    """Every (dataclass, field) marked ESSENTIAL under `kind`, found from the type hints."""
    import dataclasses
    import types
    import typing

    seen = set() if seen is None else seen
    if kind in seen:
        return []
    seen.add(kind)
    out, hints = [], typing.get_type_hints(kind)
    for spec in dataclasses.fields(kind):
        if spec.metadata.get("essential"):
            out.append((kind, spec.name))
        stack = [hints[spec.name]]
        while stack:
            hint = stack.pop()
            if dataclasses.is_dataclass(hint):
                out += essential_fields(hint, seen)
            stack += [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (
                list, dict, typing.Union, types.UnionType) else []
    return out


def test_an_entry_without_an_essential_key_is_refused_naming_it():
    """Each essential key (typed_json.ESSENTIAL: a GPU's index, a measurement's path and whether it ran ...)
    deleted from a fully populated entry: the entry is refused naming it, where any other key takes its default."""
    from nodecheck.report.model import from_json

    found = essential_fields(Report)
    assert {f"{k.__name__}.{n}" for k, n in found} >= {"Gpu.index", "Link.type", "Measurement.path", "Measurement.ok",
                                                      "Nic.kind", "Finding.subject", "XidEvent.code"}
    for kind, name in found:
        document = json.loads(json.dumps(populated(kind).__dict__, default=lambda v: v.__dict__))
        from_json(kind, document)  # whole: read
        del document[name]
        with pytest.raises(ValueError, match=f"{kind.__name__}.{name}: missing"):
            from_json(kind, document)
