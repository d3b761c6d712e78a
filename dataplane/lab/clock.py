"""The fabric clock of a lab: the time scale k every part of the lab follows.

A page of shared memory (``/run/ethplus/labs/NAME/clock``, C: clock.c) that
the fabric creates at start and alone writes: the current k and the anchor
pair (real, nominal) it was set at, so that nominal time runs on, without a
jump, when k changes.  Every NIC engine of the lab maps it and follows each
change of k as it comes (nic.c: nic_rescale); the workers and the bench time
their runs in nominal nanoseconds from it; the engines add what they lost to
it (late wake-ups, ring drops, and the union of the spans they ran behind)
for the governor and the bench's verdicts to read.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dataplane.errors import EthplusError
from dataplane.lab import registry
from dataplane.lab.core import ffi, lib

REPORTS = (
    "lost_ns", "late_sum_ns", "late_wakeups", "ring_drops", "rx_wait_sum_ns", "rx_wait_frames",
    "any_late_ns", "engines",
)  # fmt: skip
PER_ENGINE = REPORTS[: lib.ETHP_CLOCK_PER_ENGINE]


class ClockError(EthplusError):
    """The fabric clock cannot be opened or read."""


def path(lab: str) -> Path:
    return registry.lab_dir(lab) / "clock"


class Clock:
    """One mapping of a lab's clock page."""

    def __init__(self, lab: str, *, create: bool = False, k: float = 1.0):
        p = path(lab)
        if create:
            # a clock left by an earlier fabric of this name starts afresh
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        err = ffi.new("int *")
        c = lib.ethp_clock_map(str(p).encode(), int(create), float(k), err)
        if c == ffi.NULL:
            raise ClockError(f"cannot map the clock of lab {lab!r} at {p}: {os.strerror(-err[0])}")
        self._c = ffi.gc(c, lib.ethp_clock_unmap)
        self.lab = lab

    @classmethod
    def open(cls, lab: str) -> Clock | None:
        """The lab's clock, or None if its fabric has none (not running)."""
        try:
            return cls(lab)
        except ClockError:
            return None

    @property
    def ptr(self):
        return self._c

    @property
    def k(self) -> float:
        return lib.ethp_clock_k(self._c)

    @property
    def gen(self) -> int:
        return lib.ethp_clock_gen(self._c)

    def nominal_ns(self) -> int:
        return lib.ethp_clock_nominal_ns(self._c)

    def nominal_s(self) -> float:
        return lib.ethp_clock_nominal_ns(self._c) / 1e9

    def now(self) -> tuple[float, float]:
        """Real (time.monotonic) and nominal seconds of one instant: two
        separate readings would differ by any preemption between them."""
        real_ns = time.monotonic_ns()
        return real_ns / 1e9, lib.ethp_clock_nominal_at_ns(self._c, real_ns) / 1e9

    def set_k(self, k: float) -> None:
        if lib.ethp_clock_set_k(self._c, float(k)) < 0:
            raise ClockError(f"time scale: expected a number from 1 to 1e9, got {k!r}")

    def reports(self) -> dict[str, int]:
        out = ffi.new("uint64_t[]", lib.ETHP_CLOCK_NREPORTS)
        lib.ethp_clock_reports(self._c, out)
        return dict(zip(REPORTS, out, strict=True))

    def engines(self) -> dict[str, list[int]]:
        """Each engine's own lost and late time so far (real ns), by slot."""
        n = lib.ETHP_CLOCK_MAX_ENGINES
        out = ffi.new("uint64_t[]", n)
        res = {}
        for which, name in enumerate(PER_ENGINE):
            got = lib.ethp_clock_engines(self._c, which, out, n)
            res[name] = list(out[0:got])
        return res

    def close(self) -> None:
        if self._c is not None:
            ffi.release(self._c)
            self._c = None
