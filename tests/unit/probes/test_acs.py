"""ACS of the PCIe bridges from `lspci -vvv`: the published excerpts read as their answer keys
(../shared/captures/public/lspci), this machine's real lspci checked against its real config space, a
non-root, missing and hung lspci as named unknowns, and the finding on a switch tree."""

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from helpers import PUBLIC, acs_findings, fake_executable, lspci_for_switch, need

from nodecheck.checks import evaluate
from nodecheck.host.live import LiveHost
from nodecheck.probes.acs import NEEDS_ROOT, collect, parse_lspci
from nodecheck.report.model import PcieAcs

LSPCI = PUBLIC / "lspci"
CAPTURES = sorted(p.name for p in LSPCI.glob("*.txt")) if LSPCI.is_dir() else []
needs_lspci = pytest.mark.skipif(shutil.which("lspci") is None, reason="lspci not installed (apt-get install pciutils)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="reading the extended config space needs root")


@pytest.mark.parametrize("name", CAPTURES or [pytest.param("none", marks=pytest.mark.skip(reason="../shared absent"))])
def test_published_excerpts_read_as_their_answer_keys(name):
    expected = json.loads(need(LSPCI / "EXPECTED.json").read_text())[name]["devices"]
    got = [{"bdf": d.bdf, "acs_redirect_enabled": d.acs_redirect, "link_speed_gts": d.link_speed_gts,
            "link_speed_max_gts": d.link_speed_max_gts, "link_width": d.link_width, "link_width_max": d.link_width_max,
            "downgraded": d.downgraded} for d in parse_lspci((LSPCI / name).read_text())]
    # the answer key writes device lines as printed (no domain); the parser keeps them the same way
    assert got == expected


def acs_control_from_config(config: bytes) -> int | None:
    """The oracle: the ACS Control register read straight from config space (PCIe extended capability
    0x000D; its control register at +6), None when the device has no ACS capability."""
    offset, seen = 0x100, set()
    while offset and offset + 8 <= len(config) and offset not in seen:
        seen.add(offset)
        header = struct.unpack_from("<I", config, offset)[0]
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == 0x000D:
            return struct.unpack_from("<H", config, offset + 6)[0]
        offset = header >> 20
    return None


@needs_lspci
@needs_root
def test_this_machines_lspci_agrees_with_its_config_space():
    """Every bridge lspci reports ACS for has the capability in its config space with the same redirect
    bits (P2P request redirect 0x4, completion redirect 0x8); every device without it reports none."""
    facts = collect(LiveHost(), 10.0)
    assert facts.known and facts.why is None
    for device in Path("/sys/bus/pci/devices").iterdir():
        control = acs_control_from_config((device / "config").read_bytes())
        if control is None:
            assert device.name not in facts.redirect
        else:
            assert facts.redirect[device.name] == bool(control & 0xC)
    assert set(facts.redirect) <= {d.name for d in Path("/sys/bus/pci/devices").iterdir()}


class UnprivilegedHost(LiveHost):
    """This machine, with commands run as nobody (what a non-root `nodecheck inspect` sees)."""

    def command(self, source, argv, timeout):
        return super().command(source, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv], timeout)


@needs_lspci
@needs_root
def test_a_non_root_run_is_unknown_needs_root():
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) not installed")
    if not any(acs_control_from_config(p.read_bytes()) is not None or len(p.read_bytes()) > 64
               for p in Path("/sys/bus/pci/devices").glob("*/config")):
        pytest.skip("no device here has capabilities lspci would hide from a non-root user")
    facts = collect(UnprivilegedHost(), 10.0)
    assert (facts.known, facts.why, facts.redirect) == (False, NEEDS_ROOT, {})


def test_a_missing_lspci_is_named_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    facts = collect(LiveHost(), 5.0)
    assert not facts.known and "lspci is not installed (pciutils)" in facts.why


