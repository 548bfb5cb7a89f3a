"""The kernel log's Xid and SXid events judged (src/nodecheck/checks/signals.py), from real lines of
../shared/captures/public/health/xid and the driver's forms: drain now, watch and repeat, sympathetic events
counted against their cause, a GPU gone from NVML named by its address, the look-back, and operators'
acknowledgements (their own events only; a later event fails the node again)."""

import json

import pytest
from helpers import PUBLIC, cli, make_gpu, make_report, need

from nodecheck.checks import evaluate, unmade_checks
from nodecheck.checks.signals import gpu_xids, switch_xids
from nodecheck.config import Config
from nodecheck.core.xid_catalog import SXID_CLASSES, listed_sxids, sxid_entry, sxid_source
from nodecheck.probes.kernel_log import parse_kernel_log
from nodecheck.report.events import Acknowledgement, History, KernelLog
from nodecheck.report.gpu import GpuSignals
from nodecheck.slurm.prolog import drain_reason, failing_findings

XID = PUBLIC / "health" / "xid"
GPU3 = "00000000:9B:00.0"
# leptonai/gpud components/accelerator/nvidia/sxid/README.md @4a8de33a3f: a real kernel log, quoted there (the
# GPU's address changed to gpu3's, 0000:9b:00, so NVML names it)
GPUD_SXID_BURST = """\
[6781741.548779] NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
[6781741.548783] NVRM: GPU 0000:9b:00.0: GPU has fallen off the bus.
[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up
[6781753.404587] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up
[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00
[6781753.406566] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000, 0x10000000, \
0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}
[6781753.407899] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Fatal, Link 37 LTSSM Fault Up
[6781753.408138] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 62 LTSSM Fault Up
[6781753.409504] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 37 Sub-engine instance 00
[6781753.409792] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Severity 1 Engine instance 62 Sub-engine instance 00
""".splitlines()


def xid_line(code: int, seconds: float = 100.0, address: str = "0000:9b:00", tail: str = "pid=7, details") -> str:
    return f"[{seconds:12.6f}] NVRM: Xid (PCI:{address}): {code}, {tail}"


def judged(lines: list[str], uptime_s: float = 200.0, acks=(), config: Config | None = None, gpus=None):
    log = KernelLog(True, None, "/dev/kmsg", parse_kernel_log("\n".join(lines) + "\n"), int(uptime_s * 1e6))
    report = make_report(gpus=[make_gpu(3, pci_bus_id=GPU3)] if gpus is None else gpus, kernel_log=log,
                         history=History("boot", list(acks)))
    return report, gpu_xids(report, config or Config()) + switch_xids(report, config or Config())


def test_a_drain_now_xid_drains_with_the_gpu_and_the_signal_in_the_reason():
    report, findings = judged([xid_line(79, tail="GPU has fallen off the bus.")])
    (finding,) = findings
    assert (finding.kind, finding.severity, finding.subject) == ("gpu_xid", "error", "gpu3")
    assert drain_reason(failing_findings(findings, "error")) == "nodecheck: gpu3 Xid 79 fallen off the bus"
    assert "nodecheck clear gpu_xid --gpu 3" in finding.message


def test_a_gpu_gone_from_nvml_is_named_by_its_address():
    """The real XE9680 log: five Xid 119 on 0000:9b:00; NVML lists no GPU there (it fell off)."""
    log = KernelLog(True, None, "dmesg", parse_kernel_log(need(XID / "gpud-dmesg-xid119-dell-xe9680.log").read_text()))
    report = make_report(kernel_log=log)
    (finding,) = gpu_xids(report, Config())
    assert (finding.subject, finding.severity, finding.measured) == ("pci:0000:9b:00.0", "error", "Xid 119 GSP RPC timeout")
    assert "x5" in finding.message


