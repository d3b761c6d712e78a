"""The one formatter for sizes and the one for rates."""

from __future__ import annotations

import pytest

from dataplane.units import rate_text, size_text


def test_sizes_in_powers_of_two_for_messages_and_ten_for_buffers():
    assert size_text(16 << 20) == "16 MiB"
    assert size_text(1536) == "1.5 KiB"
    assert size_text(512) == "512 B"
    assert size_text(600_000, binary=False) == "600 KB"
    assert size_text(1_250_000, binary=False) == "1.25 MB"
    assert size_text(58_200, binary=False, unit="KB", spec=".0f") == "58 KB"


def test_rates_pick_their_unit_or_keep_the_one_asked_for():
    assert rate_text(400e9) == "400 Gbit/s"
    assert rate_text(62.5e6) == "62.5 Mbit/s"
    assert rate_text(2e9, "Mbit/s", ".1f") == "2000.0 Mbit/s"
    with pytest.raises(ValueError, match="Gbps"):
        rate_text(1e9, "Gbps")


def test_the_time_scale_converts_both_ways_in_one_place():
    from dataplane.scale import Scale

    s = Scale(6400)
    assert s.real_ns(2_000) == 12_800_000  # 2 us nominal: 12.8 ms real
    assert s.real_bps(400e9) == 62_500_000  # 400 Gbit/s nominal: 62.5 Mbit/s real
    assert s.real_bps(1) == 1  # a link never stops for rounding
    assert s.nominal_s(12.8e-3) == 2e-6 and s.nominal_ns(12_800_000) == 2_000
    assert s.nominal_bps(62_500_000) == 400e9
    assert Scale.of({"time_scale": "6400"}) == s
