"""The time-scale governor: a lab whose time scale is "auto" dilates time
when any part of the emulation falls behind, and contracts it again when all
have headroom.

Two parts:

- ``Governor`` runs inside the fabric (fabric.py starts it for a governed
  lab).  Every INTERVAL_S it looks at every part that can fall behind: the
  switches' pacers (link time lost, delay added), the NIC engines (the link
  time they lost, the frames their rings dropped and the time any of them
  was behind, which they add to the fabric clock: clock.py), the ranks'
  wait for a CPU and the machine's busy share.  When any of them
  passes RAISE_AT of the threshold that would mark a size `behind`
  (fidelity.py), it raises k by RAISE (the fabric clock slows: every switch,
  host shaper and NIC engine follows at once); when every part has had
  headroom for CALM_S it lowers k by LOWER, never under the floor (the k
  `lab up` chose).  After a change it holds for HOLD_S, so the effect shows
  before it judges again.  Every change is recorded, with its reason.
- the bench side (trials.py) wraps a bench on a governed lab: it runs the
  largest size once, as a trial, until a trial no longer falls behind (the
  fabric's governor raising k as it goes), then the bench itself, and
  records the k range it ran at (per size too: bench rows carry it from the
  job's samples).

A lab whose time scale is a number, or one pinned with ``ethplus lab scale
NAME K``, is not governed: its runs are only reported.
"""

from __future__ import annotations

import collections
import dataclasses

from dataplane.report import fidelity

INTERVAL_S = 0.25  # how often it looks
WINDOW_S = 2.0  # over how long: one late wake-up must not move k
RAISE = 1.5
RAISE_SEVERE = 2.0
LOWER = 0.8
HOLD_S = WINDOW_S  # after a change, a whole window at the new k before the next
CALM_S = 10.0
BAD_MEMORY_S = 60.0  # never lower k to where it fell behind this recently
FUTILE_RAISES = 3  # this many raises within BAD_MEMORY_S that do not relieve it: it holds
MAX_FACTOR = 64.0  # never more than this times the floor
CALM_BUSY_MAX = 0.90  # the machine must be under this busy to lower k
MAX_TRIALS = 8
TRIAL_WAIT_S = 2 * WINDOW_S + HOLD_S  # for the governor to move after a trial behind
# It raises k when a window passes RAISE_AT of a verdict's threshold (the
# size would be close to `behind`), and counts a window calm under CALM_AT.
RAISE_AT = 0.8
CALM_AT = 0.3


def governed(rec: dict) -> bool:
    """Does this lab's time scale follow the governor ("auto")?"""
    return rec.get("time_scale_setting") == "auto"


@dataclasses.dataclass
class Observation:
    """One interval of the parts that can fall behind (shares of the interval)."""

    lost_link_share: float = 0.0  # switches: the worst port's lost link time
    added_delay_share: float = 0.0  # switches: mean frame lateness / base RTT
    engine_lost_share: float = 0.0  # NIC engines: the worst one's lost link time
    engine_added_delay_share: float = 0.0  # NIC engines: the worst one's delay / base RTT
    ring_drops: int = 0  # NIC engines: frames their RX rings dropped
    engine_rx_delay_share: float = 0.0  # NIC engines: frames' mean wait in their rings / base RTT
    any_behind_share: float = 0.0  # NIC engines: time some engine was behind (their union)
    switch_ring_drops: int = 0  # switches: frames lost before they read them
    waited_share: float = 0.0  # ranks: the worst one's time ready but not scheduled
    start_skew_share: float = 0.0  # ranks: their staggered start (a row's only; not sampled)
    busy_share: float = 0.0  # the machine

    def _shares(self):
        """(check, observed value) for each of fidelity's checks."""
        return ((c, getattr(self, c.observed)) for c in fidelity.CHECKS)

    def behind(self) -> str | None:
        """Why this window is behind (RAISE_AT of a verdict's threshold), or None.
        The machine's busy share alone is no reason: a worker's numpy work
        fills the CPUs without making any part of the fabric late."""
        return next((fidelity.says(c, {}, v) for c, v in self._shares()
                     if v > c.limit * RAISE_AT), None)  # fmt: skip

    def pressure(self) -> float:
        """The largest share as a fraction of its verdict's threshold."""
        return max(v / c.limit for c, v in self._shares() if c.limit)

    def severe(self) -> bool:
        """Past a verdict's threshold itself (severe_at times it: a rank's
        wait for a CPU at twice): k goes up faster (RAISE_SEVERE)."""
        return any(v > c.limit * c.severe_at for c, v in self._shares())

    def calm(self) -> bool:
        return self.busy_share < CALM_BUSY_MAX and not any(
            v > c.limit * CALM_AT for c, v in self._shares()
        )


