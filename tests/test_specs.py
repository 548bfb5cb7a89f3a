"""Spec arithmetic against the seed tables (../shared/seeds/002) and the capture README."""

import pytest

from nodecheck import specs


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
