"""Finding the GPU nodecheck means among the CUDA devices a process sees: by UUID, then PCI bus id,
then (only when torch reports neither) by index; a hidden GPU is named, never silently swapped."""

import pytest

from nodecheck.bench.identity import pick_cuda_device
from nodecheck.core.pci import normal_pci

# as CUDA numbers them fastest-first on a node whose NVML order is by PCI bus
DEVICES = [{"ordinal": 0, "uuid": "c1752cd3-0000-0000-0000-000000000002", "pci": "0000:2a:00.0"},
           {"ordinal": 1, "uuid": "c1752cd3-0000-0000-0000-000000000001", "pci": "0000:1b:00.0"}]


def test_uuid_first_then_pci_then_index():
    assert pick_cuda_device(DEVICES, "GPU-c1752cd3-0000-0000-0000-000000000001", None, 0) == (1, "by UUID")
    assert pick_cuda_device(DEVICES, None, "00000000:1B:00.0", 0) == (1, "by PCI bus id")
    bare = [{"ordinal": 0, "uuid": None, "pci": None}, {"ordinal": 1, "uuid": None, "pci": None}]
    ordinal, how = pick_cuda_device(bare, "GPU-x", "00000000:1B:00.0", 1)
    assert ordinal == 1 and how.startswith("by index")


def test_a_gpu_hidden_by_cuda_visible_devices_is_named():
    with pytest.raises(LookupError, match="is not among the CUDA devices"):
        pick_cuda_device(DEVICES[:1], "GPU-c1752cd3-0000-0000-0000-000000000001", None, 1)
    with pytest.raises(LookupError, match="past the 1 CUDA device"):
        pick_cuda_device([{"ordinal": 0, "uuid": None, "pci": None}], None, None, 3)


def test_pci_bus_ids_compare_across_nvml_and_sysfs_spellings():
    assert normal_pci("00000000:1B:00.0") == normal_pci("0000:1b:00.0") == "0000:1b:00.0"
    assert normal_pci("garbage") is None and normal_pci(None) is None
