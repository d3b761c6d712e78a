"""Sizes and rates for people: the one formatter of each, and the size parser.

Message sizes go in powers of two (16 MiB: what a collective moves),
buffers, queues and thresholds in powers of ten (400 KB: as lab files and
switch datasheets give them); rates in bit/s.  A unit may be asked for, so
that a column keeps one.
"""

from __future__ import annotations

import re

from dataplane.errors import UsageError

_BINARY = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))
_DECIMAL = (("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("B", 1))
_RATES = (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3), ("bit/s", 1))


def _text(value: float, units, unit: str | None, spec: str) -> str:
    scales = dict(units)
    if unit is None:
        unit = next((u for u, s in units if abs(value) >= s), units[-1][0])
    elif unit not in scales:
        raise ValueError(f"unit {unit!r}: expected one of {', '.join(scales)}")
    return f"{value / scales[unit]:{spec}} {unit}"


def size_text(
    n_bytes: float, binary: bool = True, unit: str | None = None, spec: str = ".4g"
) -> str:
    """16 MiB, 1.5 KiB (binary) or 400 KB, 1.2 MB (not): the largest unit
    the size reaches, or unit; spec formats the number."""
    return _text(n_bytes, _BINARY if binary else _DECIMAL, unit, spec)


def rate_text(bps: float, unit: str | None = None, spec: str = ".4g") -> str:
    """400 Gbit/s, 62.5 Mbit/s: the largest unit the rate reaches, or unit."""
    return _text(bps, _RATES, unit, spec)


_SIZE_SUFFIX = {u[0] if u != "B" else "": s for u, s in _BINARY}  # "G", "M", "K", ""


def parse_size(text: str, what: str = "--sizes") -> int:
    """8, 8K, 64M, 1G (also 8KiB, 64MB: powers of two), or a UsageError naming what."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise UsageError(f"{what}: {text!r} is not a size (expected bytes such as 8, 8K, 64M, 1G)")
    return int(m.group(1)) * _SIZE_SUFFIX[m.group(2).upper()]
