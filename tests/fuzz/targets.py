"""Every parser nodecheck runs on input it does not control, with the real captures it is seeded from
and the one error type it may raise. A target whose seeds are absent (../shared not beside the repo)
is skipped by the runner."""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fuzz.mutate import mutate_text, mutate_value
from fuzz.snapshot_target import Refused, mutate_snapshot, replayed, snapshot_seeds

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
SHARED = Path(os.environ.get("NODECHECK_SHARED", REPO.parent / "shared"))  # as tests/conftest.py
CAPTURES, PEER = SHARED / "captures", SHARED / "peer"


@dataclass
class Target:
    name: str
    seeds: Callable[[], list]  # real inputs (text, or the JSON-like values a reader hands the parser)
    call: Callable[[object], object]
    allowed: tuple[type[BaseException], ...]  # what the parser may raise: its own clear error
    structured: bool = False  # seeds are values (mutate_value), not text
    mutator: Callable | None = None  # a target's own mutation (a whole snapshot: some of its files)

    def mutate(self, seed, rng):
        if self.mutator is not None:
            return self.mutator(seed, rng)
        return mutate_value(seed, rng) if self.structured else mutate_text(seed, rng)


def _texts(*patterns: str, limit: int = 200_000) -> list[str]:
    files = [f for pattern in patterns for f in sorted(SHARED.glob(pattern)) if f.is_file() and f.stat().st_size <= limit]
    return [f.read_text(errors="replace") for f in files]


def _topo():
    from nodecheck.probes.topo import parse_topo_matrix

    return parse_topo_matrix


def _nvml_seeds() -> list:
    sys.path.insert(0, str(TESTS))
    from fakes import fake_pynvml

    from nodecheck.probes.nvml import dump_nvml

    records = [json.loads(line) for line in (CAPTURES / "h100-pcie-vm" / "nvml.json").read_text().splitlines() if line.strip()]
    saved = sys.modules.get("pynvml")
    sys.modules["pynvml"] = fake_pynvml.replaying(records)
    try:
        one = dump_nvml()
        # eight GPUs of an NVLink fabric, each as a published Fabric section says it
        from gpu_fabric_cases import published

        fabrics = list(published().values())
        # ... one of them fallen off the bus (NVML counts it and refuses its handle), one asking for a GPU reset, one
        # with a link asleep in its low-power state
        gpus = [dict(records[0], fabric=fabrics[i % len(fabrics)]) for i in range(8)]
        gpus[5] = fake_pynvml.NVMLError_GpuIsLost("GPU is lost")
        gpus[2] = dict(gpus[2], recovery=1, nvlink=[[0, 1, 6], [1, 0, 6]], nvlink_field_state={1: 2})
        # ... one past the SRAM threshold with a corrupted InfoROM, one a V100 with retired pages, one pending
        gpus[3] = dict(gpus[3], sram={"bThresholdExceeded": 1, "aggregateUncParity": 5}, inforom="corrupted")
        gpus[4] = dict(gpus[4], name="Tesla V100-SXM2-16GB", arch=5, sram="ERR", retired_pages={"sbe": 40, "dbe": 23},
                       retired_pending=1)
        # ... one a B200 whose NVLink 5 counters say, and one link NVML cannot read
        gpus[6] = dict(gpus[6], name="NVIDIA B200", arch=10, nvlink=[[0, 1, 7], [1, "ERR Unknown Error"], [2, 1, 7]],
                       nvlink5={"symbol_errors": 12, "recovery_events": 1, "rx_errors": "ERR"})
        # ... and one a Grace GPU with a C2C link down, on a node in NVLink bandwidth mode HALF
        gpus[7] = dict(gpus[7], name="NVIDIA GB200", arch=10, c2c=[(1, 44712)] * 4 + [(0, 44712)])
        # ... one that has spent time on its hardware brakes, and one whose driver keeps no clock event counters
        gpus[0] = dict(gpus[0], clock_event_ns={"hw_thermal_slowdown": 12 * 10**9, "sw_thermal_slowdown": 3 * 10**9})
        gpus[1] = dict(gpus[1], clock_event_ns="ERR")
        # ... and one held by two processes, a display server's and one whose memory NVML cannot say, 10 GiB in use
        gpus[3] = dict(gpus[3], memory_total=85520809984, memory_used=10 << 30,
                       processes=[{"pid": 4242, "used_memory": 30 << 30}, {"pid": 900, "used_memory": None, "graphics": True}])
        sys.modules["pynvml"] = fake_pynvml.replaying(gpus, nvlink_bw_mode=3)
        eight = dump_nvml()
    finally:
        sys.modules.pop("pynvml", None) if saved is None else sys.modules.__setitem__("pynvml", saved)
    # and the dump that the lent H100 wrote itself, every error source read live (issue 26, 2026-11-28)
    live = json.loads((TESTS / "fixtures/h100-vm-signals/nvml.json").read_text())
    return [one, eight, live]


