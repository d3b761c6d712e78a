"""The governor's decisions (governor.Governor), fed observations: when it
raises k, when it lowers it, and when it holds.  (On real labs: test_bench's
governed tests.)"""

import dataclasses

from dataplane.lab.governor import (
    CALM_S,
    FUTILE_RAISES,
    HOLD_S,
    INTERVAL_S,
    LOWER,
    RAISE,
    RAISE_SEVERE,
    WINDOW_S,
    Governor,
    History,
    Observation,
)
from dataplane.report import fidelity

CALM = Observation()
MILD = Observation(engine_added_delay_share=fidelity.ADDED_DELAY_MAX * 0.9)
SEVERE = Observation(lost_link_share=fidelity.LOST_SHARE_MAX * 1.5)


def _run(g: Governor, obs: Observation, t0: float, t1: float, step: float = 0.25) -> float:
    t = t0
    while t < t1:
        g.step(obs, t)
        t += step
    return t


def test_it_raises_when_a_part_nears_its_verdict_and_holds_a_window_after():
    g = Governor(1000)
    assert g.step(MILD, 0.0) == 1000 * RAISE
    assert g.step(MILD, HOLD_S / 2) is None  # held: the window was at the old k
    assert g.step(SEVERE, HOLD_S) == 1000 * RAISE * RAISE_SEVERE
    assert [e["k_to"] for e in g.events] == [1000 * RAISE, 1000 * RAISE * RAISE_SEVERE]
    assert all(e["why"] for e in g.events)


def test_engines_behind_together_raise_k():
    """Each engine a little behind, at different times: the lab's union of
    their late spans nears its verdict, and k goes up, saying why."""
    g = Governor(1000)
    obs = Observation(any_behind_share=fidelity.ANY_BEHIND_MAX * 0.9)
    assert g.step(obs, 0.0) == 1000 * RAISE
    assert "some NIC engine was behind" in g.events[-1]["why"]
    assert not Observation(any_behind_share=fidelity.ANY_BEHIND_MAX * 0.5).calm()


def test_the_governor_and_the_verdicts_judge_the_same_figures():
    """Each figure the governor watches (but the machine's busy share) is one
    of the verdicts' checks, and each raises k by itself, saying what the
    verdict would say; one past the verdict's own limit raises k faster."""
    checked = {c.observed for c in fidelity.CHECKS}
    fields = {f.name for f in dataclasses.fields(Observation)}
    assert fields - checked == {"busy_share"} and checked <= fields
    for c in fidelity.CHECKS:
        near = Observation(**{c.observed: c.limit * 0.9 if c.limit else 1})
        past = Observation(**{c.observed: c.limit * 2.5 if c.limit else 1})
        g = Governor(1000)
        assert g.step(near, 0.0) == 1000 * (RAISE_SEVERE if not c.limit else RAISE), c
        assert g.events[-1]["why"] == c.says.format(v=getattr(near, c.observed))
        assert past.severe() and not near.calm(), c


def test_busy_cpus_alone_do_not_raise_k():
    g = Governor(1000)
    assert g.step(Observation(busy_share=1.0), 0.0) is None and g.k == 1000


def test_it_lowers_after_calm_but_never_under_the_floor_nor_to_a_k_that_fell_behind():
    g = Governor(1000, k=8000)
    _run(g, CALM, 0.0, CALM_S + 0.5)
    assert g.k == 8000 * LOWER
    _run(g, CALM, CALM_S + 0.5, 20 * CALM_S)
    assert g.k == 1000  # the floor, not under
    g = Governor(1000)
    g.step(MILD, 0.0)  # behind at 1000: up to 1500
    _run(g, CALM, HOLD_S, 5 * CALM_S)
    # one step down, but not back to 1000, where it fell behind under a minute ago
    assert g.k == 1000 * RAISE * LOWER


def test_a_trial_behind_raises_k_from_the_highest_k_it_fell_behind_at():
    """A burst raised k during a trial, the quiet after it lowered k: the
    next trial starts above the burst's k, not above where the last ended
    (upn-512's all-to-all trials began at 1.84e6, then 2.28e6, each behind
    up to 4.4e6)."""
    g = Governor(1000, k=2000)
    assert g.raise_for("a trial fell behind", 0.0, behind_at_k=6000) == 6000 * RAISE
    assert g.events[-1]["k_from"] == 2000  # the k the fabric ran at
    # then never lowered to where it fell behind within BAD_MEMORY_S
    _run(g, CALM, HOLD_S, 5 * CALM_S)
    assert g.k == 6000 * RAISE * LOWER
    # a k lower than now is no base; none past the ceiling
    g = Governor(1000, k=3000)
    assert g.raise_for("behind", 0.0, behind_at_k=100) == 3000 * RAISE
    assert Governor(1000).raise_for("behind", 0.0, behind_at_k=1e12) is None


def test_raises_that_do_not_relieve_the_lateness_stop():
    g = Governor(1000)
    t = 0.0
    for _ in range(FUTILE_RAISES + 2):
        g.step(MILD, t)
        t += HOLD_S
    assert g.k == 1000 * RAISE**FUTILE_RAISES
    assert "did not help" in g.events[-1]["why"]
    assert g.step(MILD, t) is None  # holding


def test_a_window_never_reaches_back_past_a_change_of_k():
    """The governor judges WINDOW_S of readings at one k: after a change,
    nothing until the new k has run a whole window, then only its readings
    (the old k's lateness, reported as engines wake, is not the new k's)."""
    h = History({"t": 0.0, "k": 6400})
    t, got = 0.0, []
    while t < 3 * WINDOW_S:
        t += INTERVAL_S
        got.append(h.add({"t": t, "k": 6400 if t < WINDOW_S + 0.1 else 12800}))
    windows = [w for w in got if w]
    assert windows[0][0]["k"] == 6400 and windows[0][1]["t"] >= WINDOW_S * 0.9
    after = [w for w in windows if w[1]["k"] == 12800]
    assert after and all(a["k"] == 12800 and b["t"] - a["t"] >= WINDOW_S * 0.9 for a, b in after)
    first_new = min(x["t"] for w in after for x in w)
    assert first_new > WINDOW_S + 0.1  # the first reading at the new k
    assert all(b["t"] - a["t"] <= WINDOW_S + INTERVAL_S for a, b in windows)
