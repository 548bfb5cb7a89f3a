"""Shared fixtures. Real captures are read from ../shared/captures (never copied into the repo);
tests that need them skip when that folder is absent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("NODECHECK_SHARED", REPO.parent / "shared"))
CAPTURES = SHARED / "captures"
H100 = CAPTURES / "h100-pcie-vm"
PUBLIC = CAPTURES / "public"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared/captures not checked out beside the repo)")
    return path


def answer_key(folder: str) -> dict:
    key = json.loads(need(PUBLIC / folder / "EXPECTED.json").read_text())
    return {name: value for name, value in key.items() if not name.startswith("_")}


def nodecheck(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as an operator would."""
    return subprocess.run([sys.executable, "-m", "nodecheck", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


def requires_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2 (`ip`)")
