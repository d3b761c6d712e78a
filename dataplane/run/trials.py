"""Runs on a governed lab: trials first, then the run itself.

A bench (or a scenario's jobs) on a lab whose time scale is "auto" runs its
largest size once, as a trial, until a trial no longer falls behind: the
fabric's governor (governor.py) raises k as it goes, or is asked to when a
trial was too short for its windows.  The run then records the k range it
ran at, its trials and every change of k the governor made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from dataplane.lab import labs
from dataplane.lab.governor import INTERVAL_S, MAX_TRIALS, TRIAL_WAIT_S, governed
from dataplane.report import fidelity
from dataplane.run import bench


@contextlib.contextmanager
def held(rec: dict):
    """A governed lab's k held where it is for a with block (--no-govern);
    handed back to the governor after only if it was governing before (a k
    pinned with `ethplus lab scale` stays pinned)."""
    if not fabric_governor(rec)["on"]:
        yield
        return
    labs.control(rec["name"], {"op": "scale", "k": "hold"})
    try:
        yield
    finally:
        labs.control(rec["name"], {"op": "scale", "k": "auto"})


def _trial(spec, rec: dict, nodes) -> dict:
    probe = dataclasses.replace(spec, sizes=[max(spec.sizes)], iters=1, warmup=1)
    res = bench.run(probe, rec, nodes=nodes)
    row = res["rows"][0]
    return {
        "k_range": row.get("k_range"),
        "size_bytes": row["size_bytes"],
        "busbw_GBps": row["busbw_GBps"],
        "fell_behind": row["fell_behind"],
        "pacing": row["pacing"],
        "endpoints": row["endpoints"],
    }


def run(spec, rec: dict, on_row=None, on_progress=None, nodes=None, log=None) -> dict:
    """bench.run of spec (a bench.Spec), with trials first when the lab is
    governed (see the module)."""
    state = fabric_governor(rec) if governed(rec) else None
    if state is None or not state["on"]:  # a number, or pinned by `lab scale`
        return bench.run(spec, rec, on_row=on_row, on_progress=on_progress, nodes=nodes)
    t0 = time.monotonic()
    floor = state["floor_k"]
    trials = trial_runs(
        rec, lambda: _trial(spec, rec, nodes), lambda t: f"a trial of {t['size_bytes']} B", log
    )
    result = bench.run(spec, rec, on_row=on_row, on_progress=on_progress, nodes=nodes)
    reruns = _rerun_behind(spec, rec, result["rows"], on_row, nodes, log)
    if reruns and result.get("fidelity"):
        fidelity.after_reruns(result["fidelity"], result["rows"], reruns)
    ks = [r["k_range"] for r in result["rows"] if r.get("k_range")]
    result["governor"] = {
        "setting": "auto",
        "floor_k": floor,
        "k": min((k[0] for k in ks), default=result["lab"]["time_scale"]),
        "k_max": max((k[1] for k in ks), default=result["lab"]["time_scale"]),
        "trials": trials,
        "reruns": reruns,
        "trials_real_s": time.monotonic() - t0 - result["wall_s"],
        # every change of k the fabric's governor made during trials and run
        "events": [e for e in fabric_governor(rec)["events"] if e["t_real"] >= t0],
    }
    return result


def _rerun_behind(spec, rec: dict, rows: list[dict], on_row, nodes, log) -> list[dict]:
    """A size of the run that fell behind all the same (the machine got
    busier since the trials, or the governor had lowered k) runs again once
    k was raised, up to MAX_TRIALS times; its last run replaces its row.
    Returns the runs that were replaced."""
    reruns: list[dict] = []
    for i, row in enumerate(rows):
        if not row["fell_behind"]:
            continue
        one = dataclasses.replace(spec, sizes=[row["size_bytes"]])
        tries = trial_runs(
            rec,
            lambda one=one: bench.run(one, rec, on_row=on_row, nodes=nodes)["rows"][0],
            lambda t: f"{t['size_bytes']} B in the run",
            log,
            first=row,
        )
        reruns += [{k: t.get(k) for k in ("size_bytes", "k_range", "fell_behind")}
                   for t in [row, *tries[:-1]]]  # fmt: skip
        rows[i] = tries[-1]
    return reruns


def trial_runs(
    rec: dict, attempt, what, log=None, most: int = MAX_TRIALS, first: dict | None = None
) -> list[dict]:
    """Trials until one does not fall behind (at most `most`): attempt() runs
    one and gives a dict with fell_behind and k_range; what(trial) names it.
    After a trial that fell behind, the governor has raised k, or is asked
    to (a trial too short for its windows to see what its own verdict saw).
    first: a run that fell behind already (k is raised before the first)."""
    say = log or (lambda _msg: None)

    def raised(t: dict) -> None:
        lo, hi = t["k_range"] or (0, 0)
        if not _wait_for_a_change(rec, hi):
            labs.control(
                rec["name"], {"op": "scale", "k": "raise", "why": f"{what(t)} fell behind"}
            )
        say(f"# governor: {what(t)} fell behind at k={lo:g}..{hi:g}; trying again")

    if first is not None:
        raised(first)
    trials: list[dict] = []
    for _ in range(most):
        t = attempt()
        trials.append(t)
        if not t["fell_behind"]:
            break
        raised(t)
    return trials


def _wait_for_a_change(rec: dict, k: float) -> bool:
    """Until the fabric's governor has raised k above k (it needs a window
    of observations first), at most TRIAL_WAIT_S: did it?"""
    deadline = time.monotonic() + TRIAL_WAIT_S
    while time.monotonic() < deadline:
        now = fabric_governor(rec)["k"]
        if now is not None and now > k:
            return True
        time.sleep(INTERVAL_S)
    return False


def fabric_governor(rec: dict) -> dict:
    """The fabric's governor: on, floor, k and its latest changes."""
    g = labs.control(rec["name"], {"op": "governor"})["governor"]
    return g or {"on": False, "floor_k": float(rec["time_scale"]), "k": None, "events": []}
