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
from dataplane.run.job import JobError


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


def run(
    spec, rec: dict, on_row=None, on_progress=None, nodes=None, log=None, k_check: bool = True
) -> dict:
    """bench.run of spec (a bench.Spec), with trials first when the lab is
    governed (see the module), and its sizes checked at a larger k after
    (check_k; k_check=False: not)."""
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
    budget_s = max(K_CHECK_MIN_S, K_CHECK_SHARE * result["wall_s"])
    checks = check_k(spec, rec, result["rows"], budget_s, on_row, nodes, log) if k_check else []
    if (reruns or checks) and result.get("fidelity"):
        fidelity.after_reruns(result["fidelity"], result["rows"], reruns, checks)
    ks = [r["k_range"] for r in result["rows"] if r.get("k_range")]
    result["governor"] = {
        "setting": "auto",
        "floor_k": floor,
        "k": min((k[0] for k in ks), default=result["lab"]["time_scale"]),
        "k_max": max((k[1] for k in ks), default=result["lab"]["time_scale"]),
        "trials": trials,
        "reruns": reruns,
        # each size run again at K_CHECK_FACTOR x its k (check_k), in order
        "k_checks": checks,
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


# A governed run's sizes are checked at a second time scale (check_k): a
# nominal figure that moves when k does holds the host's own latencies (a
# thread's wake-up, a softirq's delay: real time, 1/k of it nominal), which
# no part's lateness shows.  Latency-bound sizes are cheap to run again and
# the most exposed (erack-8x4, ethplus, 1 MiB all-reduce: 26.95 us at k
# 6400, 24.49 at 25,600 and 24.37 at 102,400; docs/performance.md).
K_CHECK_FACTOR = fidelity.K_CHECK_FACTOR
k_text = fidelity.k_text  # (callers name it here)
K_MOVED_MAX = fidelity.K_MOVED_MAX  # |nominal time ratio - 1| past this: it moved with k
K_CHECK_SHARE = 0.5  # of the run's own real time, spent on checks at most ...
K_CHECK_MIN_S = 10.0  # ... or this many real seconds, if more
K_CHECK_ITERS = 5  # timed iterations of a check at most (1 warm-up): at 4x k they vary less
K_CHECK_LEVELS = 3  # a size that moved is checked again, at 4x that k
K_CHECK_MAX = 1e8


def k_moved(row: dict, again: dict) -> float | None:
    """How far row's nominal time moved at the larger k (row / again), if
    it moved past K_MOVED_MAX and the run at the larger k was clean; else
    None."""
    ratio = row["time_us"] / again["time_us"]
    return ratio if abs(ratio - 1) > K_MOVED_MAX and not again["fell_behind"] else None


def check_k(spec, rec: dict, rows: list[dict], budget_s: float, on_row=None, nodes=None,
            log=None) -> list[dict]:  # fmt: skip
    """Each size, smallest first while budget_s of real time lasts, runs
    again with k pinned at K_CHECK_FACTOR x the highest k it ran at.  A size
    whose nominal time moved (k_moved) is replaced by the run at the larger
    k, which is checked in turn (K_CHECK_LEVELS at most); one that held
    stays.  Each final row lists its checks (`k_checks`); returns them all.
    The governor has the lab again after, from the k it had before."""
    say = log or (lambda _msg: None)
    checks: list[dict] = []
    k_was = fabric_governor(rec)["k"]
    try:
        for i in sorted(range(len(rows)), key=lambda i: rows[i]["size_bytes"]):
            history: list[dict] = []
            for _ in range(K_CHECK_LEVELS):
                row = rows[i]
                lo, hi = row.get("k_range") or (rec["time_scale"], rec["time_scale"])
                k = hi * K_CHECK_FACTOR
                one = dataclasses.replace(
                    spec, sizes=[row["size_bytes"]], iters=min(spec.iters, K_CHECK_ITERS),
                    warmup=min(spec.warmup, 1),
                )  # fmt: skip
                runs = 1 + max(0, one.warmup - 1) + one.iters  # (the first: worker.py's check)
                cost_s = row["time_real_us"] / 1e6 * runs * K_CHECK_FACTOR
                if cost_s > budget_s or k > K_CHECK_MAX:
                    if not history:  # never checked: the reader is told why
                        why = (f"it would take about {cost_s:.0f} s, past the {budget_s:.0f} s"
                               f" left for checks" if cost_s > budget_s
                               else f"past the largest k checked, {K_CHECK_MAX:g}")  # fmt: skip
                        say(f"# k check: {row['size_bytes']} B not run at k={k:g}: {why}")
                    break
                labs.control(rec["name"], {"op": "scale", "k": k})
                t0 = time.monotonic()
                try:
                    again = bench.run(one, rec, nodes=nodes)["rows"][0]
                except JobError as e:  # the run stands; its check could not be made
                    say(f"# k check: {row['size_bytes']} B at k={k:g} failed: {e}")
                    break
                finally:
                    budget_s -= time.monotonic() - t0
                moved = k_moved(row, again)
                check = {
                    "size_bytes": row["size_bytes"], "k_range": [lo, hi], "k": k,
                    "time_us": row["time_us"], "time_us_at_k": again["time_us"],
                    "ratio": row["time_us"] / again["time_us"], "moved": moved is not None,
                }  # fmt: skip
                history.append(check)
                checks.append(check)
                if again["wrong"]:  # never hidden, whichever run the row ends up being
                    say(f"# k check: {row['size_bytes']} B at k={k:g}: {again['wrong']} wrong")
                    row["wrong"] = again["wrong"] = row["wrong"] + again["wrong"]
                if moved is None:
                    break
                say(f"# k check: {row['size_bytes']} B's nominal time at k={k_text([lo, hi])} was"
                    f" {moved:.3f}x its time at k={k:g}: the host's latency was in it; its row"
                    f" is now k={k:g}'s run")  # fmt: skip
                rows[i] = again
                if on_row:
                    on_row(again)
            if history:
                rows[i]["k_checks"] = history
    finally:
        if k_was is not None:
            labs.control(rec["name"], {"op": "scale", "k": k_was})
        labs.control(rec["name"], {"op": "scale", "k": "auto"})
    return checks


# A program's calls (`ethplus run`) cannot run again, but the same calls can:
# check_calls_k runs bench's collective at each summary row's size, at the
# lowest k the program ran at and at K_CHECK_FACTOR x it.  Where that moved, the
# program's calls of the size carried the host's latency by about as much.
CALLS_CHECKED = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast")
CALL_CHECK_ITERS = 5


def k_range_since(rec: dict, t0: float, k_start: float) -> tuple[float, float]:
    """The lowest and highest k of a governed lab from monotonic time t0 on,
    when its k was k_start (the governor's changes since)."""
    ks = [k_start] + [e["k_to"] for e in fabric_governor(rec)["events"] if e["t_real"] >= t0]
    return min(ks), max(ks)


def check_calls_k(rec: dict, rows: list[dict], transport: str, algo: str, nodes,
                  budget_s: float, k_run: float, log=None) -> list[dict]:  # fmt: skip
    """The rows of a program's call summary (launcher.summary) that bench
    can run, per collective, smallest sizes first while budget_s of real
    time lasts: bench's same collective at each row's (largest) size, on the
    same ranks and transport (all-reduce: the program's algorithm), one run
    of all its sizes with k pinned at k_run (the lowest k the program ran
    at: where its calls carried the most of the host's latency) and one at
    K_CHECK_FACTOR x it.  Sets each row's `k_check` (as check_k's checks:
    k_range the first run's, k the second's, both nominal times, their
    ratio, moved past K_MOVED_MAX or not, each run's verdict) and returns
    the checks.  The
    governor has the lab again after."""
    say = log or (lambda _msg: None)
    quantum = 4 * len(nodes)  # whole float32 elements in every rank's share
    runs = 2 + CALL_CHECK_ITERS  # the checked first run, a warm-up, the timed ones
    by_collective: dict[str, list[tuple[int, dict]]] = {}
    for row in sorted(rows, key=lambda r: r["size_bytes"]):
        if row["collective"] in CALLS_CHECKED and row["calls"]:
            size = -(-row["size_bytes"] // quantum) * quantum
            by_collective.setdefault(row["collective"], []).append((size, row))
    checks: list[dict] = []
    try:
        for collective, todo in sorted(by_collective.items(), key=lambda x: x[1][0][0]):
            cost_s, chosen = 0.0, []
            for size, row in todo:
                cost_s += row["time_s"] / row["calls"] * k_run * runs * (1 + K_CHECK_FACTOR)
                if cost_s > budget_s:
                    break
                chosen.append((size, row))
            if not chosen:
                break
            spec = bench.Spec(
                collective=collective, transport=transport,
                sizes=sorted({size for size, _ in chosen}),
                algo=algo if collective == "all-reduce" else "ring",
                iters=CALL_CHECK_ITERS, warmup=1,
            ).validate()  # fmt: skip
            t0 = time.monotonic()
            try:
                at: list[dict[int, dict]] = []
                for k in (k_run, k_run * K_CHECK_FACTOR):
                    labs.control(rec["name"], {"op": "scale", "k": k})
                    res = bench.run(spec, rec, nodes=nodes)
                    at.append({r["size_bytes"]: r for r in res["rows"]})
            except JobError as e:
                say(f"# k check: {collective} failed: {e}")
                break
            finally:
                budget_s -= time.monotonic() - t0
            done: dict[int, dict] = {}  # rows that round to one size share its check
            for size, row in chosen:
                if size in done:
                    row["k_check"] = done[size]
                    continue
                a, b = at[0][size], at[1][size]
                ratio = a["time_us"] / b["time_us"]
                check = {
                    "collective": collective, "size_bytes": size, "k_range": [k_run, k_run],
                    "k": k_run * K_CHECK_FACTOR, "time_us": a["time_us"],
                    "time_us_at_k": b["time_us"], "ratio": ratio,
                    "moved": abs(ratio - 1) > K_MOVED_MAX and not b["fell_behind"],
                    "fell_behind": [a["fell_behind"], b["fell_behind"]],
                    "wrong": a["wrong"] + b["wrong"],
                }  # fmt: skip
                row["k_check"] = done[size] = check
                checks.append(check)
                if check["wrong"]:  # bench's own data, never the program's: said all the same
                    say(f"# k check: bench's {collective} of {size} B: {check['wrong']} wrong")
                if check["moved"]:
                    say(f"# k check: bench's {collective} of {size} B took {ratio:.3f}x as long"
                        f" at k={k_run:g} as at k={check['k']:g}: the program's calls of"
                        " that size carried the host's latency by about as much")  # fmt: skip
    finally:
        labs.control(rec["name"], {"op": "scale", "k": k_run})
        labs.control(rec["name"], {"op": "scale", "k": "auto"})
    return checks


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
            labs.control(rec["name"], {"op": "scale", "k": "raise", "from": hi,
                                       "why": f"{what(t)} fell behind"})  # fmt: skip
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
