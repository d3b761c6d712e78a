"""Scenarios: a lab, concurrent jobs, a timed fault schedule, a seed, the
transports to compare, and what the report should say.  `ethplus scenario
list` and `ethplus scenario run NAME|FILE [--short] [--out DIR]`.

A scenario file (TOML, in netns-labs/scenarios/):

    [scenario]
    description = "one line"
    explain = "the report's paragraph: what this scenario shows"
    lab = "clos-16"                      # a lab file or netns-labs/ name
    seed = 7                             # data, uneven sizes, fault jitter
    transports = ["ethplus", "roce", "tcp"]  # also "ethplus/hpcc": a congestion control
    adaptive = false                     # ethplus: adaptive spraying
    cc = "hpcc"                          # ethplus: congestion control (default: the lab's)
    alone = false                        # also run each job alone (slowdowns)
    metric = "jct"                       # jct | slowdown | busbw | phases

    [[job]]                              # one or more, on disjoint accelerators
    name = "allreduce"
    collective = "all-reduce"
    nodes = ["h0", "h1"]                 # default: every accelerator
    sizes = ["16M"]
    iters = 10
    warmup = 1                           # also algo, dtype, op, root, uneven

    [[fault]]                            # at_us: nominal microseconds after
    at_us = 500.0                        # the jobs' timed phase starts
    node = "plane2"                      # a switch; or link = "h0-plane1"
    set = "down"                         # up, down, loss P, corrupt P, rate R, delay D, jitter J,
                                         # llr on|off
    jitter_us = 0.0                      # a seeded offset in [0, jitter_us)

    [short]                              # the CI form: overrides
    sizes = ["1M"]
    iters = 3
    time_scale = 0.3                     # fault times are multiplied by this

Faults are planned and applied in nominal time, on the fabric's clock, so
every transport meets each at the same point of its job whatever k is or
becomes (the governor may change it mid-run).  Every run is reproducible
from the seed: the same data, the same uneven sizes, the same fault times
(to the scheduler's precision, recorded: planned and applied, nominal).
How the results are read against the faults (slowdown, stalls, phases):
timeline.py.
"""

from __future__ import annotations

import statistics
import threading
import time

from dataplane.lab import faults, governor
from dataplane.model.catalog import bus_factor
from dataplane.model.labfile import LabFileError
from dataplane.model.scenario_file import (  # noqa: F401 - scenario.load and the rest, as callers use them
    METRIC_UNITS,
    METRICS,
    Fault,
    JobSpec,
    Scenario,
    listing,
    load,
    resolve,
    run_names,
    split_run,
    valid_run_name,
)
from dataplane.report import fidelity, timeline
from dataplane.run import bench
from dataplane.run.job import JobError
from dataplane.scale import Scale


def _check_against_lab(sc: Scenario, rec: dict) -> None:
    hosts = {n["name"] for n in rec["topology"]["nodes"] if n["role"] == "host"}
    switches = {n["name"] for n in rec["topology"]["nodes"] if n["role"] == "switch"}
    links = {lk["name"] for lk in rec["topology"]["links"]}
    for j in sc.jobs:
        bad = [n for n in j.nodes or [] if n not in hosts]
        if bad:
            raise LabFileError(
                sc.path, f"job.{j.name}.nodes", f"accelerators of lab {rec['name']}", bad
            )
    for f in sc.faults:
        if f.name not in (links if f.target == "link" else switches):
            raise LabFileError(
                sc.path, f"fault.{f.target}", f"a {f.target} of lab {rec['name']}", f.name
            )


# ---------------------------------------------------------------- running