def _nic_seeds() -> list:
    """What the NIC reader hands parse_nics, read through the real reader from the peer sysfs trees."""
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.probes.nics import read_netdev, read_rdma_device

    seeds = []
    for tree in sorted((PEER / "sysfs").glob("*/")):
        host = SnapshotHost(tree)
        netdevs = {name: read_netdev(host, name) for name in host.list_dir("/sys/class/net")}
        rdma = {name: read_rdma_device(host, name) for name in host.list_dir("/sys/class/infiniband")}
        addresses = {"eth0": [{"family": "inet", "address": "198.18.0.2", "prefixlen": 24}]}
        route = (REPO / "tests/fixtures/cpu-vm-2core/fs/proc/net/route").read_text()
        seeds.append({"netdevs": netdevs, "rdma": rdma, "addresses": addresses, "route": route})
    roce = json.loads(json.dumps(seeds[-1])) if seeds else None
    for raw in (roce or {}).get("rdma", {}).values():  # a RoCE port with NVIDIA/nccl#769's real GID table
        for port in (raw.get("ports") or {}).values():
            link_local, ipv4 = "fe80:0000:0000:0000:0ac0:ebff:feda:1cfb", "0000:0000:0000:0000:0000:ffff:c800:d106"
            port.update(link_layer="Ethernet", state="4: ACTIVE", gids={"0": link_local, "1": link_local, "2": ipv4, "3": ipv4},
                        gid_types={"0": "IB/RoCE v1", "1": "RoCE v2", "2": "IB/RoCE v1", "3": "RoCE v2"})
    return seeds + ([roce] if roce else [])


def _resource_slice_seeds() -> list:
    """The API server's answers, as the published ResourceSlices of tests/fixtures/kubernetes make them."""
    import yaml

    eks = yaml.safe_load((TESTS / "fixtures/kubernetes/resourceslices-eks-h100x8-v1.yaml").read_text())
    p100 = yaml.safe_load((TESTS / "fixtures/kubernetes/resourceslice-p100-v1beta1.yaml").read_text())
    return [eks, {"items": [p100]}]


def _mapped_slices(value):
    from nodecheck.kubernetes.resource_slices import map_gpus, slice_devices

    for node in ("ip-100-64-147-149.ec2.internal", "192.168.140.59"):
        devices, _ = slice_devices(value if isinstance(value, dict) else {}, node)
        map_gpus(devices, [(0, "GPU-b87512d7-c8a6-5f4b-8d3f-68183df62d66", "00000000:53:00.0"), (1, None, "0000:00:0b.0")])


