"""NVML reader and parser. No GPU here: the reader runs against a pynvml stand-in that replays the
values NVML gave on a real H100 node (../shared/captures/h100-pcie-vm/nvml.json)."""

import json
import sys

import pytest
from fakes import fake_pynvml
from helpers import H100, need
from hypothesis import given, settings
from hypothesis import strategies as st

from nodecheck.core.errors import NoData, ParseError, ProbeFailed
from nodecheck.probes.nvml import dump_nvml, parse_nvml


def captured() -> list[dict]:
    return [json.loads(line) for line in need(H100 / "nvml.json").read_text().splitlines() if line.strip()]


@pytest.fixture
def replay(monkeypatch):
    def install(gpus, **kwargs):
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(gpus, **kwargs))
        return dump_nvml()
    return install


def test_h100_values_through_reader_and_parser(replay):
    dump = replay(captured())
    json.dumps(dump)  # a snapshot stores it as JSON
    facts = parse_nvml(dump)
    assert facts.driver_version == "580.159.04"
    (gpu,) = facts.gpus
    assert (gpu.name, gpu.pci_bus_id) == ("NVIDIA H100 80GB HBM3", "00000000:00:06.0")
    assert gpu.architecture == dump["gpus"][0]["architecture"] == 9  # NVML_DEVICE_ARCH_HOPPER, as captured
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max, gpu.pcie_gen_gpu_max) == (5, 5, 5)
    assert (gpu.pcie_width_current, gpu.pcie_width_max) == (16, 16)
    assert gpu.numa_node is None and "numa_node" in gpu.errors  # NotSupported on that VM: unknown, not 0
    assert gpu.nvlinks == [] and gpu.errors["nvlink"] == "Not Supported"
    assert gpu.cpu_affinity == "0-15"
    assert (gpu.ecc_enabled, gpu.remapped_rows_pending, gpu.remapped_rows_failed) == (True, False, False)


def test_nvlinks_state_and_version(replay):
    gpu = dict(captured()[0], nvlink=[[0, 1, 4], [1, 1, 4], [2, 0, 4]])
    (parsed,) = parse_nvml(replay([gpu])).gpus
    assert parsed.nvlinks == [(0, True, 4), (1, True, 4), (2, False, 4)]


def test_the_power_limit_in_force_and_the_default(replay):
    """700 W both, as the H100's `nvidia-smi -q` says ("Current Power Limit", "Default Power Limit"); one lowered
    with `nvidia-smi -pl 500` is read as NVML gives it, in mW; a refusal is unknown, not 0."""
    text = need(H100 / "nvidia-smi-q.txt").read_text()
    assert "Current Power Limit                            : 700.00 W" in text
    assert "Default Power Limit                            : 700.00 W" in text
    (gpu,) = parse_nvml(replay(captured())).gpus
    assert (gpu.power_limit_mw, gpu.power_limit_default_mw) == (700000, 700000)
    lowered = dict(captured()[0], power_limit=500000, power_limit_default="ERR Not Supported")
    (gpu,) = parse_nvml(replay([lowered])).gpus
    assert (gpu.power_limit_mw, gpu.power_limit_default_mw) == (500000, None) and "power_limit_default_mw" in gpu.errors


def test_an_nvidia_ml_py_without_the_architecture_call_records_why(replay, monkeypatch):
    module = fake_pynvml.replaying(captured())
    del module.nvmlDeviceGetArchitecture
    monkeypatch.setitem(sys.modules, "pynvml", module)
    dump = dump_nvml()
    assert dump["gpus"][0]["architecture"] == {"error": "not in this nvidia-ml-py"}
    assert parse_nvml(dump).gpus[0].architecture is None