def _spec(sc: Scenario, j: JobSpec, run_name: str, check_all: bool = False) -> bench.Spec:
    """check_all: verify every iteration (a fault phase: corruption while
    faults hit must not pass unseen)."""
    transport_name, cc = split_run(run_name)
    return bench.Spec(
        collective=j.collective,
        transport=transport_name,
        sizes=j.sizes,
        dtype=j.dtype,
        op=j.op,
        algo=j.algo,
        iters=j.iters,
        warmup=j.warmup,
        root=j.root,
        uneven=j.uneven,
        adaptive=sc.adaptive,
        cc=cc or (sc.cc if transport_name == "ethplus" else None),
        seed=sc.seed,
        check_all=check_all,
    ).validate()


FAULT_POLL_S = 0.002  # how often (real) the fault schedule reads the fabric's clock


def _run_jobs(
    sc: Scenario,
    rec: dict,
    transport_name: str,
    jobs: list[JobSpec],
    with_faults: bool,
    log,
) -> dict:
    """The jobs at once, the fault schedule beside them (at its nominal
    times, on the fabric's clock); results by job."""
    started = threading.Event()
    t0 = [0.0, None]  # real (monotonic) and nominal (the fabric clock's) seconds
    from dataplane.lab import clock  # the compiled C: a scenario file is read without it

    fabric_clock = clock.Clock.open(rec["name"])

    def stamp() -> tuple[float, float | None]:
        return fabric_clock.now() if fabric_clock else (time.monotonic(), None)

    def nominal_us_since_t0() -> float:
        """Nominal time since the timed phase started (without a fabric
        clock, real time over the lab's k)."""
        real, nominal = stamp()
        if nominal is not None and t0[1] is not None:
            return (nominal - t0[1]) * 1e6
        return Scale.of(rec).nominal_s(real - t0[0]) * 1e6

    def progress(name: str) -> None:
        if name == "time-0" and not started.is_set():
            t0[0], t0[1] = stamp()
            started.set()

    runs = [
        bench.Run(
            _spec(sc, j, transport_name, check_all=with_faults and bool(sc.faults)),
            rec,
            nodes=j.nodes,
            on_progress=progress,
            sample=(i == 0),
        )
        for i, j in enumerate(jobs)
    ]
    out: dict = {"jobs": {}, "errors": {}, "faults": []}

    def one(j: JobSpec, r: bench.Run) -> None:
        try:
            out["jobs"][j.name] = r.execute()
        except JobError as exc:
            out["errors"][j.name] = str(exc)
            started.set()

    threads = [threading.Thread(target=one, args=(j, r)) for j, r in zip(jobs, runs, strict=True)]
    for t in threads:
        t.start()
    touched: tuple[set[str], set[str]] = (set(), set())
    try:
        if with_faults and sc.faults:
            started.wait()
            for f in sc.faults:
                due_us = f.at_us
                while (left_us := due_us - nominal_us_since_t0()) > 0 and any(
                    t.is_alive() for t in threads
                ):  # a few ms of real time at a time: k may change meanwhile
                    time.sleep(min(FAULT_POLL_S, Scale.of(rec).real_ns(left_us * 1e3) / 1e9))
                if not any(t.is_alive() for t in threads):
                    break
                if f.target == "link":
                    faults.set_link(rec["name"], f.name, f.change)
                    touched[0].add(f.name)
                else:
                    faults.set_node(rec["name"], f.name, f.words[0] == "up")
                    touched[1].add(f.name)
                at = stamp()[0] - t0[0]
                at_us = nominal_us_since_t0()
                out["faults"].append(
                    {
                        "planned_us": due_us,
                        "at_nominal_us": at_us,
                        "late_us": at_us - due_us,
                        "at_s": at,  # real, this machine's
                        "target": f.target,
                        "name": f.name,
                        "set": " ".join(f.words),
                    }
                )
                log(f"# t={at_us:9.1f} us nominal ({at:6.2f} s real)  {f.target} {f.name}"
                    f" {' '.join(f.words)}")  # fmt: skip
        for t in threads:
            t.join()
    finally:
        faults.restore(rec, *touched)
    out["t0"], out["t0_nominal"] = t0
    return out