def test_a_watched_xid_is_a_warning_until_it_repeats_within_the_window():
    config = Config()
    config.errors.xid_repeat_count, config.errors.xid_repeat_window_s = 3, 60
    _, (once,) = judged([xid_line(13, 150)], config=config)
    assert once.severity == "warning" and once.expected == "< 3 in 60 s"
    _, (spread,) = judged([xid_line(13, s) for s in (10, 100, 190)], config=config)  # only one within the last 60 s
    assert spread.severity == "warning"
    _, (burst,) = judged([xid_line(13, s, tail=f"pid={s}, name=python") for s in (150, 160, 170)], config=config)
    assert burst.severity == "error" and "3 within 60 s, from 3 process(es)" in burst.message
    # one job's own faults (RESTART_APP: the driver's line names the job's process) are that job's, not the GPU's
    _, (one_job,) = judged([xid_line(13, s, tail="pid=4242, name=python") for s in (150, 160, 170)], config=config)
    assert one_job.severity == "warning" and "from 1 process(es)" in one_job.message
    _, (sustained,) = judged([xid_line(92, 150)], config=config)  # 92 drains only when sustained
    assert sustained.severity == "warning"
    _, (sustained,) = judged([xid_line(92, s) for s in (150, 160, 170)], config=config)
    assert sustained.severity == "error"


def test_a_log_without_time_stamps_counts_every_event_since_boot():
    config = Config()
    config.errors.xid_repeat_count = 2
    lines = [f"[Tue Jun 11 10:0{n}:00 2024] NVRM: Xid (PCI:0000:9b:00): 31, pid={n}, fault" for n in range(2)]
    _, (finding,) = judged(lines, config=config)
    assert finding.severity == "error"


def test_a_sympathetic_xid_is_counted_against_its_cause_not_its_gpu():
    other = "0000:1b:00"
    lines = [xid_line(79, 100), xid_line(45, 101, other, "pid=9, Ch 00000010 (caused by previous Xid 79)"),
             xid_line(45, 102, other, "pid=9, Ch 00000011")]
    report, findings = judged(lines, gpus=[make_gpu(3, pci_bus_id=GPU3), make_gpu(0, pci_bus_id="00000000:1B:00.0")])
    assert [(f.subject, f.measured) for f in findings] == [("gpu3", "Xid 79 fallen off the bus")]
    alone = judged([xid_line(45, 100)])[1]
    assert [(f.subject, f.severity) for f in alone] == [("gpu3", "warning")]  # with no cause logged, 45 is watched


def test_an_acknowledgement_clears_its_events_and_a_later_one_fails_again():
    first = xid_line(79, 100)
    ack = Acknowledgement("gpu_xid", "gpu3", 100_000_000, 1, "ops", 0.0)
    assert judged([first], acks=[ack])[1] == []
    assert judged([first], acks=[Acknowledgement("gpu_xid", "gpu5", 100_000_000, 1, "ops", 0.0)])[1] != []
    assert judged([first], acks=[Acknowledgement("nvswitch_sxid", None, 100_000_000, 1, "ops", 0.0)])[1] != []
    (again,) = judged([first, xid_line(79, 150)], acks=[ack])[1]
    assert again.severity == "error" and "x1" in again.message
    ctime = "[Tue Jun 11 10:00:00 2024] NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus."
    assert judged([ctime], acks=[Acknowledgement("gpu_xid", None, None, 1, "ops", 0.0)])[1] == []  # by position
    assert judged([ctime, ctime], acks=[Acknowledgement("gpu_xid", None, None, 1, "ops", 0.0)])[1] != []


def test_the_look_back_leaves_out_older_events():
    config = Config()
    config.errors.kernel_log_lookback_s = 50
    assert judged([xid_line(79, 100)], uptime_s=200, config=config)[1] == []
    assert judged([xid_line(79, 160)], uptime_s=200, config=config)[1] != []


def sxid_line(code: int, tail: str, switch: int = 0, seconds: float = 131453.740743) -> str:
    return f"[{seconds:.6f}] nvidia-nvswitch{switch}: SXid (PCI:0000:05:00.0): {code}, {tail}"


@pytest.mark.parametrize(("code", "tail", "severity"), [
    (20034, "Fatal, Link 30 LTSSM Fault Up", "error"),  # D.5, the driver's word: fatal
    (22012, "Non-fatal, Link 30 Minion Link NA interrupt", "warning"),  # D.5 and D.4 in the guide: the word decides
    (20034, "Severity 1 Engine instance 30 Sub-engine instance 00", "error"),  # no word: the guide's class, fatal
    (11012, "Non-fatal, Link 30 Single bit ECC error", "warning"),  # corrected by the switch
    (23001, "Non-fatal, Link 30 ingress SRC-VC buffer overflow", "error"),  # D.6: always fatal, whatever the word
    (12028, "Non-fatal, Link 32 egress non-posted PRIV error (First)", "error"),  # D.4, but NVLink traffic stalls
    (20123, "Unknown error", "warning"),  # not in the catalog, no word
    (20123, "Fatal, Link 3 something new", "error"),  # not in the catalog: the driver's word
])
def test_an_nvswitch_sxid_is_judged_by_the_fabric_manager_guide_and_the_driver(code, tail, severity):
    _, (finding,) = judged([sxid_line(code, tail)])
    assert (finding.kind, finding.subject, finding.severity) == ("nvswitch_sxid", "nvswitch0", severity), finding.message
    entry = sxid_entry(code)
    assert finding.measured == f"SXid {code} {entry.name}".rstrip()
    assert (entry.name in finding.message) if entry.listed else "not in nodecheck's SXid catalog" in finding.message
    if code == 12028:
        assert "NVLink traffic through the port stalls" in finding.message