def test_the_multi_gpu_check_script_prints_nvmls_values_beside_nodechecks_rate(monkeypatch, capsys):
    """benchmarks/nvml_nvlink_check.py, run here on the replayed A100 board: one row per GPU naming the
    architecture, the enum and nodecheck's 25 GB/s per link."""
    import runpy

    from helpers import A100_SXM4, REPO, hgx_nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(hgx_nvml(12, version=5, **A100_SXM4)))
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: its column says "-"
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(REPO / "benchmarks" / "nvml_nvlink_check.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    rows = lines[2:10]
    assert done.value.code == 0 and lines[0].endswith("- (NVML does not say)") and len(lines) == 18
    assert all("7 = Ampere" in row and " 5 " in row and "12/12      12 " in row and " 25.0 " in row and " not_supported "
               in row for row in rows)  # NVML answers the fabric calls for Hopper and newer
    assert lines[10] == "gpu0: error counters -; C2C -; bw mode - (Not Supported)"
    b200 = hgx_nvml(18, version=7, arch=10, name="NVIDIA B200", nvlink5={"symbol_errors": 0, "rx_errors": 0},
                    bw_mode={"bIsBest": 1, "bwMode": 0})
    b200[3] = dict(b200[3], bw_mode={"bIsBest": 0, "bwMode": 2})
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(b200, nvlink_bw_mode=3))
    with pytest.raises(SystemExit):
        runpy.run_path(str(REPO / "benchmarks" / "nvml_nvlink_check.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(": HALF") and all(" completed/Success " in row for row in lines[2:10])
    assert lines[10] == "gpu0: error counters rx_errors, symbol_errors (NVLink 5: 2); C2C -; bw mode best (mode 0)"
    assert lines[13].endswith("; bw mode reduced (mode 2)")


def test_no_driver_is_no_data(replay):
    with pytest.raises(NoData, match="no NVIDIA driver"):
        replay([], fail_init=fake_pynvml.NVMLError_LibraryNotFound("NVML Shared Library Not Found"))


def test_broken_driver_is_a_failure(replay):
    with pytest.raises(ProbeFailed, match="NVML initialisation failed"):
        replay([], fail_init=fake_pynvml.NVMLError("Unknown Error"))


@pytest.mark.parametrize("dump", [None, [], {"gpus": "x"}, {"gpus": [1]}, {"gpus": [{"pcie_gen_current": "five"}]},
                                  {"gpus": [{"nvlinks": [{"link": "a"}]}]}, {"gpus": [{"nvlinks": {}}]}])
def test_malformed_dumps_are_refused(dump):
    with pytest.raises(ParseError):
        parse_nvml(dump)


def test_placeholders_are_unknown_not_numbers():
    (gpu,) = parse_nvml({"gpus": [{"numa_node": -1, "pcie_width_current": -1}]}).gpus
    assert gpu.numa_node is None and gpu.pcie_width_current is None


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"gpus": st.lists(st.dictionaries(
    st.sampled_from(["index", "name", "pcie_gen_current", "numa_node", "ecc_mode", "remapped_rows",
                     "cpu_affinity_words", "nvlinks", "utilization_gpu"]), json_values, max_size=6), max_size=3)}))
def test_fuzz_only_parse_errors_escape(dump):
    try:
        parse_nvml(dump)
    except ParseError:
        pass


@pytest.mark.parametrize("printed,code", [("26.562", 0), ("13.281", 1)])
def test_the_check_script_compares_the_drivers_figure_like_with_like(monkeypatch, capsys, tmp_path, printed, code):
    """On Hopper `nvidia-smi nvlink -s` prints 26.562 GB/s per link, the links' signalling figure: the script compared
    it with NVLink 4's 25 GB/s of data and every healthy H100 read MISMATCH. It compares it now with what the driver
    prints on healthy Hopper (NVML's speed field, where given, else specs.toml's 26.562); half of it still mismatches."""
    import runpy

    from helpers import REPO, fake_executable, hgx_nvml

    fake_executable(tmp_path / "nvidia-smi", f'for i in 0 1; do echo "         Link $i: {printed} GB/s"; done')
    monkeypatch.setenv("PATH", str(tmp_path))
    for gpus in (hgx_nvml(), [dict(g, nvlink_speed=26562) for g in hgx_nvml()]):
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.replaying(gpus))
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(REPO / "benchmarks" / "nvml_nvlink_check.py"), run_name="__main__")
        rows = capsys.readouterr().out.splitlines()[2:10]
        assert done.value.code == code and all(f" 26.562  {float(printed):>10}  " in row for row in rows), rows[0]
        assert all(("MISMATCH" in row) == bool(code) for row in rows)