def _iterations(result: dict, t0: float, t0_nominal: float | None = None) -> list[dict]:
    """Every timed iteration of a job: start and end (real s after t0, and
    nominal us after the timed phase's start: on the fabric clock, after
    t0_nominal, if it had one; else real time over the lab's k), its nominal
    time and busbw (from the fabric clock's times of the same iteration)."""
    out = []
    world, coll = result["world"], result["collective"]
    scale = Scale.of(result["lab"])
    for rr in result.get("real_rows", []):
        start = rr["t0"]
        nominal = bench.iteration_times_s(rr)
        nends = rr.get("nends") if t0_nominal is not None and rr.get("n0") is not None else None
        nstart = rr.get("n0")
        for i, end in enumerate(rr["ends"]):
            dt = nominal[i] if nominal else scale.nominal_s(end - start)
            bw = rr["size"] / dt / 1e9 * bus_factor(coll, world) if dt > 0 else 0.0
            it = {
                "size": rr["size"],
                "start_s": start - t0,
                "end_s": end - t0,
                "time_nominal_us": dt * 1e6,
                "busbw_GBps": bw,
            }
            if nends:  # when it ran on the fabric's time: k may have changed since t0
                it["start_nominal_us"] = (nstart - t0_nominal) * 1e6
                it["end_nominal_us"] = (nends[i] - t0_nominal) * 1e6
                nstart = nends[i]
            else:
                it["start_nominal_us"] = scale.nominal_s(start - t0) * 1e6
                it["end_nominal_us"] = it["start_nominal_us"] + dt * 1e6
            out.append(it)
            start = end
    return out


def analyse(iters: list[dict], applied: list[dict]) -> dict:
    """A job's iterations read against the faults applied (timeline.py): the
    fault window's slowdown, the stalls, the phases between faults."""
    st = timeline.stalls(iters)
    return {
        "fault_slowdown": timeline.slowdown(iters, timeline.fault_window(applied)),
        "median_iteration_nominal_us": st["median_iteration_us"],
        "longest_iteration_nominal_us": st["longest_iteration_us"],
        "stalls": st["stalls"],
        "stalled_nominal_us": st["stalled_us"],
        "phases": timeline.phases(iters, applied),
    }


def _jct_s(result: dict) -> float:
    """Real seconds the job's timed runs took."""
    rows = result.get("real_rows", [])
    return sum(r["t1"] - r["t0"] for r in rows)


def _jct_nominal_s(result: dict) -> float:
    """Nominal seconds the same runs took, on the fabric clock."""
    rows = result.get("real_rows", [])
    scale = Scale.of(result["lab"])
    return sum(r["n1"] - r["n0"] if "n1" in r else scale.nominal_s(r["t1"] - r["t0"]) for r in rows)


SCENARIO_TRIALS = 3  # a trial is the whole scenario, without its faults


def _trials(sc: Scenario, rec: dict, tname: str, log) -> list[dict]:
    """On a governed lab, the scenario's jobs (without faults, not counted)
    until no part fell behind, as bench's trials: k is where the run needs
    it before the run that counts (the governor alone only follows a run,
    and kernel TCP follows a change of k late: ecmp-collision's tcp JCT was
    1.34x its pinned one without trials)."""
    from dataplane.run import trials  # brings up labs: a scenario file is read without it

    if not _governing(rec):
        return []

    def attempt() -> dict:
        return _verdict(_run_jobs(sc, rec, tname, sc.jobs, False, log))

    log(f"# {sc.name}: {tname}, trials")
    return trials.trial_runs(rec, attempt, lambda _t: f"a trial of {sc.name}", log,
                               SCENARIO_TRIALS)  # fmt: skip


def _governing(rec: dict) -> bool:
    """Is the lab's k the governor's now (governed, and not pinned for a while)?"""
    from dataplane.run import trials  # as _trials

    return governor.governed(rec) and trials.fabric_governor(rec)["on"]


