"""Spec arithmetic against the seed tables (../shared/seeds/002) and the capture README."""

import pytest

from nodecheck.core import specs


@pytest.mark.parametrize("gen,width,gb_per_s", [(5, 16, 63.0), (4, 16, 31.5), (6, 16, 121.0), (7, 16, 242.0),
                                                 (3, 16, 15.75), (5, 8, 31.5), (1, 16, 4.0)])
def test_pcie_unidirectional(gen, width, gb_per_s):
    spec = specs.pcie(gen, width)
    assert spec.bytes_per_second / 1e9 == pytest.approx(gb_per_s, abs=0.05)
    assert f"PCIe {gen}.0 x{width}" in spec.basis and spec.source


def test_h100_pcie_capture_figure():
    # captures/h100-pcie-vm/README: 32 GT/s x 16 x 128/130 / 8 = 63.0 GB/s; measured 54.9 GB/s = 87%
    assert 54.9e9 / specs.pcie(5, 16).bytes_per_second == pytest.approx(0.871, abs=0.001)


@pytest.mark.parametrize("version,links,gb_per_s", [(2, 6, 150), (3, 12, 300), (4, 18, 450), (5, 18, 900), (1, 4, 80)])
def test_nvlink_unidirectional_never_duplex(version, links, gb_per_s):
    assert specs.nvlink(version, links).bytes_per_second == gb_per_s * 1e9


@pytest.mark.parametrize("arch,name,enum,per_link,says", [
    (7, "NVIDIA A100-SXM4-80GB", 5, 25, "NVML architecture 7 = Ampere; link version enum 5 = NVLink 3.1"),
    (7, None, 4, 25, "enum 4 = NVLink 3.0"),
    (9, "NVIDIA H100 80GB HBM3", 6, 25, "architecture 9 = Hopper; link version enum 6 = NVLink 4.0"),
    (9, "NVIDIA H100 80GB HBM3", 7, 25, "enum 7 = NVLink 5.0, which is not Hopper's NVLink 4: the architecture decides"),
    (10, "NVIDIA B200", 7, 50, "NVML architecture 10 = Blackwell"),
    (5, "Tesla V100-SXM2-32GB", 2, 25, "Volta"),
    (4, "Tesla P100-SXM2-16GB", 1, 20, "Pascal"),
    (None, "NVIDIA A100-SXM4-40GB", 5, 25, "Ampere from the GPU name"),  # a snapshot from before `architecture`
    (None, "NVIDIA H200", 7, 25, "Hopper from the GPU name"),
    (None, None, 5, 25, "generation from NVML's link version"),
])
def test_nvlink_rate_comes_from_the_architecture_not_the_version_enum(arch, name, enum, per_link, says):
    """nvmlDeviceGetNvLinkVersion returns nvmlNvlinkVersion_t (5 = "3.1" on A100s, 6 or 7 on Hopper), not a
    generation: read as one, an A100 NV12 pair was judged against 600 GB/s and H100s had no spec."""
    spec, why = specs.nvlink_for_gpu(arch, name, enum, 12)
    assert why == "" and spec.bytes_per_second == per_link * 12e9
    assert says in spec.basis and f"x12 links ({per_link} GB/s per link" in spec.basis


@pytest.mark.parametrize("arch,name,enum,why", [
    (None, None, 7, "does not settle it"),  # 5.0 is Blackwell's, and Hopper parts report it too
    (None, None, None, "no active link reports its version"),
    (None, "Some GPU", 99, "not one NVML defines"),
    (8, "NVIDIA L40S", 6, "Ada has no NVLink generation"),
    (42, None, 6, "NVML architecture 42 is not one nodecheck knows"),
])
def test_nvlink_rate_unknown_is_said_never_guessed(arch, name, enum, why):
    spec, reason = specs.nvlink_for_gpu(arch, name, enum, 18)
    assert spec is None and why in reason


@pytest.mark.parametrize("rate,gbits", [("400 Gb/sec (4X NDR)", 400), ("200 Gb/sec (4X HDR)", 200),
                                        ("100 Gb/sec (4X EDR)", 100), ("40 Gb/sec (4X QDR)", 32),
                                        ("56 Gb/sec (4X FDR)", 54.56), ("800 Gb/sec (8X NDR)", 800),
                                        ("25 Gb/sec", 25)])
def test_infiniband_data_rate(rate, gbits):
    assert specs.infiniband(rate).bytes_per_second * 8 / 1e9 == pytest.approx(gbits)


def test_ethernet_and_unknowns():
    assert specs.ethernet(100000).bytes_per_second == 12.5e9
    assert "not a standard speed" in specs.ethernet(12345).basis
    assert specs.ethernet(None) is None and specs.ethernet(-1) is None
    assert specs.pcie(9, 16) is None and specs.nvlink(9, 4) is None and specs.infiniband("garbage") is None


