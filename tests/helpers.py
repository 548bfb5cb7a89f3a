"""What tests share: the paths of the captures (../shared, read from there, skipped when absent), the CLI
run as an operator runs it, snapshots built from captured values, keyword factories of the model, free
ports, private networks, waiting, fake executables."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import sysfs_trees
from fakes import fake_pynvml
from prometheus_client.parser import text_string_to_metric_families

from nodecheck.config import Config
from nodecheck.core.pci import Hop
from nodecheck.host.live import LiveHost
from nodecheck.host.snapshot import SnapshotHost
from nodecheck.pipeline import build_report
from nodecheck.probes import imex
from nodecheck.probes.nvml import dump_nvml
from nodecheck.probes.roce_gids import ZERO_GID
from nodecheck.prometheus.exposition import write_textfile
from nodecheck.report.events import History
from nodecheck.report.findings import Finding
from nodecheck.report.model import Gpu, IbPort, Measurement, Nic, Report
from nodecheck.verdicts.bandwidth import with_measurements

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


def cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI in this process (typer's runner): the same exit code, standard output and error as `nodecheck`
    in a subprocess, for a tenth of the time. Use nodecheck() where the process itself is under test
    (imports, signals, the environment)."""
    from typer.testing import CliRunner

    from nodecheck.cli import app

    result = CliRunner().invoke(app, list(args), prog_name="nodecheck")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["nodecheck", *args], result.exit_code, result.stdout, result.stderr)


def requires_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2 (`ip`)")


