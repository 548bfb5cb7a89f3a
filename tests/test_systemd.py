"""The systemd units: `systemd-analyze verify` passes and the service's exposure is <= 2.0."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

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
    from nodecheck.exporters.http import MAX_CONNECTIONS

    limit = re.search(r"(?m)^LimitNOFILE=(\d+)$", (UNITS / "nodecheck.service").read_text())
    assert limit and int(limit[1]) >= 4 * MAX_CONNECTIONS