def _verdict(res: dict) -> dict:
    """A run of the jobs (_run_jobs) as a trial: did a part fall behind in
    any job, and the k it ran at."""
    rows = [x for r in res["jobs"].values() for x in r["rows"]]
    return {
        "fell_behind": any(x.get("fell_behind") for x in rows),
        "k_range": k_range({"results": res["jobs"]}),
    }


def _counted(sc: Scenario, rec: dict, tname: str, log, rerun: bool):
    """The run that counts, with its faults; on a governed lab (rerun) one
    that fell behind all the same (the machine got busier since the trials)
    runs again once k was raised, up to SCENARIO_TRIALS times, as bench's
    sizes do.  Returns the last run, its real seconds and the runs it
    replaced (their k and verdicts)."""
    from dataplane.run import trials  # as _trials

    last: dict = {}

    def attempt() -> dict:
        t0 = time.monotonic()
        last["res"] = _run_jobs(sc, rec, tname, sc.jobs, True, log)
        last["real_s"] = time.monotonic() - t0
        return _verdict(last["res"])

    first = attempt()
    reruns: list[dict] = []
    if first["fell_behind"] and rerun and _governing(rec):
        tries = trials.trial_runs(rec, attempt, lambda _t: f"the run of {sc.name}", log,
                                  SCENARIO_TRIALS, first=first)  # fmt: skip
        reruns = [first, *tries[:-1]]
    return last["res"], last["real_s"], reruns