def test_a_hung_lspci_is_named_unknown_and_killed(tmp_path, monkeypatch):
    fake_executable(tmp_path / "lspci", "exec sleep 60\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    facts = collect(LiveHost(), 0.5)
    assert not facts.known and facts.why == "unknown: lspci did not answer within 0.5 s"


def test_garbled_lspci_output_is_no_acs_not_a_crash(tmp_path, monkeypatch):
    fake_executable(tmp_path / "lspci", "printf 'ACSCtl: ReqRedir\\x00+ \\xff\\n0000:zz:00.0 bridge\\n'\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    facts = collect(LiveHost(), 5.0)
    assert facts.known and facts.redirect == {}


def test_redirect_on_the_switch_ports_between_two_gpus_is_named_per_port(tmp_path):
    report, findings = acs_findings(tmp_path, lspci_for_switch(redirect=True))
    assert [(f.subject, f.severity) for f in findings] == [("pci:0000:17:00.0", "warning"), ("pci:0000:17:01.0", "warning")]
    assert "gpu0-gpu1 go through the CPU" in findings[0].message
    assert "pci=disable_acs_redir=0000:17:00.0" in findings[0].message
    assert report.pcie_acs == PcieAcs(True, None, {"0000:17:00.0": True, "0000:17:01.0": True})


def test_acs_off_or_unread_raises_nothing(tmp_path):
    assert acs_findings(tmp_path / "off", lspci_for_switch(redirect=False))[1] == []
    report, findings = acs_findings(tmp_path / "absent", None)  # a snapshot without lspci: no data, no guess
    assert findings == [] and report.pcie_acs is None
    denied = lspci_for_switch(redirect=True).replace("\tCapabilities: [220 v1]", "\tCapabilities: <access denied>\n\t\t#")
    report, findings = acs_findings(tmp_path / "denied", denied)
    assert findings == [] and report.pcie_acs.why == NEEDS_ROOT


def test_a_hostile_snapshot_value_is_ignored():
    from nodecheck.report.model import Report

    report = Report.from_dict({"gpus": [], "pcie_acs": {"known": True, "redirect": ["x"]},
                               "pcie_paths": {"0000:00:01.0": [{"bdf": 7}, "junk"]}})
    assert evaluate(report, None) == []


def test_inspect_and_the_exporter_say_what_acs_is(tmp_path):
    from nodecheck.prometheus.exposition import write_textfile
    from nodecheck.render.report import platform_lines

    report, _ = acs_findings(tmp_path / "on", lspci_for_switch(redirect=True))
    assert "ACS: P2P redirect on 0000:17:00.0, 0000:17:01.0" in platform_lines(report)
    assert "nodecheck_pcie_acs_redirect_bridges 2.0" in write_textfile(report, tmp_path).read_text()
    denied = lspci_for_switch(redirect=True).replace("\tCapabilities: [220 v1]", "\tCapabilities: <access denied>\n\t\t#")
    report, _ = acs_findings(tmp_path / "denied", denied)
    assert f"ACS: {NEEDS_ROOT}" in platform_lines(report)
    lines = write_textfile(report, tmp_path).read_text().splitlines()
    assert not [line for line in lines if line.startswith("nodecheck_pcie_acs_redirect_bridges")]  # unknown: absent


@needs_lspci
def test_a_snapshot_records_lspci_and_replays_the_live_facts(tmp_path):
    from helpers import nodecheck

    assert nodecheck("snapshot", str(tmp_path / "snap")).returncode == 0
    assert (tmp_path / "snap" / "lspci-vvv.txt").is_file()
    live = json.loads(nodecheck("inspect", "--json").stdout)["pcie_acs"]
    replayed = json.loads(nodecheck("inspect", "--json", "--from", str(tmp_path / "snap")).stdout)["pcie_acs"]
    assert replayed == live and live["known"] == (os.geteuid() == 0)


def test_a_malformed_link_speed_is_an_unknown_link_not_an_internal_error():
    """Issue 21 (4): `Speed 1.2.3GT/s` made float() raise inside the probe ("internal error"); the link is
    now unknown by name and the rest of the device is still read."""
    from nodecheck.probes.acs import parse_lspci

    (device,) = parse_lspci("0000:00:01.0 PCI bridge: Intel\n\t\tLnkCap:\tPort #0, Speed 1.2.3GT/s, Width x16\n"
                            "\t\tLnkSta:\tSpeed 16GT/s, Width x8\n\t\tACSCtl:\tSrcValid+ ReqRedir- CmpltRedir-\n")
    assert (device.link_speed_max_gts, device.link_width_max) == (None, None)
    assert (device.link_speed_gts, device.link_width) == (16.0, 8) and device.acs_redirect is False