@pytest.mark.parametrize("implausible", ["65536 Gb/sec", "19800 Gb/sec (99X XDR)", "10001 Gb/sec"])
def test_a_link_rate_past_ten_terabits_is_no_spec(implausible):
    """Found by the whole-snapshot fuzzer: a port rate of 65536 Gb/sec gave a 65.5 Tbit/s spec, and `config init`
    wrote `speed_mbps = 65536000`, which the config reader (1 to 10,000,000) then refused. One bound now serves
    both (limits.MAX_LINK_MBPS); the fastest ports ship at 800 Gb/s."""
    from nodecheck.core.limits import MAX_LINK_MBPS

    assert specs.infiniband(implausible) is None
    assert specs.infiniband("65536 Gb/sec (4X NDR)").bytes_per_second == 50e9  # the lanes and their name settle it
    assert specs.ethernet(MAX_LINK_MBPS + 1) is None and specs.ethernet(MAX_LINK_MBPS) is not None
    assert specs.ethernet(1_600_000).bytes_per_second == 200e9  # 1.6 TbE, not yet shipped: still judged


@pytest.mark.parametrize("rate", ["400 Gb/sec (" + "9" * 5000 + "X NDR)", "9" * 5000 + " Gb/sec", "1.2.3 Gb/sec"])
def test_a_garbled_port_rate_is_no_crash_and_no_huge_figure(rate):
    """A port rate from a broken driver or a hostile snapshot: 5,000 digits once raised ValueError in int() (Python's
    digit limit) or gave an infinite spec; the figure before them, when there is one, is read as reported."""
    spec = specs.infiniband(rate)
    assert spec is None or (spec.bytes_per_second == 50e9 and len(spec.basis) < 100)


# NVML's names of real GPUs, each with where it was printed, and the model specs.toml rates it as
GPU_NAMES = [
    ("NVIDIA H100 80GB HBM3", 80, "H100 SXM"),  # ../shared/captures/h100-pcie-vm (PCI device 0x2330: SXM5)
    ("NVIDIA H100 NVL", 94, "H100 NVL"),  # NVIDIA/gpu-admin-tools#4: nvidia-smi, 95830MiB
    ("NVIDIA H100 PCIe", 80, "H100 PCIe"),  # Azure/azurehpc-health-checks#162 (NCv5)
    ("NVIDIA H200", 141, "H200 SXM"),  # NVIDIA/mig-parted#120: nvidia-smi -q, device 0x2335
    ("NVIDIA A100-SXM4-80GB", 80, "A100 80GB SXM"),  # ../shared/captures/public (nccl-tests logs)
    ("NVIDIA A100-SXM4-40GB", 40, "A100 40GB"),  # ../shared/captures/public
    ("NVIDIA A100 80GB PCIe", 80, "A100 80GB PCIe"),  # NVIDIA/NVSentinel#1481
    ("NVIDIA GB200", 186, "GB200"),  # ../shared/captures/public
    ("NVIDIA GH200 480GB", 96, "GH200 96GB"),
    ("NVIDIA GH200 144G HBM3e", 144, "GH200 144GB"),  # NVIDIA/mig-parted#139
    ("NVIDIA H20-3e", 141, None),  # ../shared/captures/public: no datasheet figure kept, so no spec
]


@pytest.mark.parametrize(("name", "gib", "model"), GPU_NAMES)
def test_each_gpu_model_is_rated_by_its_nvml_name(name, gib, model):
    row = specs.gpu_model(name, gib << 30)
    assert (row["model"] if row else None) == model
    if row is not None:  # every figure dense, with its source, and within what any GPU of today reaches
        assert row["source"] and 0.5 <= row["memory_tbytes_per_s"] <= 10
        assert set(row["dense_tflops"]) >= {"bf16", "fp16", "tf32"} and all(0 < v <= 6000 for v in row["dense_tflops"].values())


def test_the_figures_are_the_datasheets_dense_ones():
    """H100 SXM: 3.35 TB/s, 989.4 TFLOPS BF16 dense (1,979 with sparsity); A100: 312; B200: 8 TB/s, 2,250."""
    h100, a100, b200 = (specs.gpu_model(name) for name in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA B200"))
    assert (h100["memory_tbytes_per_s"], h100["dense_tflops"]["bf16"], h100["dense_tflops"]["fp8"]) == (3.35, 989.4, 1978.9)
    assert (a100["memory_tbytes_per_s"], a100["dense_tflops"]["bf16"], "fp8" in a100["dense_tflops"]) == (2.039, 312.0, False)
    assert (b200["memory_tbytes_per_s"], b200["dense_tflops"]["bf16"]) == (8.0, 2250.0)


def test_a_name_that_covers_two_memory_sizes_is_not_guessed_without_its_memory():
    assert specs.gpu_model("NVIDIA GH200 480GB", None) is None
    assert specs.gpu_model(None) is None and specs.gpu_model("") is None
    assert specs.gpu_model("NVIDIA Tesla T4") is None