def _repeated(
    sc: Scenario,
    rec: dict,
    tname: str,
    log,
    repeat: int = 1,
    with_trials: bool = True,
) -> dict:
    """The scenario over one transport, repeat times (trials before the
    first run only; each run is redone at a larger k if it fell behind on a
    governed lab, as with_trials says).  One run is returned as it is; of
    several, the run whose figure is the median (of an even count, the lower
    middle's) with every run's figure, k and verdict under "repeats", their
    median as "figure_median" (None if a run stalled or failed), the k
    range over them all and their real seconds added: a transport whose
    runs spread wider than a comparison's band is placed by a median, not by
    one run."""
    runs = []
    for i in range(repeat):
        if repeat > 1:
            log(f"# {sc.name}: {tname}, run {i + 1} of {repeat}")
        runs.append(_transport(sc, rec, tname, log, with_trials and i == 0, rerun=with_trials))
    if repeat == 1:
        return runs[0]
    figs = [_figure(sc, tname, r) for r in runs]
    failed = [i for i, f in enumerate(figs) if f is None]
    if failed:
        rep = dict(runs[failed[0]])
    else:
        order = sorted(range(repeat), key=lambda i: figs[i])  # type: ignore[arg-type, return-value]
        rep = dict(runs[order[(repeat - 1) // 2]])
    ks = [r["k_range"] for r in runs if r["k_range"]]
    rep.update(
        repeats=[
            {
                "figure": f,
                "k_range": r["k_range"],
                "fell_behind": _behind(r),
                "wrong": wrong(r),
                "reruns": len(r["reruns"]),
                "real_s": r["real_s"],
            }
            for f, r in zip(figs, runs, strict=True)
        ],  # fmt: skip
        figure_median=None if failed else statistics.median(figs),
        k_range=[min(k[0] for k in ks), max(k[1] for k in ks)] if ks else None,
        real_s=sum(r["real_s"] for r in runs),
    )
    return rep


def _figure(sc: Scenario, tname: str, r: dict) -> float | None:
    """One run's headline figure (None: stalled or failed)."""
    return summary(sc, {"transports": {tname: r}})["figures"][tname]


def wrong(r: dict) -> int:
    """A transport's run's wrong results (in all its repeats)."""
    if r.get("repeats"):
        return sum(x["wrong"] for x in r["repeats"])
    return sum(j.get("wrong", 0) for j in r["jobs"].values())


def _behind(r: dict) -> bool:
    """Did some part fall behind in a transport's run (in any of its repeats)?"""
    return any(j.get("fell_behind") for j in r["jobs"].values()) or any(
        x["fell_behind"] for x in r.get("repeats", [])
    )


def _transport(
    sc: Scenario,
    rec: dict,
    tname: str,
    log,
    with_trials: bool = True,
    rerun: bool | None = None,
) -> dict:
    """The scenario over one transport: trials on a governed lab (with_trials),
    then the run that counts, with its faults, run again at a larger k if
    it fell behind (rerun; default with_trials)."""
    label = bench.transport_label(*split_run(tname))
    log(f"# {sc.name}: {label}")
    trials = _trials(sc, rec, tname, log) if with_trials else []
    rerun = with_trials if rerun is None else rerun
    res, real_s, reruns = _counted(sc, rec, tname, log, rerun)
    alone = {}
    if sc.alone:
        for j in sc.jobs:
            log(f"# {sc.name}: {tname}, job {j.name} alone")
            a = _run_jobs(sc, rec, tname, [j], False, log)
            if j.name in a["jobs"]:
                alone[j.name] = _jct_nominal_s(a["jobs"][j.name])
    per_job = {}
    for j in sc.jobs:
        r = res["jobs"].get(j.name)
        if r is None:
            per_job[j.name] = {"status": "failed", "error": res["errors"].get(j.name, "?")}
            continue
        iters = _iterations(r, res["t0"], res["t0_nominal"])
        jct = _jct_s(r)
        per_job[j.name] = {
            "status": "ok" if not any(x["wrong"] for x in r["rows"]) else "wrong",
            # some part of the emulation fell behind in a size of this job
            "fell_behind": any(x.get("fell_behind") for x in r["rows"]),
            "collective": j.collective,
            "nodes": j.nodes,
            "jct_real_s": jct,
            "jct_nominal_us": _jct_nominal_s(r) * 1e6,
            "wrong": sum(x["wrong"] for x in r["rows"]),
            "busbw_GBps": r["rows"][-1]["busbw_GBps"],
            "busbw_range_GBps": r["rows"][-1]["busbw_range_GBps"],
            "iterations": iters,
            "slowdown_vs_alone": (_jct_nominal_s(r) / alone[j.name] if alone.get(j.name) else None),
            **analyse(iters, res["faults"]),
        }
    sampled = res["jobs"].get(sc.jobs[0].name)
    return {
        "label": label,
        "k_range": _verdict(res)["k_range"],  # the fabric's k during the run
        "jobs": per_job,
        "faults_applied": res["faults"],
        "results": res["jobs"],
        "fidelity": sampled["fidelity"] if sampled else None,
        "stalled": sorted(res["errors"]),
        "trials": trials,
        "reruns": reruns,  # counted runs that fell behind and ran again at a larger k
        "real_s": real_s,  # the counted run's, alone-runs excluded
    }


def run(sc: Scenario, rec: dict, log=print, repeat: int = 1) -> dict:
    """Run the scenario over each of its transports on a running lab
    (repeat times each: the figures are the medians, _repeated)."""
    _check_against_lab(sc, rec)
    out: dict = {
        "scenario": sc.name,
        "description": sc.description,
        "explain": sc.explain,
        "seed": sc.seed,
        "short": sc.short,
        "metric": sc.metric,
        "planned_faults": [vars(f) for f in sc.faults],
        "repeat": repeat,
        "transports": {},
    }
    for tname in sc.transports:
        out["transports"][tname] = _repeated(sc, rec, tname, log, repeat)
    out["summary"] = summary(sc, out)
    return out


# The k check (`scenario run --check-k`): each transport's run again with k
# pinned at K_CHECK_FACTOR x the highest k any transport's counted run used,
# its headline figure against the counted run's.  A figure that is the
# fabric's does not move; the bands are issue 22's (a scenario's figure
# moves from run to run more than a bench size's: kernel TCP's most).
K_CHECK_FACTOR = fidelity.K_CHECK_FACTOR
K_CHECK_BAND = 0.07
K_CHECK_BAND_TCP = 0.10


def k_range(r: dict) -> list[float] | None:
    """The lowest and highest k of a transport's counted run (its jobs' rows)."""
    ks = [x["k_range"] for res in r["results"].values() for x in res["rows"] if x.get("k_range")]
    return [min(k[0] for k in ks), max(k[1] for k in ks)] if ks else None


def check_k(
    sc: Scenario,
    rec: dict,
    out: dict,
    factor: float = K_CHECK_FACTOR,
    k_max: float | None = None,
    log=print,
    repeat: int | None = None,
) -> dict:
    """Run each of out's transports again with k pinned at factor x the
    highest k any of them ran at (at most k_max; kernel TCP at most at 0.9
    of the k where the kernel's RTO cap would cut the lab's minimum RTO),
    without trials, the faults at the same nominal times, as many times as the run did (or
    repeat; the medians), and compare each headline figure.
    Sets and returns out["k_check"]; the lab's time scale is as before
    after (governed again if it was)."""
    from dataplane.lab import kernel, labs  # as _trials
    from dataplane.run import trials

    ranges = {t: r["k_range"] for t, r in out["transports"].items()}
    tops = [kr[1] for kr in ranges.values() if kr]
    k_top = max(tops) if tops else float(rec["time_scale"])
    k_pin = factor * k_top if k_max is None else max(k_top, min(k_max, factor * k_top))
    state = trials.fabric_governor(rec)
    k_was = state["k"] if state["k"] is not None else float(rec["time_scale"])
    repeat = repeat or out.get("repeat", 1)
    check: dict = {"factor": factor, "k_top": k_top, "repeat": repeat, "transports": {}}
    pinned: dict = {}
    try:
        for tname, r in out["transports"].items():
            k, note = k_pin, ""
            if split_run(tname)[0] == "tcp":
                k_cap = 0.9 * kernel.tcp_rto_min_k_cap(kernel.tcp_settings(rec)[0])
                if k > k_cap:
                    k = max(k_cap, k_top)
                    note = (f"pinned at {k / k_top:.2f}x the highest k: past"
                            f" k={k_cap / 0.9:g} the kernel's 120 s cap would cut the lab's"
                            " minimum RTO")  # fmt: skip
            log(f"# {sc.name}: {tname}, the k check at k={k:g}")
            labs.control(rec["name"], {"op": "scale", "k": k})
            if k != factor * k_top and not note:
                note = f"pinned at {k / k_top:.2f}x the highest k (at most k={k_max:g})"
            again = _repeated(sc, rec, tname, log, repeat, False)
            pinned[tname] = again
            check["transports"][tname] = _compared(sc, tname, r, again, ranges[tname], k, note)
    finally:
        labs.control(rec["name"], {"op": "scale", "k": k_was})
        if state["on"]:
            labs.control(rec["name"], {"op": "scale", "k": "auto"})
    at_k = summary(sc, {"transports": pinned})
    check["figures_at_k"] = at_k["figures"]
    check["ethplus_advantage_at_k"] = at_k["ethplus_advantage"]
    check["runs"] = {t: {x: v for x, v in r.items() if x != "results"} for t, r in pinned.items()}
    out["k_check"] = check
    return check


def _compared(sc: Scenario, tname: str, r: dict, again: dict, kr, k: float, note: str) -> dict:
    """One transport's k check: its figure governed (or as run) and pinned."""
    fig, fig_k = _figure(sc, tname, r), _figure(sc, tname, again)
    band = K_CHECK_BAND_TCP if split_run(tname)[0] == "tcp" else K_CHECK_BAND
    ratio = fig / fig_k if fig and fig_k else None
    behind = [_behind(x) for x in (r, again)]
    return {
        "k_range": kr,
        "k": k,
        "k_range_at_k": again["k_range"],  # the fabric's k in the check's run
        "figure": fig,
        "figure_at_k": fig_k,
        "ratio": ratio,  # the run's figure over the one at the larger k
        "band": band,
        # None: a run stalled or failed, or fell behind (no verdict to give)
        "held": None if ratio is None or any(behind) else abs(ratio - 1) <= band,
        "fell_behind": behind,
        "wrong": wrong(again),
        "real_s": again["real_s"],
        "note": note,
    }


def summary(sc: Scenario, out: dict) -> dict:
    """The scenario's headline figure per transport, and ethplus's ratio to each."""
    fig: dict[str, float | None] = {}
    spread: dict[str, list[float] | None] = {}
    for t, r in out["transports"].items():
        jobs = [j for j in r["jobs"].values() if j["status"] != "failed"]
        spread[t] = None
        if len(jobs) != len(r["jobs"]):
            fig[t] = None
        elif sc.metric == "jct":  # nominal: comparable across time scales and machines
            job = max(jobs, key=lambda j: j["jct_nominal_us"])
            fig[t], spread[t] = job["jct_nominal_us"], _spread("jct", job)
        elif sc.metric == "busbw":
            job = min(jobs, key=lambda j: j["busbw_GBps"])
            fig[t], spread[t] = job["busbw_GBps"], _spread("busbw", job)
        elif sc.metric == "slowdown":
            fig[t] = (
                max((j["slowdown_vs_alone"] or 0.0) for j in jobs)
                if sc.alone
                else _fault_slowdown(jobs[0])
            )
        else:  # phases: the last phase's busbw against the first's (None: too few iterations)
            ph = jobs[0]["phases"]
            fig[t] = (
                ph[-1]["busbw_GBps"] / ph[0]["busbw_GBps"]
                if len(ph) > 1 and ph[0]["busbw_GBps"] and ph[-1]["busbw_GBps"] is not None
                else None
            )
        if r.get("repeats"):  # several runs: their median (_repeated)
            fig[t] = r["figure_median"]
    lower_better = sc.metric in ("jct", "slowdown")
    ratios = {}
    ref = reference_run(list(fig))
    e = fig.get(ref) if ref else None
    for t, v in fig.items():
        if t != ref and e and v:
            ratios[t] = (v / e) if lower_better else (e / v)
    behind = sorted(t for t, r in out["transports"].items() if _behind(r))
    return {
        "metric": sc.metric,
        "unit": METRIC_UNITS[sc.metric],
        "fell_behind": behind,  # runs where some part of the emulation fell behind
        "lower_is_better": lower_better,
        "figures": fig,
        # the figure if every iteration had been the job's best or worst
        "spread": spread,
        "reference": ref,
        "ethplus_advantage": ratios,  # the reference run's, over each other run
    }


def _spread(metric: str, job: dict) -> list[float] | None:
    """The range a job's timed iterations give its figure: busbw, the lowest
    and highest iteration of its last size; a job completion time, n times the
    shortest and the longest of its n iterations (one size only).  A
    transport whose iterations spread wider than a comparison's band cannot
    be told apart at that band by one run."""
    if metric == "busbw":
        return job.get("busbw_range_GBps")  # bench's, of the job's last size
    its = job.get("iterations")
    if metric == "jct" and its and len({x["size"] for x in its}) == 1:
        ts = [x["time_nominal_us"] for x in its]
        return [min(ts) * len(ts), max(ts) * len(ts)]
    return None


def reference_run(names: list[str]) -> str | None:
    """The run the others are measured against: plain ethplus if it ran,
    else the first ethplus run listed (ethplus/hpcc against ethplus/nscc)."""
    if "ethplus" in names:
        return "ethplus"
    return next((t for t in names if split_run(t)[0] == "ethplus"), None)


def _fault_slowdown(job: dict) -> float | None:
    """The fault window's slowdown (timeline.slowdown); None when it cannot
    be told (the job's record says why)."""
    return job.get("fault_slowdown", {}).get("slowdown")
