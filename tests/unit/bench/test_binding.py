"""Binding to a GPU's CPUs inside a restricted cpuset, run under the real `taskset`."""

import json
import os
import shutil
import subprocess
import sys

import pytest

PROBE = "import json; from nodecheck.bench.binding import bind_to_gpu_cpus; print(json.dumps(bind_to_gpu_cpus({!r})))"


def bound(allowed: str, gpu_cpus: str) -> dict:
    if shutil.which("taskset") is None:
        pytest.skip("needs taskset (util-linux)")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    run = subprocess.run(["taskset", "-c", allowed, sys.executable, "-c", PROBE.format(gpu_cpus)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def first_two_cpus() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    return cpus[0], cpus[1]


def test_inside_the_allowed_set_binds_as_asked():
    a, b = first_two_cpus()
    result = bound(f"{a},{b}", f"{a}")
    assert result["cpus"] == f"{a}" and result["note"] is None


def test_partly_outside_binds_to_the_intersection_and_says_so():
    a, b = first_two_cpus()
    result = bound(f"{a}", f"{a},{b}")
    assert result["cpus"] == f"{a}" and "the part of the GPU's CPUs" in result["note"]


def test_wholly_outside_runs_unbound_and_says_so():
    a, b = first_two_cpus()
    result = bound(f"{b}", f"{a}")
    assert result["cpus"] == f"{b}" and "ran unbound" in result["note"] and result["requested"] == f"{a}"
