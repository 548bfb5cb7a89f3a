"""On a real NVIDIA node only (marker `gpu`): NVML and `nvidia-smi topo -m` for real, and a snapshot
taken there replayed through `inspect --from`. They skip elsewhere, saying why."""

import json
import shutil

import pytest
from helpers import nodecheck

from nodecheck.core.errors import NoData
from nodecheck.host.live import LiveHost
from nodecheck.probes.nvml import dump_nvml, parse_nvml
from nodecheck.probes.topo import ARGV, parse_topo_matrix

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nvml_facts():
    try:
        return parse_nvml(dump_nvml())
    except NoData as error:
        pytest.skip(f"no NVIDIA GPU here: {error}")


def test_real_nvml(nvml_facts):
    assert nvml_facts.gpus and nvml_facts.driver_version
    for gpu in nvml_facts.gpus:
        assert gpu.name and gpu.uuid.startswith("GPU-") and gpu.pci_bus_id
        assert gpu.pcie_gen_max and gpu.pcie_width_max and gpu.pcie_width_current <= gpu.pcie_width_max
        assert gpu.memory_total_bytes and gpu.memory_total_bytes > 1 << 30


def test_real_nvml_says_the_recovery_action_and_the_drivers_gpus(nvml_facts):
    """A healthy lent GPU asks for no recovery action (the captured H100, driver 580: "GPU Recovery Action: None"), every
    GPU NVML counts opens, and the kernel module's own list names each GPU NVML lists."""
    from nodecheck.core.pci import normal_pci

    assert nvml_facts.unopened == []
    assert {g.recovery_action for g in nvml_facts.gpus} <= {0, None}
    # persistence mode answered (the captured H100: "Persistence Mode: Enabled"); printed for the record
    print({f"gpu{g.index}": g.persistence_mode for g in nvml_facts.gpus})
    assert {g.persistence_mode for g in nvml_facts.gpus} <= {0, 1}
    managed = LiveHost().list_dir("/proc/driver/nvidia/gpus")
    assert {normal_pci(g.pci_bus_id) for g in nvml_facts.gpus} <= set(managed), managed


def test_real_nvml_says_the_memory_health(nvml_facts):
    """A healthy lent Hopper GPU: its SRAM status answered and under the threshold where nodecheck runs as root (the
    device machine's user), its InfoROM valid, and retired pages Not Supported (Hopper remaps rows); any other
    answer is printed, to be written down beside the capture's."""
    import os

    for gpu in nvml_facts.gpus:
        print(f"gpu{gpu.index} {gpu.name}: memory {gpu.memory}, refused {gpu.errors}")
        assert gpu.memory["sram_threshold_exceeded"] in ((False,) if os.geteuid() == 0 else (False, None))
        assert gpu.memory["inforom_valid"] in (True, None) and gpu.memory["retired_pages"] is None


def test_real_nvml_times_the_clock_events(nvml_facts):
    """The clock event counters (ns since the driver loaded, per DCGM's *_SLOWDOWN_NS fields): read on the lent H100's
    driver (its `nvidia-smi -q` lists "Clocks Event Reasons Counters"), none longer than the time since boot. Printed
    beside nvidia-smi's microseconds, so a GPU that did brake shows whether the unit is the one nodecheck assumes."""
    from nodecheck.probes.history import uptime_seconds

    uptime_ns = uptime_seconds(LiveHost()) * 1e9
    for gpu in nvml_facts.gpus:
        print(f"gpu{gpu.index} clock event ns {gpu.clock_event_ns}, refused {gpu.errors.get('clock_events')}")
        assert gpu.clock_event_ns is not None and set(gpu.clock_event_ns) == {
            "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}
        assert all(0 <= ns <= uptime_ns for ns in gpu.clock_event_ns.values())
    if shutil.which("nvidia-smi"):
        said = LiveHost().command("nvidia-smi-q-performance.txt", ["nvidia-smi", "-q", "-d", "PERFORMANCE"], timeout=30)
        print(said[said.find("Clocks Event Reasons Counters"):][:600])


def test_real_topo_matches_nvml(nvml_facts):
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not installed")
    topo = parse_topo_matrix(LiveHost().command("nvidia-smi-topo-m.txt", ARGV, timeout=30))
    assert [g.index for g in topo.gpus] == [g.index for g in nvml_facts.gpus]


MOMENTARY = ("utilization_percent", "memory_used_bytes", "processes")  # read again by the live run, a moment later


def lasting(gpus: list[dict]) -> list[dict]:
    """The GPUs less what changes from one read to the next: on the H100, 2026-11-28, NVML's memory in use was
    896 KiB in one `inspect` and 0 in the snapshot taken a second later, no process on the GPU."""
    return [{k: v for k, v in gpu.items() if k not in MOMENTARY} for gpu in gpus]


def test_snapshot_taken_on_gpu_node_replays(nvml_facts, tmp_path):
    assert nodecheck("snapshot", str(tmp_path / "gpu.tar.gz")).returncode == 0
    live = json.loads(nodecheck("inspect", "--json").stdout)
    replayed = json.loads(nodecheck("inspect", "--json", "--from", str(tmp_path / "gpu.tar.gz")).stdout)
    assert lasting(replayed["gpus"]) == lasting(live["gpus"]) and replayed["links"] == live["links"]
    assert all(p["bytes_per_second"] for p in replayed["paths"] if p["path"].endswith(":host"))


def test_real_nvml_lists_this_process_once_it_holds_a_context():
    """A CUDA context in this process (torch's), then NVML's list read through the probe: this pid is there, a
    compute process, ours, with its memory said (or None where NVML cannot say); the memory in use printed beside
    the capture's "Reserved: 480 MiB, Used: 0 MiB" of an idle H100."""
    import os

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    held = torch.ones(64 << 20, device="cuda:0")  # 256 MiB
    from nodecheck.probes.nvml import collect

    facts = collect(LiveHost(), 15.0)
    mine = [p for g in facts.gpus for p in g.processes if p["pid"] == os.getpid()]
    print({f"gpu{g.index}": (g.processes, g.memory_used_bytes) for g in facts.gpus})
    assert mine and mine[0]["ours"] and mine[0]["type"] in ("compute", "both"), mine
    assert mine[0]["memory_bytes"] is None or mine[0]["memory_bytes"] >= 256 << 20
    del held
