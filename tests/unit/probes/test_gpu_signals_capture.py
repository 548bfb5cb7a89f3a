"""The second capture of the lent H100 (tests/fixtures/h100-vm-signals, 2026-11-28, issue 26): `nodecheck snapshot`
taken with every error source read live (clock events and their counters, the PCIe replay counter, NVLink's
refusal, the kernel log, lspci's ACS, NVML's process list), beside `inspect --json` and `check --textfile-dir`
run just before and after it. Replayed here, without a GPU, it must give what the node gave."""

import json

from helpers import REPO, nodecheck, replayed_and_live_metrics

FIXTURE = REPO / "tests" / "fixtures" / "h100-vm-signals"
# what two reads a second apart differ in by nature: when, from where, how long each probe took, and the gauges
# that move on an idle GPU (NVML's memory in use read 3.3 MiB, then 1.1 MiB; the idle clock reason came and went)
VOLATILE_KEYS = ("generated_at", "source", "measured_at", "history")
MOMENTARY_GPU = ("memory_used_bytes",)
# what nodecheck records of a GPU since this capture was taken: its snapshot has no source for them, so the replay says
# none (null), which the live Report of the time did not print at all
NEWER_GPU = ("nvlink_speed_mbps", "p2p_read", "nvlinks_wired")
RATED_SINCE = ("spec",)  # derived since from its name (specs.toml [[gpu_models]]): the replay rates it, the capture did not
VOLATILE_METRICS = ("nodecheck_report_timestamp_seconds", "nodecheck_probe_duration_seconds",
                    "nodecheck_node_uptime_seconds", "nodecheck_gpu_memory_used_bytes")


def _stable(report: dict) -> dict:
    out = {k: v for k, v in report.items() if k not in VOLATILE_KEYS}
    out["probes"] = [{k: v for k, v in p.items() if k != "duration_seconds"} for p in report["probes"]]
    out["gpus"] = [{k: v for k, v in g.items() if k not in MOMENTARY_GPU + NEWER_GPU + RATED_SINCE} for g in report["gpus"]]
    for gpu in out["gpus"]:
        gpu["signals"] = {k: v for k, v in gpu["signals"].items() if k != "clock_event_reasons"}
    out["kernel_log"] = {k: v for k, v in report["kernel_log"].items() if k != "uptime_usec"}
    return out


def _replayed() -> dict:
    run = nodecheck("inspect", "--json", "--from", str(FIXTURE))
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_the_replayed_snapshot_is_the_live_report():
    live = json.loads((FIXTURE / "live-inspect.json").read_text())
    replayed = _replayed()
    assert replayed["source"].startswith("snapshot:") and live["source"] == "live"
    assert _stable(replayed) == _stable(live)
    assert [{k: g[k] for k in NEWER_GPU} for g in replayed["gpus"]] == [dict.fromkeys(NEWER_GPU)]  # not in the capture
    assert [g["spec"]["model"] for g in replayed["gpus"]] == ["H100 SXM"]  # NVML's "NVIDIA H100 80GB HBM3"
    assert [p["name"] for p in replayed["probes"] if not p["ok"]] == ["imex"]  # no IMEX on a PCIe H100


def test_each_error_source_replays_as_the_node_read_it():
    """The H100's answers, as the lease printed them: no replay, no braking (nvidia-smi -q: 0 us each), NVLink
    error counters refused (a PCIe card: said, never a 0), the kernel log read from /dev/kmsg with no Xid, lspci
    read and no ACS-capable bridge in the VM."""
    report = _replayed()
    (gpu,) = report["gpus"]
    signals = gpu["signals"]
    assert signals["pcie_replays"] == 0 and signals["recovery_action"] == 0 and signals["ecc_uncorrected_volatile"] == 0
    assert signals["clock_event_ns"] == {"hw_thermal_slowdown": 0, "hw_power_brake_slowdown": 0, "sw_thermal_slowdown": 0}
    assert signals["nvlink_errors"] is None and gpu["nvlinks"] == []
    assert signals["inforom_valid"] is True and signals["retired_pages"] is None  # Hopper remaps rows
    assert (report["kernel_log"]["source"], report["kernel_log"]["events"]) == ("/dev/kmsg", [])
    assert report["pcie_acs"] == {"known": True, "why": None, "redirect": {}}
    assert gpu["processes"] == [] and gpu["fabric"]["state"] == "not_supported"
    assert report["findings"] == []


# checks declared since the capture: unknown until a test of the GPU itself has run, a series the node did not write
CHECKS_SINCE = ("gpu_below_siblings", "gpu_result_mismatch", "bench_skipped", "nccl_topo_nvlink_missing", "nccl_topo_mismatch",
                "nccl_ib_error", "nccl_fabric_not_ready", "nccl_fabric_unhealthy", "nccl_mnnvl_off",
                "nccl_nvls_failed")
# checks declared since the capture that judge what it holds (its topology): healthy, a series the node did not write
JUDGED_SINCE = ("gpu_off_nvlink",)


def test_the_replayed_snapshot_gives_the_live_metrics(tmp_path):
    replayed, live = replayed_and_live_metrics(FIXTURE, tmp_path, VOLATILE_METRICS)
    assert [replayed.pop(("nodecheck_check_unknown", (("check", kind),))) for kind in CHECKS_SINCE] == [1] * len(CHECKS_SINCE)
    assert [replayed.pop(("nodecheck_check_healthy", (("check", kind),))) for kind in JUDGED_SINCE] == [1] * len(JUDGED_SINCE)
    assert replayed == live
    # NVML refused the NVLink counters: no series and the check unknown, never a healthy 0
    assert not any(name.startswith("nodecheck_gpu_nvlink_errors") for name, _ in replayed)
    assert replayed[("nodecheck_check_unknown", (("check", "nvlink_errors"),))] == 1
    assert replayed[("nodecheck_gpu_pcie_replays", (("gpu", "0"),))] == 0
