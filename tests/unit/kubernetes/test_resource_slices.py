"""A node's GPUs matched to their DRA devices (src/nodecheck/kubernetes/resource_slices.py) on ResourceSlices the
NVIDIA DRA driver published (tests/fixtures/README.md), by UUID or PCI address and never by index; and the API's
answer read as untrusted input."""

import copy

import yaml
from helpers import REPO

from nodecheck.kubernetes.resource_slices import MAX_DEVICES, map_gpus, slice_devices

K8S = REPO / "tests/fixtures/kubernetes"
EKS = yaml.safe_load((K8S / "resourceslices-eks-h100x8-v1.yaml").read_text())
NODE = "ip-100-64-147-149.ec2.internal"
# NVML's view of the same node: index in PCI bus order, its UUID and bus id (the slice's, as NVML writes them)
BUSES = ["53", "64", "75", "86", "97", "a8", "b9", "ca"]


def nvml_gpus() -> list[tuple[int, str, str]]:
    devices, _ = slice_devices(EKS, NODE)
    by_pci = {d.pci: d.uuid for d in devices if d.pci}
    return [(i, by_pci[f"0000:{bus}:00.0"], f"00000000:{bus.upper()}:00.0") for i, bus in enumerate(BUSES)]


def test_the_gpus_of_a_published_eks_node_map_by_uuid_not_by_listing_order():
    devices, notes = slice_devices(EKS, NODE)
    assert notes == [] and len(devices) == 10  # two compute-domain devices and eight GPUs
    assert {d.driver for d in devices} == {"compute-domain.nvidia.com", "gpu.nvidia.com"}
    mapped = map_gpus(devices, nvml_gpus())
    assert mapped.unmatched == [] and {i: [d.name for d in ds] for i, ds in mapped.devices.items()} == {
        i: [f"gpu-{i}"] for i in range(8)}
    gpu3 = mapped.devices[3][0]
    assert (gpu3.driver, gpu3.pool, gpu3.uuid, gpu3.product) == (
        "gpu.nvidia.com", NODE, "GPU-e69a4117-e5f9-04a7-d170-aafac6a7e692", "NVIDIA H100 80GB HBM3")


def test_a_device_name_that_is_not_the_index_is_still_found():
    """The driver names GPUs by their /dev/nvidia minor: rename them all and the UUIDs still match."""
    renamed = copy.deepcopy(EKS)
    for device in renamed["items"][1]["spec"]["devices"]:
        device["name"] = "gpu-" + str(7 - int(device["name"][4:]))
    mapped = map_gpus(slice_devices(renamed, NODE)[0], nvml_gpus())
    assert mapped.devices[0][0].name == "gpu-7" and mapped.devices[7][0].name == "gpu-0"


def test_without_uuids_the_pci_address_matches_and_another_node_or_gpu_matches_nothing():
    bare = copy.deepcopy(EKS)
    for device in bare["items"][1]["spec"]["devices"]:
        del device["attributes"]["uuid"]
    mapped = map_gpus(slice_devices(bare, NODE)[0], nvml_gpus())
    assert mapped.devices[5][0].name == "gpu-5"
    assert slice_devices(EKS, "another-node") == ([], [])
    stranger = map_gpus(slice_devices(EKS, NODE)[0], [(0, "GPU-00000000-0000-0000-0000-000000000000", None)])
    assert stranger.devices == {} and stranger.unmatched == [0]


def test_v1beta1_basic_devices_and_the_older_pci_attribute_are_read():
    item = yaml.safe_load((K8S / "resourceslice-p100-v1beta1.yaml").read_text())
    (device,), _ = slice_devices({"items": [item]}, "192.168.140.59")
    assert (device.name, device.uuid, device.pci) == ("gpu-0", "GPU-b87512d7-c8a6-5f4b-8d3f-68183df62d66", "0000:00:0b.0")
    mapped = map_gpus([device], [(0, None, "00000000:00:0B.0")])
    assert mapped.devices[0] == [device]


def test_mig_devices_follow_their_gpu_and_an_old_pool_generation_is_ignored():
    slices = copy.deepcopy(EKS)
    gpu_slice = slices["items"][1]
    uuid0 = next(d["attributes"]["uuid"]["string"] for d in gpu_slice["spec"]["devices"] if d["name"] == "gpu-0")
    gpu_slice["spec"]["devices"].append({"name": "gpu-0-mig-1g10gb-19-0", "attributes": {
        "uuid": {"string": "MIG-3cd1a7a2-0000-5f3b-9d52-3a3c0a5d7f1e"}, "parentUUID": {"string": uuid0}}})
    stale = copy.deepcopy(gpu_slice)
    stale["spec"]["pool"]["generation"] = 0
    stale["spec"]["devices"] = [{"name": "gpu-99", "attributes": {"uuid": {"string": uuid0}}}]
    slices["items"].append(stale)
    mapped = map_gpus(slice_devices(slices, NODE)[0], nvml_gpus())
    assert [d.name for d in mapped.devices[0]] == ["gpu-0", "gpu-0-mig-1g10gb-19-0"]


def test_a_hostile_answer_is_read_without_error_and_bounded():
    for answer in ({}, {"items": "x"}, {"items": [None, 1, {"spec": []}, {"spec": {"driver": 5}}]},
                   {"items": [{"spec": {"driver": "d", "nodeName": NODE, "pool": {"name": "p", "generation": True},
                                        "devices": [{"name": 1}, {"name": "x" * 10_000}, {"basic": "no"}]}}]}):
        assert slice_devices(answer, NODE)[0] == []
    huge = {"items": [{"spec": {"driver": "d", "nodeName": NODE, "pool": {"name": "p", "generation": 1},
                                "devices": [{"name": f"g{i}"} for i in range(MAX_DEVICES + 10)]}}]}
    devices, notes = slice_devices(huge, NODE)
    assert len(devices) == MAX_DEVICES and "not read" in notes[0]
    twice = map_gpus(slice_devices(EKS, NODE)[0] * 2, nvml_gpus())
    assert twice.devices == {} and "listed by 2 devices" in twice.notes[0]
