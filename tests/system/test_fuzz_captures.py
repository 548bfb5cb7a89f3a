"""Every parser, fed real captures mutated the way broken tools and attackers mutate them (numbers,
ranges, separators, types, lines; tests/fuzz/mutate.py): nothing escapes but the parser's own error,
no input takes seconds, and memory stays under a cap. 300 inputs per parser here, with a fixed seed
(the same inputs every run); `tests/fuzz/run.py --per-parser 10000` is the long run."""

import subprocess
import sys

import pytest
from helpers import REPO, SHARED

TARGETS = ["topo", "lstopo", "nccl_topo", "nccl_topo_log", "nccl_inspector", "nccl_inspector_prom", "nccl_ras", "nccl_ras_json", "dra_resource_slices", "dra_device_taint_rules", "nvml", "nics", "proc_route", "nccl_tests", "nccl_debug", "lspci", "kernel_log", "kernel_log_source", "state", "aer", "ib_counter", "nccl_conf", "imex", "config", "web_config", "cpulist",
           "rate", "count", "http_request", "scontrol_node", "nodelist", "fleet_report", "saved_report", "judged_report", "served_measurements", "heartbeat_beats", "heartbeat_sidecar", "kube_node",
           "snapshot"]


def test_every_target_is_listed():
    sys.path.insert(0, str(REPO / "tests"))
    from fuzz.targets import targets

    assert [t.name for t in targets()] == TARGETS


@pytest.mark.parametrize("target", TARGETS)
def test_mutated_captures_raise_only_the_parsers_own_error(target):
    if not (SHARED / "captures").is_dir():
        pytest.skip("../shared/captures is absent: the fuzzer's seeds are real captures")
    run = subprocess.run([sys.executable, str(REPO / "tests/fuzz/run.py"), "--only", target, "--per-parser", "300",
                          "--seed", "7", "--memory-mib", "2048", "--seconds", "20"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and " 300 inputs      0 escapes" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