def _taint_rule_seeds() -> list:
    """DeviceTaintRuleLists as the API server answers nodecheck's list: its own rules (as it writes them, with what
    the server adds) beside the example rule of Kubernetes' device-taints documentation."""
    from nodecheck.kubernetes.device_taint_rules import Rule, rule_object

    node = "ip-100-64-147-149.ec2.internal"
    own = [rule_object(Rule(f"nodecheck.{node}.gpu-{i}.gpu-xid.0", "gpu.nvidia.com", node, f"gpu-{i}", "nodecheck/gpu_xid",
                            f"gpu{i}", f"gpu{i} Xid 79"), node, "NoSchedule", "v1", str(100 + i), "2026-11-18T11:06:40Z")
           for i in range(3)]
    example = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": "example"},
               "spec": {"deviceSelector": {"driver": "dra.example.com", "pool": "my-pool", "device": "some-device"},
                        "taint": {"key": "dra.example.com/unhealthy", "value": "Broken", "effect": "NoExecute"}}}
    return [{"kind": "DeviceTaintRuleList", "apiVersion": "resource.k8s.io/v1", "metadata": {"resourceVersion": "9"},
             "items": [*own, example]}]


def _held_rules(value):
    from nodecheck.kubernetes.device_taint_rules import Rule, held_rules, same

    held, _ = held_rules(value if isinstance(value, dict) else {}, "ip-100-64-147-149.ec2.internal")
    rule = Rule("r", "gpu.nvidia.com", "p", "gpu-0", "nodecheck/gpu_xid", "gpu0", "m")
    for one in held.values():
        same(one, rule, "NoSchedule")


def _parse_nics(value):
    from nodecheck.probes.nics import parse_nics

    if not isinstance(value, dict):
        from nodecheck.core.errors import ParseError
        raise ParseError("not a reader's output")
    return parse_nics(value.get("netdevs"), value.get("rdma"), value.get("addresses"),
                      value.get("route") if isinstance(value.get("route"), str) else None)


