"""Shared fixtures. Real captures are read from ../shared/captures (never copied into the repo);
tests that need them skip when that folder is absent."""

from __future__ import annotations

import functools
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


@functools.cache
def live_gpu_count() -> int:
    """NVIDIA GPUs on this machine, as nodecheck sees them (0 on CI's machines)."""
    report = json.loads(nodecheck("inspect", "--json").stdout)
    return len(report["gpus"])


def without_gpus() -> None:
    """Tests of how a node without NVIDIA GPUs looks: on a GPU node they skip, saying so."""
    if live_gpu_count():
        pytest.skip(f"this node has {live_gpu_count()} NVIDIA GPU(s): the test is of a node without")


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


def h100_nvml_records() -> list[dict]:
    """NVML values captured on the real H100 node, one record per GPU."""
    return [json.loads(line) for line in need(H100 / "nvml.json").read_text().splitlines() if line.strip()]


def make_snapshot(root: Path, topo: str | None = None, nvml_gpus: list[dict] | None = None) -> Path:
    """A snapshot directory as `nodecheck snapshot` writes it, holding only the sources given
    (topo: a file name under captures/public/topo).
    nvml.json is produced by the real dump_nvml() reading the replaying pynvml stand-in."""
    root.mkdir(parents=True, exist_ok=True)
    if topo is not None:
        (root / "nvidia-smi-topo-m.txt").write_text(need(PUBLIC / "topo" / topo).read_text())
    if nvml_gpus is not None:
        from fakes import fake_pynvml

        from nodecheck.probes.nvml import dump_nvml

        saved = sys.modules.get("pynvml")
        sys.modules["pynvml"] = fake_pynvml.replaying(nvml_gpus)
        try:
            (root / "nvml.json").write_text(json.dumps(dump_nvml()))
        finally:
            if saved is None:
                sys.modules.pop("pynvml", None)
            else:
                sys.modules["pynvml"] = saved
    return root


A100_SXM4 = {"name": "NVIDIA A100-SXM4-40GB", "arch": 7, "maxgen": 4, "gpumaxgen": 4, "gen": 4}


def hgx_nvml(links_per_gpu: int = 18, version: int = 6, inactive: dict | None = None, **gpu) -> list[dict]:
    """Eight H100 records for an NV18 HGX board: the captured H100 values (architecture 9, Hopper) with NVLinks
    as such a board reports them (state 1, version enum 6 = NVLink 4.0); `inactive` = {gpu: [links]} marks
    links down, as a fault would; `gpu` overrides captured fields (A100_SXM4: an A100 board, enum 5)."""
    base = dict(h100_nvml_records()[0], **gpu)
    gpus = []
    for i in range(8):
        down = set((inactive or {}).get(i, []))
        gpus.append(dict(base, uuid=f"GPU-hgx-{i}", pci=f"00000000:{0x18 + i * 0x10:02x}:00.0",
                         nvlink=[[link, 0 if link in down else 1, version] for link in range(links_per_gpu)]))
    return gpus


def h100_node_snapshot(root: Path) -> Path:
    """The real H100 node as a snapshot, assembled from its captured sources: nvidia-smi topo -m,
    lstopo XML, NVML values (through the real reader) and the /sys/class/net files."""
    import sysfs_trees

    make_snapshot(root, nvml_gpus=h100_nvml_records())
    (root / "nvidia-smi-topo-m.txt").write_text(need(H100 / "nvidia-smi-topo-m.txt").read_text())
    (root / "lstopo.xml").write_text(need(H100 / "lstopo.xml").read_text())
    sysfs_trees.net_tree_from_capture(root / "fs", need(H100 / "sysfs.txt").read_text())
    links = {}
    for entry in (root / "fs" / "sys" / "class" / "net").iterdir():
        # a snapshot keeps files at the path they were read from, and symlink targets in fs-links.json
        links[f"/sys/class/net/{entry.name}"] = os.readlink(entry)
        target = entry.resolve()
        entry.unlink()
        shutil.copytree(target, entry)
    (root / "fs-links.json").write_text(json.dumps(links))
    return root


UNIT_USER = 65534  # the systemd units run as a DynamicUser: an unprivileged uid with no groups; nobody stands in


def as_unit_user(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run argv as the units' user would: uid and gid nobody, no supplementary groups, from /."""
    # through sh: setpriv's own exec can still pass directories the new user could not
    return subprocess.run(["setpriv", f"--reuid={UNIT_USER}", f"--regid={UNIT_USER}", "--clear-groups", "--",
                           "sh", "-c", 'exec "$@"', "sh", *argv],
                          capture_output=True, text=True, timeout=timeout, cwd="/")


@pytest.fixture(scope="session")
def system_install():
    """deploy/install.sh run as on a node: into a prefix every user can reach, with root's PATH starting at a
    python3 that must not be used (a pyenv-like one under a root-only home). Yields (command, install's result)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="nodecheck-install-"))
    try:
        base.chmod(0o755)
        trap = base / "root-only-home" / "bin"
        trap.mkdir(parents=True)
        (base / "root-only-home").chmod(0o700)
        (trap / "python3").write_text(f"#!/bin/sh\ntouch {base}/wrong-python-ran\nexit 1\n")
        (trap / "python3").chmod(0o755)
        env = dict(os.environ, NODECHECK_PREFIX=str(base / "opt"), NODECHECK_BIN=str(base / "bin"),
                   PATH=f"{trap}:{os.environ['PATH']}")
        result = subprocess.run(["sh", str(REPO / "deploy/install.sh")], env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        assert not (base / "wrong-python-ran").exists()
        yield base / "bin" / "nodecheck", result
    finally:
        shutil.rmtree(base, ignore_errors=True)
