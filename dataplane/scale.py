"""The time scale k: every conversion between nominal and real units.

A lab runs its fabric k times slower than the hardware it emulates: a
nominal time is k times longer in real time, a nominal rate k times lower
in real bits per second.  Everything that turns one into the other goes
through a Scale, so the rule is written once (the fabric clock, clock.py,
moves k at run time; a Scale is one value of it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scale:
    k: float

    @classmethod
    def of(cls, rec: dict) -> Scale:
        """The scale a lab's record (or a result's "lab") was made at."""
        return cls(float(rec["time_scale"]))

    def real_ns(self, nominal_ns: float) -> int:
        return int(nominal_ns * self.k)

    def real_bps(self, nominal_bps: float) -> int:
        """At least 1: a link never stops for rounding."""
        return max(1, int(nominal_bps / self.k))

    def nominal_s(self, real_s: float) -> float:
        return real_s / self.k

    def nominal_ns(self, real_ns: float) -> float:
        return real_ns / self.k

    def nominal_bps(self, real_bps: float) -> float:
        return real_bps * self.k
