"""A snapshot taken by `nodecheck snapshot` on a real GPU node (one H100 80GB HBM3, PCIe gen5 x16, driver
580.159.04, a Firecracker VM; tests/fixtures/h100-vm-1gpu), with what nodecheck reported live there in
the same run: replayed here, without a GPU, it must give the same Report and the same metrics."""

import json

import pytest
from helpers import REPO, nodecheck, replayed_and_live_metrics

from nodecheck.report.model import Report

FIXTURE = REPO / "tests" / "fixtures" / "h100-vm-1gpu"
# what differs between two runs of the same node by nature: when, from where, how long each probe took
VOLATILE_KEYS = ("generated_at", "source", "measured_at")
VOLATILE_METRICS = ("nodecheck_report_timestamp_seconds", "nodecheck_probe_duration_seconds")
# series added after the capture (nodecheck 0.1.0 of 2026-11-23, schema 1): the replay has them too
NEWER_SERIES = {"nodecheck_gpu_ecc_enabled", "nodecheck_gpu_row_remap_pending", "nodecheck_gpu_row_remap_failed",
                "nodecheck_node_fingerprint_info"}
NEWER_PROBES = {"platform", "pcie_paths", "pcie_acs", "imex", "kernel_log", "history"}  # not recorded then: they replay as giving nothing
NEWER_KEYS = ("platform", "pcie_paths", "pcie_acs", "imex", "kernel_log", "history")
# checks that `nodecheck check` never made on that node (no bandwidth test, the prolog's own): exported as healthy
# then, as unknown since issue 20 (13)
NEVER_MADE_THERE = {"bandwidth_below_spec", "bench_failed", "check_timed_out", "check_failed", "peer_unreachable",
                    "peer_outside_subnet", "peer_slow"}


def _stable(report: dict) -> dict:
    out = {k: v for k, v in report.items() if k not in VOLATILE_KEYS}
    out["probes"] = [{k: v for k, v in p.items() if k != "duration_seconds"} for p in report["probes"]]
    return out


def test_replayed_gpu_snapshot_is_the_live_report():
    live = json.loads((FIXTURE / "live-inspect.json").read_text())
    run = nodecheck("inspect", "--json", "--from", str(FIXTURE))
    assert run.returncode == 0, run.stderr
    replayed = json.loads(run.stdout)
    for key in NEWER_KEYS:
        assert not replayed[key], key  # nothing recorded, nothing replayed
        replayed[key] = None
    replayed["probes"] = [p for p in replayed["probes"] if p["name"] not in NEWER_PROBES]
    assert replayed["node"].pop("cuda_driver_version") == 13000  # the capture's nvml.json holds it
    assert replayed["node"].pop("nvlink_bw_mode") is None  # asked since: the capture's nvml.json does not hold it
    # read since from what the capture's nvml.json holds: its ECC mode [1, 1], whose pending half the Report keeps now
    assert replayed["gpus"][0]["ecc_pending"] is True
    replayed["gpus"][0]["ecc_pending"] = None
    # rated since by its model (specs.toml [[gpu_models]]): the capture's "NVIDIA H100 80GB HBM3" is an H100 SXM5
    spec = replayed["gpus"][0].pop("spec")
    assert (spec["model"], spec["memory_bytes_per_second"], spec["dense_tflops"]["bf16"]) == ("H100 SXM", 3.35e12, 989.4)
    # the capture is a schema 1 document: read as today's Report (fields added since take their defaults,
    # scopes come from the paths), it must be what the replay gives
    expected = _stable(Report.from_dict(live).to_dict())
    assert expected["gpus"][0].pop("spec") is None  # the capture's Report predates it
    assert _stable(replayed) == expected
    (gpu,) = replayed["gpus"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and (gpu["pcie"]["gen_current"], gpu["pcie"]["width_current"]) == (5, 16)
    host = {p["path"]: p for p in replayed["paths"]}["gpu0:host"]
    assert host["bytes_per_second"] == pytest.approx(63.0e9, rel=0.001) and replayed["findings"] == []


VIRTUAL_THERE = {"ifb0", "ifb1"}  # the VM's ifb devices: no PCI device behind them


def since_virtual_nics_left_out(live: dict) -> dict:
    """The captured metrics as nodecheck writes them since issue 21: virtual NICs out of the NIC series (not
    bond* or team*), and nodecheck_nic_info labelled virtual="false" for the rest."""
    out = {}
    for (name, labels), value in live.items():
        if name.startswith("nodecheck_nic_") and dict(labels)["nic"] in VIRTUAL_THERE:
            continue
        if name == "nodecheck_nic_info":
            labels = tuple(sorted(labels + (("virtual", "false"),)))
        out[(name, labels)] = value
    return out


def test_replayed_gpu_snapshot_gives_the_live_metrics(tmp_path):
    replayed, live = replayed_and_live_metrics(FIXTURE, tmp_path, VOLATILE_METRICS)
    captured_kinds = {dict(labels)["check"] for name, labels in live if name == "nodecheck_check_healthy"}
    unknown = {dict(labels)["check"] for name, labels in replayed if name == "nodecheck_check_unknown"}
    assert NEVER_MADE_THERE <= unknown
    live = {key: value for key, value in live.items()
            if not (key[0] == "nodecheck_check_healthy" and dict(key[1])["check"] in NEVER_MADE_THERE)}
    live = since_virtual_nics_left_out(live)
    assert {key: replayed.get(key) for key in live} == live
    added = {key for key in replayed if key not in live}
    assert all(name in NEWER_SERIES or (name in ("nodecheck_check_healthy", "nodecheck_check_unknown")
                                         and (dict(labels)["check"] not in captured_kinds or dict(labels)["check"] in NEVER_MADE_THERE))
               or dict(labels).get("probe") in NEWER_PROBES for name, labels in added), added
    assert replayed[("nodecheck_gpus", ())] == 1


def test_the_live_h2d_sweep_of_that_node_judged_again():
    """What `nodecheck bench --full --json` measured there (0.87 of the PCIe gen5 x16 spec), judged again by
    today's rules: no finding under the calibrated thresholds; under an operator's 0.9, one that points
    at the GPU's PCIe link. Pinned memory is at least 3x pageable at 1 GiB (README's payload table)."""
    from nodecheck.config import Config
    from nodecheck.report.model import Measurement
    from nodecheck.verdicts.bandwidth import measurement_findings

    report = json.loads((FIXTURE / "live-bench-full.json").read_text())
    measurements = [Measurement(**m) for m in report["measurements"]]
    assert [m.test for m in measurements] == ["h2d", "d2h"] and measurement_findings(measurements, Config()) == []
    strict = measurement_findings(measurements, Config(test_ratios={"h2d": 0.9, "d2h": 0.9}))
    assert [f.subject for f in strict] == ["gpu0:host"] * 2 and all("PCIe link" in f.message for f in strict)
    for m in measurements:
        rows = {(r["size_bytes"], r["memory"]): r[m.test] for r in m.details["rows"]}
        assert rows[(1 << 30, "pinned")] > 3 * rows[(1 << 30, "pageable")]
