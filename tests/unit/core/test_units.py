import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodecheck.core.units import (
    format_bits,
    format_cpulist,
    format_rate,
    hwloc_bitmap_to_set,
    mask_words_to_cpus,
    parse_count,
    parse_cpulist,
    parse_rate,
)


def test_cpulist_forms():
    assert parse_cpulist("0-3,8") == [0, 1, 2, 3, 8]
    assert format_cpulist([8, 0, 1, 2, 3]) == "0-3,8"
    assert format_cpulist([]) == ""
    with pytest.raises(ValueError):
        parse_cpulist("3-1")
    with pytest.raises(ValueError):
        parse_cpulist("zero")


@given(st.sets(st.integers(min_value=0, max_value=512)))
def test_cpulist_round_trip(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == sorted(cpus)


def test_nvml_affinity_mask():
    # the H100 capture: cpuaff [65535, 0, 0, 0] is CPUs 0-15
    assert format_cpulist(mask_words_to_cpus([65535, 0, 0, 0])) == "0-15"
    assert mask_words_to_cpus([0, 1]) == [64]


def test_hwloc_bitmaps():
    assert hwloc_bitmap_to_set("0x0000ffff") == set(range(16))
    assert hwloc_bitmap_to_set("0x00000001,0x00000000") == {32}
    assert hwloc_bitmap_to_set("0x1,,0x0") == {64}  # an empty word still takes its 32 bits


def test_rates_in_people_units():
    assert format_rate(63.0e9) == "63.0 GB/s"
    assert format_bits(12.5e9) == "100 Gbit/s"
    assert format_rate(None) == "unknown"


@pytest.mark.parametrize("text,value", [("1.25GB/s", 1.25e9), ("100Gbit/s", 12.5e9), ("400 Gb/s", 50e9), ("12GiB/s", 12 * 2**30),
                                        ("800Mbps", 100e6), ("2.5e9B/s", 2.5e9)])
def test_parse_rate(text, value):
    assert parse_rate(text) == pytest.approx(value)


@pytest.mark.parametrize("text,value", [("25M", 25e6), ("10B", 10e9), ("1.3e9", 1.3e9), ("175b", 175e9), ("7k", 7e3)])
def test_parse_count(text, value):
    assert parse_count(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "fast", "10 parsecs", "-1GB/s", "0Gbit/s", "1e3 GB", "25X", "0M", "Ⅻ"])
def test_parse_rate_and_count_refuse_with_a_reason(text):
    with pytest.raises(ValueError, match="expected|above zero"):
        parse_rate(text)
    with pytest.raises(ValueError, match="expected|above zero"):
        parse_count(text)


def test_natural_key_orders_numbers_as_numbers_and_takes_any_text():
    from nodecheck.core.units import natural_key

    assert sorted(["mlx5_10", "mlx5_9", "mlx5_1", "eth0"], key=natural_key) == ["eth0", "mlx5_1", "mlx5_9", "mlx5_10"]
    assert sorted(["mlx5²", "mlx4"], key=natural_key) == ["mlx4", "mlx5²"]  # '²' is a digit int() refuses