def test_gpuds_published_sxid_burst_counts_each_event_once_and_names_its_links():
    """gpud's README quotes a real burst after an Xid 79: each SXid event prints up to three lines (its word and
    link, "Severity ...", "Data {...}"), other switches' lines between them. Counted per line, nvswitch0 had 4
    events where it logged 2; a "Severity" line whose first line is not in the excerpt counts as one."""
    report, findings = judged(GPUD_SXID_BURST)
    by_switch = {f.subject: f for f in findings}
    assert sorted(by_switch) == ["gpu3", "nvswitch0", "nvswitch1", "nvswitch2"]
    assert "x2 since boot" in by_switch["nvswitch0"].message and "on links 62, 63" in by_switch["nvswitch0"].message
    assert "x1 since boot" in by_switch["nvswitch1"].message and "on link 48" in by_switch["nvswitch1"].message
    assert "x2 since boot" in by_switch["nvswitch2"].message and "on link 37" in by_switch["nvswitch2"].message
    assert {f.severity for f in findings} == {"error"}
    reason = drain_reason(failing_findings(switch_xids(report, Config()), "error"))
    assert reason == "nodecheck: nvswitch0 SXid 20034 LTSSM Fault Up (+2 more)"


def test_the_sxid_catalog_holds_the_guides_classes_and_its_source():
    codes = listed_sxids()
    assert len(codes) == 93 and {sxid_entry(c).klass for c in codes} == set(SXID_CLASSES)
    assert sxid_entry(20034).klass == "fatal" and sxid_entry(12020).klass == "always-fatal"
    assert sxid_entry(11012).klass == "non-fatal" and sxid_entry(10004).klass == "notable"
    assert [c for c in codes if sxid_entry(c).drains] == [11004, 12028, 19084]
    assert "Fabric Manager User Guide" in sxid_source()["catalog"] and "4a8de33a3f" in sxid_source()["copy"]
    assert not sxid_entry(99999).listed and sxid_entry(99999).fatal(None) is False


def test_an_unreadable_kernel_log_leaves_the_xid_checks_unknown_never_healthy():
    report = make_report(kernel_log=KernelLog(False, "unknown (needs CAP_SYSLOG): /dev/kmsg: permission denied"))
    assert evaluate(report, Config()) == []
    unknown = unmade_checks(report)
    assert "needs CAP_SYSLOG" in unknown["gpu_xid"] and "needs CAP_SYSLOG" in unknown["nvswitch_sxid"]
    assert "gpu_xid" not in unmade_checks(make_report(kernel_log=KernelLog(True, None, "/dev/kmsg", [])))


def test_the_answer_key_comes_back_from_kernel_log_json(tmp_path):
    """`nodecheck kernel-log FILE --json` on each capture: its xid events in file order are the answer key's
    [pci, xid] lines; every event holds the fields the schema names."""
    import json

    from helpers import cli

    key = json.loads(need(XID / "EXPECTED.json").read_text())
    for name, expected in key.items():
        if name.startswith("_"):
            continue
        result = cli("kernel-log", str(XID / name), "--json")
        document = json.loads(result.stdout)
        assert (document["schema"], document["schema_version"]) == ("nodecheck.kernel_log", 1)
        assert [[e["pci_bus_id"], e["xid"]] for e in document["events"] if e["kind"] == "xid"] == expected["xids"], name
        for event in document["events"]:
            assert {"kind", "xid", "pci_bus_id", "count", "severity", "caused_by", "message"} <= set(event)
        assert result.returncode == (1 if any(f["severity"] == "error" for f in document["findings"]) else 0)


