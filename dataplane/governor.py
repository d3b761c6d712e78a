"""The time-scale governor: a lab whose time scale is "auto" runs each bench
at the smallest k at which every part of the emulation keeps up.

It starts at the lab's k (the floor: the auto choice made at `lab up`) and
runs the largest size once; while that size is `behind` (a switch's pacer or
an endpoint could not keep up: fidelity.py), it doubles k and tries again, up
to MAX_DOUBLINGS.  Then the bench runs at the k found (a size that still
falls behind there, as the machine got busier, is marked `behind`, not
rerun: rows are printed as they complete).  Every k tried, and why, is
recorded in the result; the lab goes back to its floor afterwards.  A lab
whose time scale is a number is pinned: its runs are only reported.

This governs per run, not within one: k does not move while a size runs
(issue 22 asks for a fabric clock that dilates smoothly; not built yet).
"""

from __future__ import annotations

import dataclasses

from dataplane import bench, lab

MAX_DOUBLINGS = 4  # at most 16 x the floor


def governed(rec: dict) -> bool:
    """Does this lab's time scale follow the governor ("auto")?"""
    return rec.get("time_scale_setting") == "auto"


def _trial(spec: bench.Spec, rec: dict, nodes, k: float) -> dict:
    probe = dataclasses.replace(spec, sizes=[max(spec.sizes)], iters=1, warmup=1)
    row = bench.run(probe, rec, nodes=nodes)["rows"][0]
    return {
        "k": k,
        "size_bytes": row["size_bytes"],
        "busbw_GBps": row["busbw_GBps"],
        "fell_behind": row["fell_behind"],
        "pacing": row["pacing"],
        "endpoints": row["endpoints"],
    }


def run(spec: bench.Spec, rec: dict, on_row=None, on_progress=None, nodes=None, log=None) -> dict:
    """bench.run, governed when the lab's time scale is "auto"."""
    if not governed(rec):
        return bench.run(spec, rec, on_row=on_row, on_progress=on_progress, nodes=nodes)
    say = log or (lambda _msg: None)
    floor = k = float(rec["time_scale"])
    trials: list[dict] = []
    try:
        for step in range(MAX_DOUBLINGS + 1):
            t = _trial(spec, rec, nodes, k)
            trials.append(t)
            if not t["fell_behind"] or step == MAX_DOUBLINGS:
                break
            say(f"# governor: {t['size_bytes']} B fell behind at k={k:g}; trying k={2 * k:g}")
            k *= 2
            lab.rescale(rec, k)
        result = bench.run(spec, rec, on_row=on_row, on_progress=on_progress, nodes=nodes)
    finally:
        if k != floor:
            lab.rescale(rec, floor)
    result["governor"] = {
        "setting": "auto",
        "floor_k": floor,
        "k": result["lab"]["time_scale"],
        "trials": trials,
    }
    return result