def raised_as_unit_user(call) -> str:
    """What `call` raises ("Type: message") in a forked child that dropped to the units' unprivileged user (UNIT_USER,
    no groups); "no error" when it returns. As root only."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(UNIT_USER)
            os.setuid(UNIT_USER)
            call()
            message = "no error"
        except BaseException as error:  # noqa: BLE001 - handed to the parent as text
            message = f"{type(error).__name__}: {error}"
        os.write(write, message.encode()[:4096])
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(child, 0)
    return message


WRITE_KMSG = "NODECHECK_TESTS_WRITE_KMSG"


def may_write_the_real_kernel_log() -> None:
    """Skip unless asked to write the tests' fake Xid lines (and one test's flood) into this machine's real kernel
    log: NODECHECK_TESTS_WRITE_KMSG=1, as root, with /dev/kmsg. Never by default: the suite leaves the host as it found
    it, and a fake "NVRM: Xid" there is evidence to nodecheck's own daemon and prolog (kept in its state file for the
    rest of the boot), to DCGM, NPD, gpud and a site's NHC on any node that runs them, and a flood scrolls real
    messages out of dmesg. The reader itself is tested through a root the tests make (test_kernel_log.py)."""
    if os.environ.get(WRITE_KMSG) != "1":
        pytest.skip(f"writes the real kernel log: only with {WRITE_KMSG}=1 (a machine about to be given back)")
    if os.geteuid() != 0 or not os.path.exists("/dev/kmsg"):
        pytest.skip("needs root and /dev/kmsg")


def h100_nvml_records() -> list[dict]:
    """NVML values captured on the real H100 node, one record per GPU, with its VBIOS version as that node's
    `nvidia-smi -q` (NVML's nvmlDeviceGetVbiosVersion) printed it."""

    vbios = re.search(r"VBIOS Version\s+: (\S+)", need(H100 / "nvidia-smi-q.txt").read_text())[1]
    return [dict(json.loads(line), vbios=vbios) for line in need(H100 / "nvml.json").read_text().splitlines() if line.strip()]


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


HGX_FABRIC_REGISTERED = {"state": 3, "status": 0, "cliqueId": 0, "clusterUuid": bytes(16), "healthMask": 0, "healthSummary": 0}
A100_SXM4 = {"name": "NVIDIA A100-SXM4-40GB", "arch": 7, "maxgen": 4, "gpumaxgen": 4, "gen": 4}


def hgx_nvml(links_per_gpu: int = 18, version: int = 6, inactive: dict | None = None, **gpu) -> list[dict]:
    """Eight H100 records for an NV18 HGX board: the captured H100 values (architecture 9, Hopper) with NVLinks
    as such a board reports them (state 1, version enum 6 = NVLink 4.0); `inactive` = {gpu: [links]} marks
    links down, as a fault would; `gpu` overrides captured fields (A100_SXM4: an A100 board, enum 5). Each Hopper
    GPU is registered with the NVLink fabric as a healthy HGX H100 says it: completed, Success, clique 0 and an
    all-zero cluster UUID outside a multi-node NVLink domain (meta-pytorch/torchcomms#1385), no health summary on
    "NVIDIA H100 80GB HBM3" (gpud's pkg/nvidia/nvml/device/fabric_state.go); NVML documents the fabric calls for
    Hopper and newer, so an A100 answers Not Supported."""
    base = {**h100_nvml_records()[0], **gpu}
    base.setdefault("fabric", HGX_FABRIC_REGISTERED if base.get("arch", 0) >= 9 else None)
    gpus = []
    for i in range(8):
        down = set((inactive or {}).get(i, []))
        gpus.append(dict(base, uuid=f"GPU-hgx-{i}", pci=f"00000000:{0x18 + i * 0x10:02x}:00.0", nvlink_count=links_per_gpu,
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


def make_ca_and_certs(tmp_path):
    """ca.pem, and server.pem/.key and client.pem/.key it signed, for 127.0.0.1 (openssl; skips without it)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")

    def run(*args):
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=nodecheck test CA")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (tmp_path / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", f"{name}.pem",
            "-days", "1", "-extfile", f"{name}.ext")


def metric_samples(text: str, leave_out=()) -> dict:
    """{(series name, sorted labels): value} of an exposition, the series named in `leave_out` left out."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name not in leave_out}


def replayed_and_live_metrics(fixture: Path, folder: Path, leave_out=()) -> tuple[dict, dict]:
    """The metrics `check --textfile-dir` writes from a captured snapshot, and those the node wrote live
    (`live-metrics.prom` beside it), each as metric_samples() gives them."""
    run = nodecheck("check", "--textfile-dir", str(folder), "--from", str(fixture))
    assert run.returncode == 0, run.stderr
    return (metric_samples((folder / "nodecheck.prom").read_text(), leave_out),
            metric_samples((fixture / "live-metrics.prom").read_text(), leave_out))


def promtool_check(text: str) -> subprocess.CompletedProcess:
    """`promtool check metrics` on an exposition (skips without promtool)."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (apt install prometheus)")
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)


def kubernetes_objects(name: str) -> dict[str, dict]:
    """The objects of deploy/kubernetes/NAME by kind (each kind once in a file)."""
    import yaml

    documents = [d for d in yaml.safe_load_all((REPO / "deploy/kubernetes" / name).read_text()) if d]
    by_kind = {d["kind"]: d for d in documents}
    assert len(by_kind) == len(documents), f"{name}: a kind twice"
    return by_kind


def finish_ranks(procs: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, dict, str]]:
    """(exit code, the Report a rank printed or {}, its stderr) of each launched `nodecheck bench` rank; a rank
    still running at the timeout is killed with its process group."""
    import signal

    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        results.append((proc.returncode, json.loads(out) if out.strip().startswith("{") else {}, err))
    return results


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's pick: never a fixed number)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def in_private_network(argv: list[str]) -> list[str]:
    """argv run in a network namespace of its own with loopback up (root): a fixed port there cannot
    meet another test suite's."""
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def wait_until(condition, seconds: float, what: str, pause: float = 0.1, tolerate: tuple = ()):
    """Poll `condition` until it returns something true, and return that; TimeoutError naming `what` once
    `seconds` have passed. An exception in `tolerate` counts as "not yet" (a server still starting)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            value = condition()
        except tolerate:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"waited {seconds:g} s for {what}")
        time.sleep(pause)


def fake_executable(path: Path, script: str) -> Path:
    """A stand-in for a real binary (nvidia-smi, a hung nodecheck): a shell script at `path`."""
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


# Keyword factories: a test names the fields it is about and takes harmless defaults for the rest.


def make_report(**fields) -> Report:
    """A Report of nothing (no probe, GPU or NIC) but the given fields."""
    base = dict(generated_at=0.0, source="test", node={}, probes=[], cpu=None, gpus=[], gpus_absent_reason=None,
                nics=[], links=[], paths=[])
    return Report(**{**base, **fields})


def make_gpu(index: int = 0, **fields) -> Gpu:
    return Gpu(index, **fields)


def make_nic(name: str = "eth0", **fields) -> Nic:
    """A physical Ethernet NIC, up at 10 Gb/s, unless told otherwise."""
    base = dict(kind="ethernet", virtual=False, state="up", speed_mbps=10000, mtu=1500, driver=None, pci_address=None,
                numa_node=None, mac=None)
    return Nic(name, **{**base, **fields})


def make_measurement(path: str = "allreduce:2-ranks", test: str = "allreduce", rate: float = 40e9, spec: float | None = 50e9,
                     payload: int = 1 << 30, method: str = "m", direction: str = "busbw",
                     details: dict | None = None) -> Measurement:
    """A completed measurement (busbw, 1 GiB unless told otherwise) whose ratio is rate / spec."""
    return Measurement.measured(path, test, rate, spec, payload, method, direction, details)


def write_pci_tree(snap: Path, devices: dict[str, tuple], aer: dict[str, dict[str, int]] | None = None) -> None:
    """PCI devices into a snapshot as sysfs lays them out: address -> (class, its path under /sys/devices,
    current width, max width[, max speed[, current speed: 32 GT/s unless given]]); `aer`: address -> {"correctable": n, "nonfatal": n, "fatal": n},
    written as the kernel writes aer_dev_* (TOTAL_ERR_* last)."""
    links = json.loads((snap / "fs-links.json").read_text()) if (snap / "fs-links.json").exists() else {}
    dirs = json.loads((snap / "fs-dirs.json").read_text()) if (snap / "fs-dirs.json").exists() else {}
    totals = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}
    for bdf, (kind, real, width, width_max, *speeds) in devices.items():
        folder = snap / "fs/sys/bus/pci/devices" / bdf
        folder.mkdir(parents=True)
        (folder / "class").write_text(kind + "\n")
        for name, value in (("current_link_width", width), ("max_link_width", width_max)):
            if value is not None:
                (folder / name).write_text(f"{value}\n")
        (folder / "current_link_speed").write_text(f"{speeds[1] if len(speeds) > 1 else '32.0 GT/s PCIe'}\n")
        if speeds:
            (folder / "max_link_speed").write_text(f"{speeds[0]}\n")
        for family, count in (aer or {}).get(bdf, {}).items():
            (folder / f"aer_dev_{family}").write_text(f"{totals[family]} {count}\n")
        links[f"/sys/bus/pci/devices/{bdf}"] = "../../../devices/" + real
    dirs["/sys/bus/pci/devices"] = sorted(set(dirs.get("/sys/bus/pci/devices", [])) | set(devices))
    (snap / "fs-links.json").write_text(json.dumps(links))
    (snap / "fs-dirs.json").write_text(json.dumps(dirs))


# from test_gpu_signals.py


def captured() -> dict:
    (gpu,) = [json.loads(line) for line in need(H100 / "nvml.json").read_text().splitlines() if line.strip()]
    return gpu


def report_of(tmp_path, gpu: dict, monkeypatch, samples=(), uptime: float = 1000.0):
    """The Report of a node whose NVML answers as `gpu` (dump_nvml through the stand-in, then the real build),
    with these earlier samples of its counters."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying([gpu]))
    snap = tmp_path / f"snap-{len(list(tmp_path.iterdir()))}"
    snap.mkdir()
    (snap / "nvml.json").write_text(json.dumps(dump_nvml()))
    report = build_report(SnapshotHost(snap))
    report.history = History("boot", [], list(samples), uptime)
    return report


# from test_fabric.py


def gpu_node_with_rdma(root, topo: str, nvml_gpus: list[dict], devices: list[tuple[str, str, str]]):
    """A GPU node: a published topology, NVML as such a board reports, and /sys/class/infiniband with
    these (device, rate, link layer) ports ACTIVE, as the kernel shows them."""
    snap = make_snapshot(root, topo=topo, nvml_gpus=nvml_gpus)
    for name, rate, layer in devices:
        port = snap / "fs/sys/class/infiniband" / name / "ports" / "1"
        port.mkdir(parents=True)
        for file, text in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("rate", rate), ("link_layer", layer)):
            (port / file).write_text(text + "\n")
    (snap / "fs/sys/class/net/lo").mkdir(parents=True)
    (snap / "fs/sys/class/net/lo/type").write_text("772\n")
    return build_report(SnapshotHost(snap))


def without_device_lines(log: Path, folder: Path) -> Path:
    """A published nccl-tests log as a paste without its device lines ("# Rank N ... device D [..] NAME"): it names no
    GPU, so it is held against whatever node a test gives it (another board's rows against a node's links). A log that
    names its GPUs is judged only on a node of their kind."""
    folder.mkdir(parents=True, exist_ok=True)
    kept = [line for line in need(log).read_text().splitlines() if not re.match(r"^(?:\[\d+,\d+\]<stdout>:|\d+: )?#?\s*Rank\s+\d+\s.*\bdevice\b", line)]
    out = folder / f"rows-of-{log.name}"
    out.write_text("\n".join(kept) + "\n")
    return out


def hgx_h100_with_ndr(tmp_path, storage_nic: bool = True):
    """An HGX H100 node: the published 8-GPU/8-NIC topology (one mlx5 per GPU), every rail an ACTIVE
    400 Gb/sec (4X NDR) port, plus a 100 Gb/s storage NIC near no GPU, as such nodes are built."""
    devices = [(f"mlx5_{i}", "400 Gb/sec (4X NDR)", "InfiniBand") for i in range(8)]
    devices += [("mlx5_8", "100 Gb/sec (4X EDR)", "InfiniBand")] if storage_nic else []
    return gpu_node_with_rdma(tmp_path / "hgx", "hgx-h100-8gpu-8nic-sglang30401.txt", hgx_nvml(), devices)


# from test_prometheus.py


def samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metrics_of(report, tmp_path) -> str:
    return write_textfile(report, tmp_path).read_text()


# from test_prolog.py
NODECHECK = str(Path(sys.executable).parent / "nodecheck")

# `scontrol show node vm --oneliner` on this machine's Slurm 22.05.8, drained by nodecheck
DRAINED_LINE = ("NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=2.91 "
                "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm "
                "Version=22.05.8 OS=Linux 6.18.44-fc-v769 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 "
                "FreeMem=22821 Sockets=2 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
                "MCS_label=N/A Partitions=debug  BootTime=2026-11-22T12:44:57 SlurmdStartTime=2026-11-22T17:38:47 "
                "LastBusyTime=2026-11-22T17:38:48 CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES= CapWatts=n/a "
                "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
                "Reason=nodecheck: gpu3 PCIe x8 < x16 (+1 more) [root@2026-11-22T17:41:00]\n")


def run_nodecheck(*args, env_extra=None, path_prefix=None, timeout=60):
    # as Slurm starts a prolog: no PATH, no SLURM_CONF; the suite's state directory, not the machine's
    env = {"SLURMD_NODENAME": "testnode", "STATE_DIRECTORY": os.environ["STATE_DIRECTORY"]}
    env.update(env_extra or {})
    if path_prefix:
        env["PATH"] = f"{path_prefix}:/usr/sbin:/usr/bin:/sbin:/bin"
    return subprocess.run([NODECHECK, *args], capture_output=True, text=True, timeout=timeout, env=env)


# from test_signal_join.py
GPU3 = "00000000:9B:00.0"


def report_with(*signals: Finding):
    from helpers import make_gpu

    hops = {"0000:9b:00.0": [Hop("0000:9b:00.0", 16, 16, None, None), Hop("0000:16:00.0", 16, 16, None, None)]}
    port = IbPort("mlx5_0", 1, "ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")
    nic = make_nic("ibp26s0", kind="infiniband", rdma_device="mlx5_0", ib_ports=[port])
    return make_report(gpus=[make_gpu(3, pci_bus_id=GPU3)], nics=[nic], pcie_paths=hops, findings=list(signals))


def h2d(ratio: float):
    return make_measurement("gpu3:host", "h2d", rate=ratio * 50e9, spec=50e9, direction="unidirectional",
                            details={"path_kind": "pcie"})


def judged(report, *measurements):
    return {f.kind: f for f in with_measurements(report, list(measurements), 0.0, Config()).findings}


# from test_serve.py


def start_serve(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nodecheck", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def wait_metrics(url: str, context=None, seconds: float = 30) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                text = response.read().decode()
                if "nodecheck_probe_success" in text:
                    return text
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} served no report within {seconds} s")


# from test_roce_gids.py
LINK_LOCAL = "fe80:0000:0000:0000:0ac0:ebff:feda:1cfb"

IPV4 = "0000:0000:0000:0000:0000:ffff:c800:d106"  # ::ffff:200.0.209.6

NCCL_769 = {0: (LINK_LOCAL, "IB/RoCE v1"), 1: (LINK_LOCAL, "RoCE v2"), 2: (IPV4, "IB/RoCE v1"), 3: (IPV4, "RoCE v2")}


class TreeHost(LiveHost):
    def addresses(self):
        return {}


def roce_node(root, table: dict, link_layer: str = "Ethernet"):
    """One RoCE HCA, mlx5_bond_0 (its netdev bond0, up), port 1 ACTIVE at 200 Gb/s, with this GID table."""
    sys_ = root / "sys"
    hca = "pci0000:00/0000:1a:00.0"
    for name, value in (("type", "1"), ("operstate", "up"), ("mtu", "4200"), ("speed", "200000")):
        sysfs_trees.write(sys_ / "devices" / hca / "net/bond0" / name, value)
    sysfs_trees.link(sys_ / "class/net/bond0", f"../../devices/{hca}/net/bond0")
    sysfs_trees.link(sys_ / "class/infiniband/mlx5_bond_0/device", f"../../../devices/{hca}")
    port = sys_ / "class/infiniband/mlx5_bond_0/ports/1"
    for name, value in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("rate", "200 Gb/sec (4X HDR)"),
                        ("link_layer", link_layer)):
        sysfs_trees.write(port / name, value)
    for index in range(255):  # the kernel lists every entry of the table, set or not
        gid, kind = table.get(index, (ZERO_GID, None))
        sysfs_trees.write(port / "gids" / str(index), gid)
        if kind is not None:
            sysfs_trees.write(port / "gid_attrs/types" / str(index), kind)
    return TreeHost(root)


# from test_prometheus_server.py


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def wait_for(check, what: str, deadline: float):
    return wait_until(check, max(0.0, deadline - time.monotonic()), what, pause=0.5, tolerate=(OSError,))


# from test_pcie_paths.py


def tree(snap, devices: dict[str, tuple]):
    """devices: PCI address -> (class, its path under /sys/devices, current width, max width[, max speed])."""
    write_pci_tree(snap, devices)
    return build_report(SnapshotHost(snap))

SWITCH = "pci0000:00/0000:00:01.0/0000:16:00.0"  # root port, then the switch's upstream port


def switch_node(tmp_path, uplink_width: int, uplink_speed: str = "32.0 GT/s PCIe"):
    """gpu0 (0000:18:00.0) and gpu1 (0000:28:00.0) behind one switch: root port x16, the switch's upstream
    port trained at `uplink_width` of x16, each downstream port and GPU at x16."""
    snap = make_snapshot(tmp_path / "hgx", topo="hgx-h100-8gpu-8nic-sglang30401.txt", nvml_gpus=hgx_nvml())
    return tree(snap, {
        "0000:00:01.0": ("0x060400", "pci0000:00/0000:00:01.0", 16, 16),
        "0000:16:00.0": ("0x060400", SWITCH, uplink_width, 16, uplink_speed),
        "0000:17:00.0": ("0x060400", f"{SWITCH}/0000:17:00.0", 16, 16),
        "0000:17:01.0": ("0x060400", f"{SWITCH}/0000:17:01.0", 16, 16),
        "0000:18:00.0": ("0x030200", f"{SWITCH}/0000:17:00.0/0000:18:00.0", 16, 16),
        "0000:28:00.0": ("0x030200", f"{SWITCH}/0000:17:01.0/0000:28:00.0", 16, 16),
    })


# from test_nccl_tests.py


def json_report(results, average=156.742, out_of_bounds=0):
    # the layout nccl-tests' src/util.cu writes with -J (JSON_FILE_VERSION 2)
    return json.dumps({"version": 2, "start_time": "2026-11-22 10:00:00", "args": ["all_reduce_perf", "-J", "r.json"],
                       "env": [], "nccl_version": 22809,
                       "config": {"nthreads": 1, "ngpus": 8, "devices": [{"rank": 0, "group": 0, "pid": 1, "hostname": "n1",
                                                                           "device": 0, "device_hex": "0000:18:00", "device_info": "NVIDIA H100 80GB HBM3"}]},
                       "results": results, "out_of_bounds": {"count": out_of_bounds, "okay": not out_of_bounds},
                       "average_bus_bandwidth": {"bandwidth": average, "okay": "unchecked"}, "errors": []})


# from test_imex.py
DEGRADED = (REPO / "tests/fixtures/imex/nvidia-imex-ctl-N-degraded.json").read_text()

NODE_3 = "10.76.186.255"  # node 3 of the sample


def tray(tmp_path, daemon: str | None = "READY\n", domain: str | None = DEGRADED, address: str = NODE_3,
         fabric: dict | None = None, failed: dict | None = None):
    """The real H100 node's sources with a GB200's fabric registration (a cluster and clique, gpud's GB200), this
    node's eth0 at `address`, and nvidia-imex-ctl's outputs (None: not in the snapshot; `failed`: sources.json
    entries replayed as the failures they record)."""
    snap = h100_node_snapshot(tmp_path / "tray")
    from gpu_fabric_cases import published  # it reads REPO and need from here

    make_snapshot(snap, nvml_gpus=[dict(h100_nvml_records()[0], fabric=fabric or published()["gb200-healthy"])])
    (snap / "addresses.json").write_text(json.dumps({"eth0": [{"family": "inet", "address": address, "prefixlen": 18}]}))
    for source, text in ((imex.DAEMON_SOURCE, daemon), (imex.DOMAIN_SOURCE, domain)):
        if text is not None:
            (snap / source).write_text(text)
    if failed:
        (snap / "sources.json").write_text(json.dumps(failed))
    return build_report(SnapshotHost(snap))


# from test_gpu_processes.py
OUTSIDE = "0::/user.slice/user-1000.slice/session-3.scope\n"

GIB = 1 << 30


def node(tmp_path, processes: list[dict], procs: dict[int, tuple[str, str, str]], **gpu) -> SnapshotHost:
    """A snapshot of the captured H100 whose NVML lists `processes`, with /proc/PID/stat and cgroup for `procs`
    ({pid: (comm, state, cgroup)}); a pid not in `procs` is not in /proc."""
    snap = make_snapshot(tmp_path / f"snap{len(list(tmp_path.iterdir()))}", nvml_gpus=[dict(captured(), processes=processes, **gpu)])
    for pid, (comm, state, cgroup) in procs.items():
        folder = snap / "fs" / "proc" / str(pid)
        folder.mkdir(parents=True)
        (folder / "stat").write_text(f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560 1234 0 0 0 5 3 0 0 20 0 1 0\n")
        (folder / "cgroup").write_text(cgroup)
    return SnapshotHost(snap)


class NoDeviceFileGate(LiveHost):
    """This machine's /proc, with NVML asked though it has no /dev/nvidiactl (the stand-in answers)."""

    def nvml(self, timeout, dump):
        return dump()


# from test_acs.py


def lspci_for_switch(redirect: bool) -> str:
    """The two downstream ports of tests/test_pcie_paths' switch, with the ACS lines of the AMD Milan
    bridges from the published capture (redirect on), or those of nccl#1405 (everything off)."""
    ctl = ("ACSCtl: SrcValid- TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-" if redirect else
           "ACSCtl: SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-")
    return "".join(f"0000:17:0{i}.0 PCI bridge: PLX Technology, Inc. PEX 88096\n"
                   "\tCapabilities: [220 v1] Access Control Services\n"
                   "\t\tACSCap: SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+\n"
                   f"\t\t{ctl}\n\n" for i in (0, 1))


def acs_findings(tmp_path, text: str | None):
    snap = tmp_path / "hgx"
    report = switch_node(tmp_path, uplink_width=16) if text is None else None
    if text is not None:
        snap.mkdir(parents=True)
        (snap / "lspci-vvv.txt").write_text(text)
        report = switch_node(tmp_path, uplink_width=16)
    return report, [f for f in report.findings if f.kind == "pcie_acs_redirect"]


NCCL_FORMS = REPO / "tests" / "fixtures" / "nccl-debug"  # published NCCL debug excerpts, each with its source (SOURCES.md)


def nccl_form(name: str) -> str:
    return (NCCL_FORMS / name).read_text()


def nccl_judged_alone(text: str):
    """A debug log's NcclRun and what it says by itself (held against a node with nothing of its own)."""
    from nodecheck.bench.nccl_debug import parse_nccl_debug
    from nodecheck.verdicts.nccl_run import nccl_findings

    run = parse_nccl_debug(text)
    return run, nccl_findings(run, Report.from_dict({}))