def test_kernel_log_refuses_what_it_cannot_read(tmp_path):
    from helpers import cli

    assert cli("kernel-log", str(tmp_path / "absent.log")).returncode == 2
    assert cli("kernel-log", "/dev/zero").returncode == 2
    empty = tmp_path / "empty.log"
    empty.write_text("")
    result = cli("kernel-log", str(empty))  # an empty file is no log, not a clean one
    assert result.returncode == 2 and "empty" in result.stderr
    clean = tmp_path / "clean.log"
    clean.write_text("[    0.000000] Linux version 6.8.0\n[    1.000000] usb 1-1: new high-speed USB device\n")
    result = cli("kernel-log", str(clean))
    assert result.returncode == 0 and "no NVIDIA Xid or SXid" in result.stdout


def test_unknown_xids_are_watched_by_number():
    _, (finding,) = judged([xid_line(999, 150)])
    assert (finding.severity, finding.measured) == ("warning", "Xid 999 not in nodecheck's catalog")
    assert "not in nodecheck's catalog of 2025-10-29" in finding.message  # the catalog's revision, named


def test_the_old_drivers_fallen_off_the_bus_line_is_an_xid_79():
    """Older drivers wrote one line without an Xid: "NVRM: GPU at 0000:01:00.0 has fallen off the bus." (NVIDIA's
    forums and nvidia-bug-report logs of the 3xx-4xx drivers): a dead GPU, drained."""
    report, (finding,) = judged(["[  412.345678] NVRM: GPU at 0000:9b:00.0 has fallen off the bus."])
    assert (finding.subject, finding.severity, finding.measured) == ("gpu3", "error", "Xid 79 fallen off the bus")
    assert judged(["[  412.345678] NVRM: GPU at PCI:0000:9b:00: has fallen off the bus"])[1][0].severity == "error"


def test_an_unlisted_xid_drains_when_nvml_asks_for_a_recovery():
    """An Xid newer than the catalog, on a GPU whose NVML recovery action is 1 (GPU reset): the driver's own word that
    the GPU is not to be used until it is done; with the action none, it is watched."""
    from nodecheck.report.gpu import GpuSignals

    asking = [make_gpu(3, pci_bus_id=GPU3, signals=GpuSignals(recovery_action=1))]
    _, (finding,) = judged([xid_line(999, 150)], gpus=asking)
    assert finding.severity == "error" and "NVML's recovery action for the GPU is 1 (GPU reset)" in finding.message
    calm = [make_gpu(3, pci_bus_id=GPU3, signals=GpuSignals(recovery_action=0))]
    assert [f.severity for f in judged([xid_line(999, 150)], gpus=calm)[1]] == ["warning"]


@pytest.mark.parametrize("code,severity", [(169, "error"), (167, "error"), (171, "error"), (172, "error"), (137, "warning")])
def test_xids_newer_than_the_old_catalog(code, severity):
    """NVIDIA's catalog (gpud's generated copy, 2025-10-29): 169 SEC2_HALT_ERROR is 62's "Internal micro-controller
    halt"; 167 PCIE_FATAL_TIMEOUT; 171/172 uncorrectable DRAM/SRAM errors beside Xid 48; 137 NVLink Privilege Error
    (IGNORE): each was a warning as an Xid with no row."""
    _, (finding,) = judged([xid_line(code, 150)])
    assert finding.severity == severity and "not in nodecheck's catalog" not in finding.measured


def test_kernel_log_json_keeps_the_address_as_printed(tmp_path):
    import json

    log = tmp_path / "k.log"
    log.write_text("[ 5.0] NVRM: Xid (PCI:00000000:3B:00): 79, pid=1, GPU has fallen off the bus.\n")
    (event,) = json.loads(cli("kernel-log", str(log), "--json").stdout)["events"]
    assert (event["pci_bus_id"], event["device"], event["xid"], event["severity"]) == ("00000000:3B:00", "0000:3b:00.0", 79, "error")


def test_the_repeat_defaults_come_from_the_catalog_with_their_source():
    from nodecheck.core.shipped import shipped_table
    from nodecheck.core.xid_catalog import repeat_defaults

    assert (Config().errors.xid_repeat_count, Config().errors.xid_repeat_window_s) == repeat_defaults() == (5, 3600.0)
    assert "gpud" in shipped_table("xid.toml")["repeat"]["source"]


