"""The CLI as an operator runs it: snapshot -> inspect --from round trips, JSON schema, exit codes."""

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from helpers import H100, REPO, cli, hgx_nvml, make_snapshot, need, nodecheck, without_gpus

STABLE = ("cpu", "gpus", "nics", "links", "paths", "findings", "advice")


def inspect_json(*args):
    result = nodecheck("inspect", "--json", *args)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_live_inspect_on_a_node_without_nvidia_driver():
    without_gpus()
    result = nodecheck("inspect")
    assert result.returncode == 0, result.stderr
    assert "No GPUs:" in result.stdout and "nvidia-smi" in result.stdout
    report = inspect_json()
    assert report["gpus"] == [] and "nvidia-smi" in report["gpus_absent_reason"]
    probes = {p["name"]: p for p in report["probes"]}
    assert probes["nics"]["ok"] and any(n["addresses"] for n in report["nics"])
    if shutil.which("lstopo-no-graphics"):
        assert probes["lstopo"]["ok"] and report["cpu"]["pus"] >= 1


def test_json_schema_documented_keys(tmp_path):
    snap = make_snapshot(tmp_path / "s", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    report = inspect_json("--from", str(snap))
    assert (report["schema"], report["schema_version"]) == ("nodecheck.report", 2)
    gpu = report["gpus"][0]
    assert (gpu["index"], gpu["cpu_affinity"], gpu["numa_node"], gpu["nearest_nics"]) == (0, "0-47,96-143", 0, ["mlx5_0"])
    assert {"a": 0, "b": 1, "type": "NV18", "path_class": "nvlink"} in report["links"]
    assert {"a": 0, "b": "mlx5_0", "type": "PIX", "path_class": "pcie-single-bridge"} in report["links"]
    assert [n["name"] for n in report["nics"]] == [f"mlx5_{i}" for i in range(8)]
    assert {p["name"]: (p["ok"], p["no_data"]) for p in report["probes"]} == {
        "nvidia_smi_topo": (True, False), "nvml": (True, False), "lstopo": (False, True), "nics": (False, True),
        "platform": (False, True), "pcie_paths": (False, True), "pcie_acs": (False, True), "imex": (False, True), "kernel_log": (False, True),
        "history": (False, True)}
    assert report["cpu"] is None  # lstopo did not run on that snapshot
    assert report["advice"][4]["lines"][1:] == ["NCCL_IB_HCA=mlx5_4", "numactl --cpunodebind=1 --membind=1 <command>"]  # VAR=value first
    doc = (REPO / "docs" / "report-schema.md").read_text()
    for key in report:
        assert f"`{key}`" in doc, f"top-level key {key} is not documented in docs/report-schema.md"


def test_topo_only_directory_gives_gpus_links_nics_affinity(tmp_path):
    snap = tmp_path / "topo-only"
    snap.mkdir()
    shutil.copy(need(H100 / "nvidia-smi-topo-m.txt"), snap / "nvidia-smi-topo-m.txt")
    report = inspect_json("--from", str(snap))
    assert [(g["index"], g["cpu_affinity"], g["numa_node"]) for g in report["gpus"]] == [(0, "0-15", 0)]
    assert {p["name"]: p["no_data"] for p in report["probes"] if not p["ok"]} == {"nvml": True, "lstopo": True, "nics": True,
                                                                                   "platform": True, "pcie_paths": True,
                                                                                   "pcie_acs": True, "imex": True, "kernel_log": True,
                                                                                   "history": True}
    assert report["findings"] == []


# what a live source may change between two reads a few seconds apart: the kernel log (a new line on this host) and the
# counters sampled into the state file; a snapshot's replay is compared with what the snapshot recorded for these
MOVING_KINDS = ("gpu_xid", "nvswitch_sxid", "nic_module_error", "nic_slot_power", "pcie_link_errors", "pcie_aer_fatal",
                "ib_link_downed", "ib_port_errors", "rdma_retransmits", "nic_link_errors", "ib_counter_saturated")


def _settled(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["kind"] not in MOVING_KINDS]


def test_snapshot_round_trip_directory_and_tarball(tmp_path):
    """A snapshot replays as the node it recorded: its directory and tarball forms alike, everything included; and as
    the live node, but for what a live source may change between the two reads (a kernel log line written meanwhile)."""
    replays = []
    for out in (tmp_path / "snap", tmp_path / "snap.tar.gz"):
        result = nodecheck("snapshot", str(out))
        assert result.returncode == 0, result.stderr
        live, replayed = inspect_json(), inspect_json("--from", str(out))
        replays.append(replayed)
        for key in STABLE:
            if key == "findings":
                assert _settled(replayed[key]) == _settled(live[key]), key
            else:
                assert replayed[key] == live[key], key
        if live["gpus_absent_reason"] is None:  # a GPU node
            assert replayed["gpus_absent_reason"] is None and replayed["gpus"] == live["gpus"]
        else:
            assert replayed["gpus_absent_reason"].replace(" (replayed from snapshot)", "") == live["gpus_absent_reason"]
        assert replayed["node"]["hostname"] == live["node"]["hostname"]
    assert (tmp_path / "snap" / "fs" / "sys" / "class" / "net").is_dir()
    again = inspect_json("--from", str(tmp_path / "snap"))
    assert [again[key] for key in STABLE] == [replays[0][key] for key in STABLE]  # the same record, read twice
    if live["gpus"]:
        return  # a GPU node: what follows is how a node without a driver is recorded
    sources = json.loads((tmp_path / "snap" / "sources.json").read_text())
    assert sources["nvidia-smi-topo-m.txt"]["outcome"] == "no_data"  # no driver here: replayed as such
    replayed = inspect_json("--from", str(tmp_path / "snap"))
    topo = {p["name"]: p for p in replayed["probes"]}["nvidia_smi_topo"]
    assert "not found on PATH (replayed from snapshot)" in topo["error"]
    with tarfile.open(tmp_path / "snap.tar.gz") as tar:
        assert all(not m.issym() for m in tar.getmembers())


def test_snapshot_refuses_to_overwrite(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    result = nodecheck("snapshot", str(tmp_path / "used"))
    assert result.returncode == 2 and "already exists" in result.stderr


@pytest.mark.parametrize("setup,message", [
    (lambda p: p / "absent", "does not exist"),
    (lambda p: [(p / "bad.tar.gz").write_bytes(b"\x1f\x8bnot really"), p / "bad.tar.gz"][1], "cannot read it as a tarball"),
])
def test_bad_snapshot_paths_exit_2(tmp_path, setup, message):
    result = cli("inspect", "--from", str(setup(tmp_path)))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_exit_codes_follow_findings_and_config(tmp_path):
    snap = make_snapshot(tmp_path / "s", topo="1x-h100-pcie-kvm-vm-1nic.txt")
    assert cli("inspect", "--from", str(snap)).returncode == 0
    config = tmp_path / "c.toml"
    config.write_text("[gpus]\ncount = 8\n")
    failing = cli("inspect", "--from", str(snap), "--config", str(config))
    assert failing.returncode == 1 and "1 GPUs visible, 8 expected" in failing.stdout
    config.write_text("[gpus]\ncount = 8\n[thresholds]\nfail_severity = \"critical\"\n")
    assert cli("inspect", "--from", str(snap), "--config", str(config)).returncode == 0
    config.write_text("[gpus]\ncout = 8\n")
    broken = cli("inspect", "--from", str(snap), "--config", str(config))
    assert broken.returncode == 2 and str(config) in broken.stderr and "'gpus.cout'" in broken.stderr
    assert cli("inspect", "--no-such-flag").returncode == 2


def test_config_init_writes_a_golden_config(tmp_path):
    snap = make_snapshot(tmp_path / "s", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    out = tmp_path / "golden.toml"
    assert cli("config", "init", "--from", str(snap), "--output", str(out)).returncode == 0
    assert "count = 8" in out.read_text() and '"gpu6-gpu7" = "NV18"' in out.read_text()
    again = cli("config", "init", "--from", str(snap), "--output", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
    assert cli("inspect", "--from", str(snap), "--config", str(out)).returncode == 0


def test_inspect_never_imports_torch(tmp_path):
    result = nodecheck("inspect", "--json", env={"PYTHONPROFILEIMPORTTIME": "1"})
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "nodecheck.cli" in imported and not any(m.split(".")[0] == "torch" for m in imported)
    if not Path("/dev/nvidiactl").exists():  # NVML cannot start here: its library is not even imported
        assert "pynvml" not in imported
    assert "psutil" not in imported and "rich" not in imported  # addresses from getifaddrs; no rich for JSON


def test_each_command_starts_with_the_family_that_declares_it_alone():
    """Run as the nodecheck command, only the family of the command run is imported (cli._families): a command
    missing from FAMILY_OF, or mapped to a family that does not declare it, would start with all of them or
    not be found."""
    from nodecheck.cli import FAMILIES, FAMILY_OF, _families, app

    declared = {(c.name or c.callback.__name__).replace("_", "-"): c.callback.__module__.rsplit(".", 1)[-1]
                for c in app.registered_commands}
    declared |= {g.name: "/".join(sorted({c.callback.__module__.rsplit(".", 1)[-1] for c in g.typer_instance.registered_commands}))
                 for g in app.registered_groups}  # `config init|check`
    assert declared == FAMILY_OF and set(FAMILY_OF.values()) == set(FAMILIES)
    assert _families(["/usr/bin/nodecheck", "fleet", "DIR", "--json"], {}) == ("fleet",)
    assert _families(["/usr/bin/nodecheck", "--json-less", "prolog"], {}) == ("slurm",)
    for argv, environ in ((["/usr/bin/nodecheck", "--help", "fleet"], {}), (["/usr/bin/nodecheck"], {}),
                          (["/usr/bin/nodecheck", "no-such-command"], {}),
                          (["/usr/bin/nodecheck", "fleet"], {"_NODECHECK_COMPLETE": "complete_bash"}),
                          (["pytest", "fleet"], {})):
        assert _families(argv, environ) == FAMILIES, argv
