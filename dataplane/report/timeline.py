"""A job's iterations on the nominal clock, read against a fault schedule:
how much slower the work that met the fault went, which iterations stalled,
and the busbw of each span between faults.  Pure: a scenario's results (or
a test's stood-in timeline) in, figures out.

An iteration is a dict with ``start_nominal_us`` and ``end_nominal_us``
(from the timed phase's start, on the fabric's clock) and ``busbw_GBps``; a
fault applied is a dict with ``at_nominal_us`` (when it took effect, on the
same clock), ``name`` and ``set``.

The slowdown of a fault window (from the first fault to the next one, the
restore; to the job's end if there is none) is the nominal time the
iterations that overlapped the window took, from the first one's start to
the last one's end, against as many clean iterations: the median of those
wholly outside the window.  An iteration that straddles the window's start
or end counts whole, so a stall that spans the whole window is the
slowdown's, not hidden between two phases.  Fewer than MIN_CLEAN whole
clean iterations, or none that met the window, give no slowdown, and say
why.
"""

from __future__ import annotations

import math
import statistics

STALL_FACTOR = 3.0  # an iteration over this many times the job's median is a stall
MIN_CLEAN = 2  # whole iterations a reference (clean time, a phase's busbw) needs


def span_us(it: dict) -> tuple[float, float]:
    return it["start_nominal_us"], it["end_nominal_us"]


def duration_us(it: dict) -> float:
    start, end = span_us(it)
    return end - start


def fault_window(applied: list[dict]) -> tuple[float, float] | None:
    """(start, end) nominal us of the first fault's window: until the next
    fault applied (its restore), or open-ended; None without faults."""
    if not applied:
        return None
    start = applied[0]["at_nominal_us"]
    end = applied[1]["at_nominal_us"] if len(applied) > 1 else math.inf
    return start, end


def overlaps(it: dict, a: float, b: float) -> bool:
    start, end = span_us(it)
    return start < b and end > a


def inside(it: dict, a: float, b: float) -> bool:
    start, end = span_us(it)
    return start >= a and end <= b


def slowdown(iters: list[dict], window: tuple[float, float] | None) -> dict:
    """The fault window's slowdown (module docstring): the figure (None, with
    why, when it cannot be told) and what it was made of."""
    if window is None:
        return {"slowdown": None, "why": "no fault was applied"}
    a, b = window
    met = [x for x in iters if overlaps(x, a, b)]
    clean = [x for x in iters if not overlaps(x, a, b)]
    out: dict = {"window_us": [a, b if math.isfinite(b) else None],
                 "iterations": len(met), "clean_iterations": len(clean)}  # fmt: skip
    if not met:
        return {**out, "slowdown": None, "why": "no iteration met the fault window"}
    if len(clean) < MIN_CLEAN:
        return {**out, "slowdown": None,
                "why": f"{len(clean)} whole iteration(s) outside the fault window, fewer than"
                       f" {MIN_CLEAN}: no clean time to compare with"}  # fmt: skip
    clean_us = statistics.median(duration_us(x) for x in clean)
    took_us = max(span_us(x)[1] for x in met) - min(span_us(x)[0] for x in met)
    return {**out, "slowdown": took_us / (len(met) * clean_us) if clean_us > 0 else None,
            "took_us": took_us, "clean_iteration_us": clean_us}  # fmt: skip


def stalls(iters: list[dict]) -> dict:
    """The iterations that took over STALL_FACTOR times the job's median
    (nominal): each with its index, start, duration and how much longer
    than the median it took; the median (None for fewer than MIN_CLEAN
    iterations: nothing to tell a stall by)."""
    times = [duration_us(x) for x in iters]
    if len(times) < MIN_CLEAN:
        return {"median_iteration_us": None, "longest_iteration_us": max(times, default=None),
                "stalls": [], "stalled_us": 0.0}  # fmt: skip
    median = statistics.median(times)
    found = [
        {"iteration": i, "start_nominal_us": span_us(x)[0], "time_nominal_us": t,
         "stalled_us": t - median, "times_median": t / median if median else math.inf}
        for i, (x, t) in enumerate(zip(iters, times, strict=True))
        if t > STALL_FACTOR * median
    ]  # fmt: skip
    return {"median_iteration_us": median, "longest_iteration_us": max(times),
            "stalls": found, "stalled_us": sum(s["stalled_us"] for s in found)}  # fmt: skip


def phases(iters: list[dict], applied: list[dict]) -> list[dict]:
    """Each span between faults: the iterations that lay wholly in it and
    their mean busbw (None for fewer than MIN_CLEAN: a phase is never one
    iteration against itself), and those that only met it."""
    edges = [0.0, *(f["at_nominal_us"] for f in applied), math.inf]
    names = ["before any fault", *(f"after {f['name']} {f['set']}" for f in applied)]
    out = []
    for (a, b), name in zip(zip(edges, edges[1:], strict=False), names, strict=True):
        whole = [x for x in iters if inside(x, a, b)]
        met = [x for x in iters if overlaps(x, a, b)]
        out.append({
            "phase": name,
            "iterations": len(whole),
            "met": len(met),
            "busbw_GBps": (sum(x["busbw_GBps"] for x in whole) / len(whole)
                           if len(whole) >= MIN_CLEAN else None),
            "longest_iteration_nominal_us": max((duration_us(x) for x in met), default=0.0),
        })  # fmt: skip
    return out