class History:
    """The readings the governor judges (fabric.py's, each with its time t
    and the k it was taken at): the last WINDOW_S of them, never reaching
    back past a change of k.  A window that began before the change would
    judge the new k by the old one's lateness (engines report a late span
    when they wake, after it): seen raising k twice in a row, from 6400 to
    12800 and then 25600, on the start of one all-reduce."""

    def __init__(self, first: dict):
        self.readings = collections.deque([first])

    def add(self, cur: dict) -> tuple[dict, dict] | None:
        """Take a reading; the window to judge (its first and last), or None
        while the readings at this k do not yet span a window."""
        q = self.readings
        if q[-1]["k"] != cur["k"]:
            q.clear()
        q.append(cur)
        while len(q) > 2 and cur["t"] - q[1]["t"] >= WINDOW_S:
            q.popleft()
        if cur["t"] - q[0]["t"] < WINDOW_S * 0.9:
            return None
        return q[0], cur


class Governor:
    """The decisions alone (fabric.py feeds it observations and applies them)."""

    def __init__(self, floor_k: float, k: float | None = None):
        self.floor_k = float(floor_k)
        self.k = float(k if k is not None else floor_k)
        self.held_until = 0.0
        self.calm_since: float | None = None
        self.bad_k, self.bad_at = 0.0, -BAD_MEMORY_S  # where it last fell behind
        self.raises: list[tuple[float, float]] = []  # (when, pressure) of recent raises
        self.events: list[dict] = []

    def step(self, obs: Observation, now_s: float, nominal_s: float = 0.0) -> float | None:
        """The new k after this window's observation, or None to keep it."""
        if now_s < self.held_until:
            return None  # the window still holds time at the old k
        why = obs.behind()
        if not obs.calm() or why:
            self.calm_since = None
        elif self.calm_since is None:
            self.calm_since = now_s
        if not why:
            recent_bad = self.bad_k if now_s - self.bad_at < BAD_MEMORY_S else 0.0
            lower = max(self.floor_k, self.k * LOWER)
            if (
                self.calm_since is not None
                and now_s - self.calm_since >= CALM_S
                and recent_bad < lower < self.k
            ):
                self.calm_since = now_s
                return self._change(lower, f"every part had headroom for {CALM_S:g} s", now_s,
                                    nominal_s)  # fmt: skip
            return None
        self.bad_k, self.bad_at = max(self.k, self.bad_k), now_s
        # raises of the last BAD_MEMORY_S (idle time between runs between them)
        self.raises = [(t, p) for t, p in self.raises if now_s - t < BAD_MEMORY_S]
        self.raises.append((now_s, obs.pressure()))
        if len(self.raises) > FUTILE_RAISES and self.raises[-1][1] >= 0.8 * self.raises[0][1]:
            # FUTILE_RAISES raises in a row did not bring it down: the
            # lateness is not the emulation's load (the machine's scheduling,
            # a part k cannot relieve); it holds, and the sizes say behind
            self._record(self.k, f"{why}; raising k did not help, holding", now_s, nominal_s)
            self.raises.clear()
            self.held_until = now_s + CALM_S
            return None
        del self.raises[: -(FUTILE_RAISES + 1)]
        if self.k >= self.floor_k * MAX_FACTOR:
            return None
        up = RAISE_SEVERE if obs.severe() else RAISE
        return self._change(min(self.k * up, self.floor_k * MAX_FACTOR), why, now_s, nominal_s)

    def raise_for(self, why: str, now_s: float, nominal_s: float = 0.0,
                  behind_at_k: float = 0.0) -> float | None:  # fmt: skip
        """Raise k now because a run's own verdict says something fell behind
        (a trial too short for the governor's windows to see it), from the
        highest k it fell behind at (behind_at_k) if that is above k now: a
        burst raises k, the quiet after it lowers k again, and raised from
        where it ended each trial of upn-512's all-to-all began at about the
        last one's start (1.84e6 then 2.28e6, both behind up to 4.4e6)."""
        base = max(self.k, behind_at_k)
        if base >= self.floor_k * MAX_FACTOR:
            return None
        self.bad_k, self.bad_at = max(base, self.bad_k), now_s
        return self._change(min(base * RAISE, self.floor_k * MAX_FACTOR), why, now_s, nominal_s)

    def _record(self, new: float, why: str, now_s: float, nominal_s: float) -> None:
        self.events.append(
            {"t_real": now_s, "nominal_s": nominal_s, "k_from": self.k, "k_to": new, "why": why}
        )
        del self.events[:-200]

    def _change(self, new: float, why: str, now_s: float, nominal_s: float) -> float:
        self._record(new, why, now_s, nominal_s)
        self.k = new
        self.held_until = now_s + HOLD_S
        return new