def _config_seeds() -> list[str]:
    readme = (REPO / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```toml\n")[1:]]
    sys.path.insert(0, str(TESTS))
    import tempfile

    from helpers import h100_node_snapshot  # noqa: F401 (needs pytest only for need(): present in the suite)

    from nodecheck.config.init import generate
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.pipeline import build_report

    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(build_report(SnapshotHost(h100_node_snapshot(Path(tmp) / "h"))))
    return blocks + [generated]


def _web_config_seeds() -> list[str]:
    import bcrypt

    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    return [f"basic_auth_users:\n  prometheus: {hashed}\n  other: {hashed}\n",
            "tls_server_config:\n  cert_file: /etc/nodecheck/tls.crt\n  key_file: /etc/nodecheck/tls.key\n"
            "  client_ca_file: /etc/nodecheck/ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n"
            f"basic_auth_users:\n  prometheus: '{hashed}'\n"]


def _affinity_seeds() -> list[str]:
    import re

    values = set()
    for text in _texts("captures/public/topo/*.txt", "captures/h100-pcie-vm/nvidia-smi-topo-m.txt"):
        values.update(re.findall(r"\b\d+(?:-\d+)?(?:,\d+(?:-\d+)?)+\b|\b\d+-\d+\b", text))
    return sorted(values)


def _scontrol_line() -> list[str]:
    sys.path.insert(0, str(TESTS))
    from helpers import DRAINED_LINE

    return [DRAINED_LINE, DRAINED_LINE.replace("IDLE+DRAIN", "MIXED").split(" Reason=")[0]]


def _kube_node(node) -> tuple:
    """What `serve --kubernetes-conditions` reads from the API server's answer: nothing may escape."""
    from nodecheck.kubernetes.node_health import node_conditions, node_taints, node_uid, taints_with

    taints, version = node_taints(node)
    return node_conditions(node), node_uid(node), version, taints_with(taints, True), taints_with(taints, False)


def _kmsg_seeds() -> list[str]:
    """The real Xid lines as /dev/kmsg records: from boot (numbered from 0) and from a wrapped ring buffer."""
    lines = [line.split("] ", 1)[-1] for text in _texts("captures/public/health/xid/*.log") for line in text.splitlines()]
    return [f"{start}" + "".join(f"4,{first + n},{8312000001 + n},-;{line}\n" for n, line in enumerate(lines))
            for start, first in (("", 0), ("", 48211), ("6,0,0,-;Linux version 6.8.0\n", 1))]


# real GB200 NVLink 5 Xid lines gpud's parser is tested on (leptonai/gpud @4a8de33a3f
# components/accelerator/nvidia/xid/kmsg_extended_test.go), as dmesg prints them
GB200_NVLINK5_LINES = (
    "[ 8312.000001] NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 "
    "Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)\n"
    "[ 8313.000002] NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 "
    "0x00000000 0x00000000 0x00000000)\n")


# a ConnectX NIC's module and slot power events, as gpud quotes mlx5_core's lines (tests/unit/checks/test_nic_kernel_events.py)
MLX5_LINES = (
    "[ 8400.000001] mlx5_core 0000:5c:00.0: mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, "
    "Cable error, High Temperature\n"
    "[ 8401.000002] mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe "
    "slot (27W).\n")


# the driver's three-line fallen-off-the-bus record as dmesg prints it (NVIDIA/NVSentinel#155, driver 570.158.01)
OFF_BUS_RECORD = (
    "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
    "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
    "               NVRM: fallen off the bus and is not responding to commands.\n"
    "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).\n")


def _kernel_log_seeds() -> list[str]:
    return (_texts("captures/public/health/xid/*.log") + [GB200_NVLINK5_LINES, MLX5_LINES, OFF_BUS_RECORD]
            + [p.read_text() for p in sorted((TESTS / "fixtures/kernel-log").glob("*.txt"))])


def _kernel_log_words(text: str):
    """The events, and what each one's line says of itself (the NVLink 5 severity and link read from it); a pasted
    log's AER lines, judged as `kernel-log` judges them."""
    from nodecheck.checks.aer_log import aer_log_findings
    from nodecheck.probes.kernel_aer import parse_aer_events
    from nodecheck.probes.kernel_log import parse_kernel_log

    aer = parse_aer_events(text)
    return [(event, event.driver_word, event.link) for event in parse_kernel_log(text)], aer, aer_log_findings(aer)


def _kernel_log_source(text: str):
    from nodecheck.probes.kernel_log import KMSG, _lost_before, parse_kernel_log

    return parse_kernel_log(text), _lost_before(KMSG, text), _lost_before("journalctl", text)


def _state_seeds() -> list:
    """A state file as nodecheck writes it: an acknowledgement, a sample and the events of a real log."""
    import tempfile

    from nodecheck.host.state import STATE_FILE, acknowledge, boot_id, record_round
    from nodecheck.probes.kernel_log import parse_kernel_log
    from nodecheck.report.events import Acknowledgement, CounterSample, LogMemory

    events = [e for text in _kmsg_seeds()[:1] for e in parse_kernel_log(text)]
    with tempfile.TemporaryDirectory() as directory:
        acknowledge(Acknowledgement("gpu_xid", "gpu3", 8312000001, 1, "ops", 1.0), Path(directory))
        record_round(CounterSample(9000.0, {"aer/0000:47:00.0/correctable": 3}), 10.0, LogMemory(events, None, 9_000_000_000),
                     boot_id(), Path(directory))
        return [json.loads((Path(directory) / STATE_FILE).read_text())]


def _history(state) -> object:
    from nodecheck.probes.history import history_from

    return history_from({"boot_id": state.get("boot_id") if isinstance(state, dict) else None, "state": state})


def _report_seeds() -> list:
    """Reports as nodes write them for `nodecheck fleet`: the example HGX node's, and the example job's bench
    Report with its measurements (both built from real captures: examples/README.md)."""
    import subprocess

    inspect = subprocess.run([sys.executable, "-m", "nodecheck", "inspect", "--json", "--from", str(REPO / "examples/hgx-h100-8gpu")],
                             capture_output=True, text=True, timeout=120)
    job = json.loads((REPO / "examples/job-8node-allreduce.json").read_text())
    # ... and the job's node ten days up with its state read, one GPU braked a day of it (the fleet's brake share)
    braked = dict(job, history={"boot_id": "b", "acknowledgements": [], "samples": [], "uptime_s": 864000.0})
    braked["gpus"] = [dict(g, signals=dict(g["signals"], clock_event_ns=dict(g["signals"]["clock_event_ns"],
                                                                             hw_power_brake_slowdown=86400 * 10**9)))
                      if g["index"] == 3 else g for g in job["gpus"]]
    return [json.loads(inspect.stdout), job, braked]


def _fleet_node(document) -> object:
    """What `nodecheck fleet DIR` does with each node's file: the Report, then the node's view of it."""
    from nodecheck.fleet import node_view
    from nodecheck.report.model import Report

    return node_view(Report.from_dict(document), "node")


def _shown_report(document) -> str:
    """What `inspect --from REPORT.json` does with a saved Report: read it, then render it as text."""
    import io

    from rich.console import Console

    from nodecheck.render.report import render
    from nodecheck.report.model import Report

    out = io.StringIO()
    render(Report.from_dict(document), Console(file=out, width=160), saved_in="fuzz.json")
    return out.getvalue()


def _judged_again(document) -> list:
    """What `config check --from REPORT.json` does with a saved Report: read it, then judge its facts with a config
    of expectations (the example node's, as `config init` writes it, with every test in [prolog] bench), and its
    measurements by that config's thresholds, as the prolog would count them."""
    from nodecheck.config import loads
    from nodecheck.config.init import generate
    from nodecheck.pipeline import judged_again
    from nodecheck.report.model import BENCH_TESTS, Report
    from nodecheck.verdicts.config_check import as_the_prolog_judges

    bench = "\n[prolog]\nbench = [" + ", ".join(f'"{test}"' for test in BENCH_TESTS) + "]\n"
    config = loads(generate(_example_node()) + bench, "fuzz.toml")
    findings, lines = as_the_prolog_judges(config, judged_again(Report.from_dict(document), config))
    return findings + lines


@functools.lru_cache(maxsize=1)
def _example_node():
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.pipeline import build_report

    return build_report(SnapshotHost(REPO / "examples/hgx-h100-8gpu"))


def _judged_imex(text: str) -> list:
    """`nvidia-imex-ctl -N -j` parsed and judged on the example node, its GPUs in a multi-node NVLink domain."""
    import dataclasses

    from nodecheck.checks.imex import imex_findings
    from nodecheck.probes.imex import parse_domain
    from nodecheck.report.model import GpuFabric, Imex

    domain, nodes = parse_domain(text)
    node = _example_node()
    in_domain = [dataclasses.replace(g, fabric=GpuFabric("completed", "Success", 4026, "9c6f5af3-53bf-49b5-a436-b66766c413c3"))
                 for g in node.gpus]
    return imex_findings(dataclasses.replace(node, gpus=in_domain, imex=Imex("READY", domain, nodes)), None)


def _nccl_conf_seeds() -> list[str]:
    """NCCL's documented example of the file, and one an HGX image ships (rails by name, a GID index, a topology
    file), with a comment and a line of shell syntax NCCL does not read."""
    return ["NCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME==ens1f0\n",
            "# rails\nNCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1\nNCCL_IB_GID_INDEX=3\r\n"
            "NCCL_TOPO_FILE=/etc/nccl/topo.xml\nexport NCCL_P2P_DISABLE=1\n"]


def _judged_nccl_conf(text: str) -> list:
    """What the platform probe and the rules do with the file on the example HGX node."""
    import dataclasses

    from nodecheck.checks.nccl_conf import nccl_conf_findings
    from nodecheck.probes.platform import parse_nccl_conf
    from nodecheck.report.model import Platform

    report = dataclasses.replace(_example_node(), platform=Platform(None, False, nccl_conf=parse_nccl_conf(text)))
    return nccl_conf_findings(report)


def _served_measurements(document) -> bytes:
    """What `serve --measurements FILE` does with the file a bench run wrote: read, judged against the node's
    Report, published."""
    import tempfile

    from nodecheck.bench.plan import read_measurements_file
    from nodecheck.prometheus.exposition import exposition
    from nodecheck.verdicts.bandwidth import with_measurements

    with tempfile.NamedTemporaryFile("w", suffix=".json") as out:
        json.dump(document, out)
        out.flush()
        measurements, when = read_measurements_file(out.name)
    return exposition(with_measurements(_example_node(), measurements, when or 0.0, None))


def _beat_seeds() -> list:
    """Two readings of a 4-rank job's beats as the store holds them (what Heartbeat._beat writes), rank 2's counter
    standing still between them."""
    def beat(rank: int, n: int) -> str:
        return json.dumps({"n": n, "node": f"node{rank}", "pid": 4000 + rank, "step": "all-reduce of 32 MiB: timed call 2 of 3",
                           "for_s": 6.0})
    return [[[beat(r, 7) for r in range(4)], [beat(r, 7 if r == 2 else 12) for r in range(4)]]]


class _ReadOnlyStore:
    """A store holding the given beat texts, answering as torch's TCPStore does (check, multi_get)."""

    def __init__(self, texts) -> None:
        self.values = {f"nodecheck/beat/{r}": str(t).encode("utf-8", "surrogateescape") for r, t in enumerate(texts)}

    def check(self, keys) -> bool:
        return all(k in self.values for k in keys)

    def multi_get(self, keys) -> list[bytes]:
        return [self.values[k] for k in keys]


def _judged_beats(readings) -> str:
    """What a stalled rank does with two readings of the store: read_beats on each, then judge."""
    from nodecheck.bench.heartbeat import judge, read_beats

    first, second = (readings + [[], []])[:2] if isinstance(readings, list) else ([], [])
    texts = [t if isinstance(t, list) else [t] for t in (first, second)]
    return judge(read_beats(_ReadOnlyStore(texts[0]), len(texts[0])), read_beats(_ReadOnlyStore(texts[1]), len(texts[1])),
                 0, "all-reduce of 32 MiB: timed call 2 of 3", 12.0, world=4)


def _sidecar_seeds() -> list[str]:
    """A worker's step file as its watch thread writes it, with a finding."""
    import tempfile

    from nodecheck.bench.heartbeat import Heartbeat, Step, sidecar

    with tempfile.TemporaryDirectory() as tmp:
        current = Step()
        current("all-reduce of 1024 MiB: timed call 3 of 5")
        beat = Heartbeat(lambda: None, 0, 2, "node0", f"{tmp}/allreduce.json", 2.0, current=current)
        beat.diagnosis, beat.diagnosed_since = "rank 1 (node1, pid 4242) at 'x' stopped beating in the job's store", current.since
        beat._say()
        return [sidecar(f"{tmp}/allreduce.json").read_text()]


def _where_it_was(text: str):
    import tempfile

    from nodecheck.bench.heartbeat import sidecar, where_it_was

    with tempfile.TemporaryDirectory() as tmp:
        sidecar(f"{tmp}/out.json").write_text(text, errors="surrogateescape")
        return where_it_was(f"{tmp}/out.json", killed=True)


def _judged_inspector(text: str) -> object:
    """The file read, then every rank's records judged as `nccl-job` judges them."""
    from nodecheck.job.inspector import parse_inspector
    from nodecheck.job.ranks import judge_job

    return judge_job(parse_inspector(text).ops)


def _judged_ras(text: str) -> object:
    from nodecheck.job.ras import parse_ras
    from nodecheck.job.stuck import judge_ras

    return judge_ras(parse_ras(text))


def _judged_ras_json(text: str) -> object:
    from nodecheck.job.ras_json import parse_ras_json
    from nodecheck.job.stuck import judge_ras

    return judge_ras(parse_ras_json(text))


def _judged_inspector_prom(text: str) -> object:
    from nodecheck.job.inspector_prom import parse_inspector_prom
    from nodecheck.job.peers import judge_peers

    return judge_peers(parse_inspector_prom(text)[0])


def _split_rows() -> list[str]:
    """Real rows that NCCL's real debug records split, with MPICH's tags and glued (tests/nccl_split_rows.py)."""
    from nccl_split_rows import split_log

    return [split_log(tagged=True), split_log(tagged=False)]


def _checked_nccl_tests(text: str):
    """An nccl-tests log read, and its own data check said and judged as `bench --nccl-log` does."""
    from nodecheck.bench.nccl_tests import check_said, failed_check, parse_nccl_log, separate_runs
    from nodecheck.bench.nccl_tests_job import one_rank

    log = parse_nccl_log(text)
    return log, failed_check(log), check_said(log), separate_runs(log), one_rank(log)


def _nccl_debug_judged(text: str):
    """An NCCL debug log read and judged as `nccl-log --from examples/hgx-h100-8gpu` judges it."""
    from nodecheck.bench.nccl_debug import parse_nccl_debug
    from nodecheck.verdicts.nccl_run import nccl_findings, other_node

    run = parse_nccl_debug(text)
    return run, nccl_findings(run, _example_report()), other_node(run, _example_report(), "the example")


@functools.cache
def _example_report():
    from nodecheck.host.snapshot import SnapshotHost
    from nodecheck.pipeline import build_report

    return build_report(SnapshotHost(REPO / "examples" / "hgx-h100-8gpu"))


def targets() -> list[Target]:
    from nodecheck.config import loads
    from nodecheck.core import units
    from nodecheck.core.errors import ConfigError, NodecheckError, ParseError
    from nodecheck.probes.acs import parse_lspci
    from nodecheck.probes.aer import parse_aer_file
    from nodecheck.probes.ib_counters import parse_counter
    from nodecheck.probes.lstopo import parse_lstopo_xml
    from nodecheck.probes.nccl_topo import parse_nccl_topo_log, parse_nccl_topo_xml
    from nodecheck.probes.nics import parse_proc_route
    from nodecheck.probes.nvml import parse_nvml
    from nodecheck.prometheus.http import parse_request
    from nodecheck.prometheus.webconfig import parse_web_config
    from nodecheck.slurm.proximity import expand_nodelist
    from nodecheck.slurm.scontrol import parse_node

    return [
        Target("topo", lambda: _texts("captures/public/topo/*.txt", "captures/h100-pcie-vm/nvidia-smi-topo-m.txt"),
               _topo(), (ParseError,)),
        Target("lstopo", lambda: _texts("captures/public/lstopo/*.xml", "captures/h100-pcie-vm/lstopo.xml",
                                        "peer/hwloc-xml/v1.11_*.xml", "peer/hwloc-xml/master_linux_allowed*.xml",
                                        limit=120_000), parse_lstopo_xml, (ParseError,)),
        Target("nccl_topo", lambda: [p.read_text() for p in sorted((TESTS / "fixtures/nccl-topo").glob("*.xml"))],
               parse_nccl_topo_xml, (ParseError,)),
        Target("nccl_topo_log", lambda: [p.read_text() for p in sorted((TESTS / "fixtures/nccl-topo").glob("*.txt"))],
               parse_nccl_topo_log, (ParseError,)),
        Target("nccl_inspector", lambda: [p.read_text() for p in sorted((TESTS / "fixtures/nccl-inspector").glob("*.log"))],
               _judged_inspector, (ParseError,)),
        Target("nccl_inspector_prom", lambda: [p.read_text() for p in sorted((TESTS / "fixtures/nccl-inspector").glob("*.prom"))],
               _judged_inspector_prom, (ParseError,)),
        Target("nccl_ras", lambda: [p.read_text() for p in sorted((TESTS / "fixtures/nccl-ras").glob("*.txt"))],
               _judged_ras, (ParseError,)),
        Target("nccl_ras_json", lambda: [p.read_text() for p in sorted((TESTS / "fixtures/nccl-ras").glob("*.json"))],
               _judged_ras_json, (ParseError,)),
        Target("dra_resource_slices", _resource_slice_seeds, _mapped_slices, (), structured=True),
        Target("dra_device_taint_rules", _taint_rule_seeds, _held_rules, (), structured=True),
        Target("nvml", _nvml_seeds, parse_nvml, (ParseError,), structured=True),
        Target("nics", _nic_seeds, _parse_nics, (ParseError,), structured=True),
        Target("proc_route", lambda: [(REPO / "tests/fixtures/cpu-vm-2core/fs/proc/net/route").read_text()],
               parse_proc_route, (ParseError,)),
        Target("nccl_tests", lambda: _texts("captures/public/nccl/*.txt") + [
            p.read_text() for p in sorted((TESTS / "fixtures/nccl-tests").glob("*.txt"))] + _split_rows(),
               _checked_nccl_tests, (ParseError,)),
        Target("nccl_debug", lambda: _texts("captures/public/nccl-debug/*.txt") + _split_rows()
               + [p.read_text() for p in sorted((TESTS / "fixtures/nccl-debug").glob("*.txt"))], _nccl_debug_judged, (ParseError,)),
        Target("lspci", lambda: _texts("captures/public/lspci/*.txt"), parse_lspci, (ParseError,)),
        Target("kernel_log", _kernel_log_seeds, _kernel_log_words, (ParseError,)),
        Target("kernel_log_source", _kmsg_seeds, _kernel_log_source, (ParseError,)),
        Target("state", _state_seeds, _history, (), structured=True),
        Target("aer", lambda: _texts("captures/public/health/aer/**/aer_dev_*"), parse_aer_file, ()),
        Target("ib_counter", lambda: _texts("captures/public/health/ib/**/counters/*", "captures/public/health/ib/**/hw_counters/*"),
               parse_counter, ()),
        Target("nccl_conf", _nccl_conf_seeds, _judged_nccl_conf, ()),
        Target("imex", lambda: [(TESTS / "fixtures/imex/nvidia-imex-ctl-N-degraded.json").read_text()], _judged_imex,
               (ParseError,)),
        Target("config", _config_seeds, lambda text: loads(text, "fuzz.toml"), (ConfigError,)),
        Target("web_config", _web_config_seeds, lambda text: parse_web_config(text, "fuzz.yml"), (ConfigError,)),
        Target("cpulist", _affinity_seeds, units.parse_cpulist, (ValueError,)),
        Target("rate", lambda: ["100Gbit/s", "1.25GB/s", "400 Gb/s", "12 GiB/s"], units.parse_rate, (ValueError,)),
        Target("count", lambda: ["25M", "7B", "1.3e9", "175b"], units.parse_count, (ValueError,)),
        Target("http_request", lambda: ["GET /metrics HTTP/1.1\r\nHost: node:10042\r\nAccept: text/plain\r\n"
                                        "Authorization: Basic cHJvbWV0aGV1czpzM2NyZXQ=\r\n\r\n",
                                        "GET /metrics HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"],
               lambda text: parse_request(text.encode("utf-8", "surrogateescape")), ()),
        Target("scontrol_node", _scontrol_line, lambda text: parse_node("vm", text), (NodecheckError,)),
        Target("nodelist", lambda: ["gpu[01-04,07],login1", "rack[1-2]-n[001-128]", "a,b,c"], expand_nodelist,
               (ParseError,)),
        Target("fleet_report", _report_seeds, _fleet_node, (NodecheckError, ValueError, RecursionError), structured=True),
        Target("saved_report", _report_seeds, _shown_report, (ValueError, RecursionError), structured=True),
        Target("judged_report", _report_seeds, _judged_again, (ValueError, RecursionError), structured=True),
        Target("served_measurements", lambda: [json.loads((REPO / "examples/job-8node-allreduce.json").read_text())],
               _served_measurements, (NodecheckError,), structured=True),
        Target("heartbeat_beats", _beat_seeds, _judged_beats, (), structured=True),
        Target("heartbeat_sidecar", _sidecar_seeds, _where_it_was, ()),
        Target("kube_node", lambda: [json.loads((TESTS / "fixtures/kubernetes/node-hgx.json").read_text())], _kube_node, (),
               structured=True),
        Target("snapshot", snapshot_seeds, replayed, (Refused,), mutator=mutate_snapshot),
    ]