def test_kernel_log_json_names_each_sxid_event_once_with_its_link(tmp_path):
    import json

    log = tmp_path / "k.log"
    log.write_text("\n".join(GPUD_SXID_BURST) + "\n")
    result = cli("kernel-log", str(log), "--json")
    events = [e for e in json.loads(result.stdout)["events"] if e["kind"] == "sxid"]
    assert [(e["switch"], e["link"]) for e in events] == [(1, 48), (0, 63), (2, None), (2, 37), (0, 62)]
    assert {(e["name"], e["severity"]) for e in events} == {("LTSSM Fault Up", "error")} and result.returncode == 1
    assert "NVSwitch SXid 20034 LTSSM Fault Up x2 (fatal)" in cli("kernel-log", str(log)).stdout


# Xid 154 as the driver prints it, from public kernel logs (an Xid 79 followed by its recovery action)
RECOVERY_RESET = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
RECOVERY_REBOOT = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
RECOVERY_NONE = "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"


def test_xid_154_names_the_action_the_driver_asks_for():
    report, findings = judged([xid_line(154, tail=RECOVERY_REBOOT)])
    (finding,) = findings
    assert (finding.severity, finding.subject, finding.measured) == ("error", "gpu3", "Xid 154 Node Reboot Required")
    assert drain_reason(failing_findings(findings, "error")) == "nodecheck: gpu3 Xid 154 Node Reboot Required"


def test_xid_154_back_to_none_asks_nothing_and_the_last_line_holds():
    assert judged([xid_line(154, 100.0, tail=RECOVERY_RESET), xid_line(154, 150.0, tail=RECOVERY_NONE)])[1] == []
    _, findings = judged([xid_line(154, 100.0, tail=RECOVERY_NONE), xid_line(154, 150.0, tail=RECOVERY_RESET)])
    assert [f.measured for f in findings] == ["Xid 154 GPU Reset Required"]


def test_nvml_reading_no_action_now_outranks_the_logs_last_154():
    """The GPU was reset since: NVML's live recovery action (gpu_recovery_action) is none, so the log's line is past."""
    from nodecheck.report.model import GpuSignals

    gpu = make_gpu(3, pci_bus_id=GPU3)
    gpu.signals = GpuSignals(recovery_action=0)
    assert judged([xid_line(154, tail=RECOVERY_RESET)], gpus=[gpu])[1] == []
    gpu.signals = GpuSignals(recovery_action=None)  # NVML cannot say: the log's word holds
    assert [f.severity for f in judged([xid_line(154, tail=RECOVERY_RESET)], gpus=[gpu])[1]] == ["error"]


def test_an_xid_154_whose_words_are_not_read_is_watched():
    (finding,) = judged([xid_line(154, tail="GPU recovery action changed")])[1]
    assert (finding.severity, finding.measured) == ("warning", "Xid 154 GPU Recovery Action Changed")


def test_kernel_log_json_says_each_154_by_the_action_it_changes_to(tmp_path):
    log = tmp_path / "dmesg.txt"
    log.write_text("\n".join([xid_line(79, 90.0, tail="GPU has fallen off the bus."), xid_line(154, 91.0, tail=RECOVERY_RESET),
                              xid_line(154, 95.0, tail=RECOVERY_NONE)]) + "\n")
    document = json.loads(cli("kernel-log", str(log), "--json").stdout)
    assert [(e["xid"], e["severity"]) for e in document["events"]] == [(79, "error"), (154, "error"), (154, "info")]
    text = cli("kernel-log", str(log)).stdout  # the summary says what the last 154 asks, not the row's watch
    assert "Xid 154 GPU Recovery Action Changed x2 (the driver asks nothing now)" in text
    log.write_text(xid_line(154, 91.0, tail=RECOVERY_RESET) + "\n")
    assert "x1 (the driver asks: " in cli("kernel-log", str(log)).stdout


def test_a_users_own_page_faults_do_not_drain_but_a_gpu_reset_asked_does():
    """Five Xid 31 of one process within the hour drained the node, though NVIDIA resolves 31 by restarting the
    application. With NVML's recovery action asking for a reset, the same events count against the GPU."""
    lines = [xid_line(31, 100 + s, tail="pid=3234, name=train.py, Ch 00000008, intr 00000000. MMU Fault") for s in range(6)]
    _, (finding,) = judged(lines)
    assert finding.severity == "warning" and "from 1 process(es)" in finding.message
    gpu = make_gpu(3, pci_bus_id=GPU3)
    gpu.signals = GpuSignals(recovery_action=2)
    _, findings = judged(lines, gpus=[gpu])
    assert any(f.kind == "gpu_xid" and f.severity == "error" for f in findings)
