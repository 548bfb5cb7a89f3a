"""The systemd units: `systemd-analyze verify` passes, the service's exposure is <= 2.0, and the textfile unit's
steps work as its user against Debian's directory layout."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import REPO, UNIT_USER, as_unit_user
from prometheus_client.parser import text_string_to_metric_families

UNITS = REPO / "systemd"


def installed_units(tmp_path: Path) -> Path:
    """The units as installed, ExecStart pointing at this environment's nodecheck (verify checks it exists)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (apt install systemd)")
    entry = Path(sys.executable).parent / "nodecheck"
    if not entry.exists():
        pytest.skip(f"{entry} is not installed")
    for unit in UNITS.glob("nodecheck*"):
        (tmp_path / unit.name).write_text(unit.read_text().replace("/usr/local/bin/nodecheck", str(entry)))
    return tmp_path


def test_units_verify(tmp_path):
    units = installed_units(tmp_path)
    for name in ("nodecheck.service", "nodecheck-textfile.service", "nodecheck-textfile.timer"):
        result = subprocess.run(["systemd-analyze", "verify", str(units / name)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", ["nodecheck.service", "nodecheck-textfile.service"])
def test_exposure_at_most_2(tmp_path, name):
    units = installed_units(tmp_path)
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(units / name)],
                            capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout[-500:] + result.stderr
    assert float(match[1]) <= 2.0, result.stdout[-3000:]


def test_exporter_unit_raises_the_descriptor_limit_above_the_connection_cap():
    from nodecheck.prometheus.http import MAX_CONNECTIONS

    limit = re.search(r"(?m)^LimitNOFILE=(\d+)$", (UNITS / "nodecheck.service").read_text())
    assert limit and int(limit[1]) >= 4 * MAX_CONNECTIONS


def unit_steps(unit: str) -> list[tuple[bool, list[str]]]:
    """(privileged, argv) of each ExecStart= and ExecStartPost= of a unit, in the order systemd runs them."""
    text = (UNITS / unit).read_text()
    steps = re.findall(r"(?m)^ExecStart=(.+)$", text) + re.findall(r"(?m)^ExecStartPost=(.+)$", text)
    return [(line.startswith("+"), line.lstrip("+").split()) for line in steps]


def test_textfile_unit_publishes_into_debians_node_exporter_directory(system_install):
    """The textfile unit's steps, run as systemd would run them, against the directories as Debian ships them:
    node_exporter's root:root 0755, the unit's runtime directory owned by its unprivileged user."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("running as the units' user needs root (setpriv, util-linux)")
    command, _ = system_install
    text = (UNITS / "nodecheck-textfile.service").read_text()
    assert re.search(r"(?m)^DynamicUser=yes$", text) and re.search(r"(?m)^RuntimeDirectory=nodecheck-textfile$", text)
    assert "ReadWritePaths=/var/lib/prometheus" not in text  # the unprivileged user could never write there
    root = Path(tempfile.mkdtemp(prefix="nodecheck-unit-"))
    try:
        root.chmod(0o755)
        exporter_dir = root / "var/lib/prometheus/node-exporter"
        runtime_dir = root / "run/nodecheck-textfile"
        for made in (exporter_dir, runtime_dir):
            made.mkdir(parents=True)
            made.chmod(0o755)  # root:root 0755, as the package ships it
        os.chown(runtime_dir, UNIT_USER, UNIT_USER)  # systemd gives RuntimeDirectory= to the unit's user

        def here(argv: list[str]) -> list[str]:
            return [str(command) if a == "/usr/local/bin/nodecheck" else
                    str(root) + a if a.startswith(("/run/", "/var/lib/prometheus/")) else a for a in argv]

        # The old unit's way, the probe writing straight into node_exporter's directory, is refused there
        direct = as_unit_user(str(command), "check", "--textfile-dir", str(exporter_dir))
        assert direct.returncode == 2 and "Permission denied" in direct.stderr
        steps = unit_steps("nodecheck-textfile.service")
        assert [privileged for privileged, _ in steps] == [False, True, True]
        for privileged, argv in steps:
            ran = subprocess.run(here(argv), capture_output=True, text=True, timeout=120) if privileged else \
                as_unit_user(*here(argv))
            assert ran.returncode == 0, (argv, ran.stdout, ran.stderr)
        published = exporter_dir / "nodecheck.prom"
        assert sorted(p.name for p in exporter_dir.iterdir()) == ["nodecheck.prom"]  # no temporary left behind
        assert published.stat().st_mode & 0o777 == 0o644 and published.stat().st_uid == 0
        metrics = as_unit_user("cat", str(published))  # node_exporter, another unprivileged user, reads it
        assert "nodecheck_probe_success" in {f.name for f in text_string_to_metric_families(metrics.stdout)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
