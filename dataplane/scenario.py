"""Scenarios: a lab, concurrent jobs, a timed fault schedule, a seed, the
transports to compare, and what the report should say.  `ethplus scenario
list` and `ethplus scenario run NAME|FILE [--short] [--out DIR]`.

A scenario file (TOML, in netns-labs/scenarios/):

    [scenario]
    description = "one line"
    explain = "the report's paragraph: what this scenario shows"
    lab = "clos-16"                      # a lab file or netns-labs/ name
    seed = 7                             # data, uneven sizes, fault jitter
    transports = ["ethplus", "roce", "tcp"]
    adaptive = false                     # ethplus: adaptive spraying
    alone = false                        # also run each job alone (slowdowns)
    metric = "jct"                       # jct | slowdown | busbw | phases

    [[job]]                              # one or more, on disjoint accelerators
    name = "allreduce"
    collective = "all-reduce"
    nodes = ["h0", "h1"]                 # default: every accelerator
    sizes = ["16M"]
    iters = 10
    warmup = 1                           # also algo, dtype, op, root, uneven

    [[fault]]                            # at_s: seconds (real) after the jobs'
    at_s = 5.0                           # timed phase starts
    node = "plane2"                      # a switch; or link = "h0-plane1"
    set = "down"                         # up, down, loss P, corrupt P, rate R, delay D
    jitter_s = 0.0                       # a seeded offset in [0, jitter_s)

    [short]                              # the CI form: overrides
    sizes = ["1M"]
    iters = 3
    time_scale = 0.3                     # fault times are multiplied by this

Every run is reproducible from the seed: the same data, the same uneven
sizes, the same fault times (to the scheduler's precision, recorded).
"""

from __future__ import annotations

import random
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from dataplane import bench, faults, transport
from dataplane.collectives import COLLECTIVES, bus_factor, canonical
from dataplane.job import JobError
from dataplane.labfile import LABS_DIR, LabFileError, resolve_path

SCENARIO_DIR = LABS_DIR / "scenarios"
METRICS = ("jct", "slowdown", "busbw", "phases")


@dataclass
class JobSpec:
    name: str
    collective: str
    nodes: list[str] | None
    sizes: list[int]
    iters: int
    warmup: int = 1
    algo: str = "ring"
    dtype: str = "float32"
    op: str = "sum"
    root: int = 0
    uneven: bool = False


@dataclass
class Fault:
    at_s: float
    target: str  # "link" or "node"
    name: str
    words: list[str]
    change: dict = field(default_factory=dict)


@dataclass
class Scenario:
    name: str
    path: str
    description: str
    explain: str
    lab: str
    seed: int
    transports: list[str]
    adaptive: bool
    alone: bool
    metric: str
    jobs: list[JobSpec]
    faults: list[Fault]
    short: bool = False


def _err(path: str, key: str, expected: str, value=None) -> LabFileError:
    return LabFileError(path, key, expected, value)


def resolve(name_or_path: str) -> Path:
    return resolve_path(name_or_path, SCENARIO_DIR, "scenario file")


def _get(path, table: dict, key: str, where: str, kind, default=..., check=None, expected=""):
    if key not in table:
        if default is ...:
            raise _err(path, f"{where}.{key}", expected or f"a {kind.__name__}")
        return default
    v = table[key]
    ok = isinstance(v, kind) and not (kind in (int, float) and isinstance(v, bool))
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v, ok = float(v), True
    if not ok or (check and not check(v)):
        raise _err(path, f"{where}.{key}", expected or f"a {kind.__name__}", v)
    return v


def load(name_or_path: str, short: bool = False) -> Scenario:
    """Read and check a scenario file; LabFileError (one line) if it is wrong."""
    p = resolve(name_or_path)
    path = str(p)
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise LabFileError(path, "file", "valid TOML", detail=str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LabFileError(path, "file", "a readable UTF-8 text file", detail=str(exc)) from None
    for key in data:
        if key not in ("scenario", "job", "fault", "short"):
            raise _err(path, key, "one of the sections [scenario], [[job]], [[fault]], [short]")
    sc = data.get("scenario")
    if not isinstance(sc, dict):
        raise _err(path, "scenario", "a [scenario] table")
    known = {"description", "explain", "lab", "seed", "transports", "adaptive", "alone", "metric"}
    for key in sc:
        if key not in known:
            raise _err(path, f"scenario.{key}", "a known key (" + ", ".join(sorted(known)) + ")")
    avail = transport.available()
    transports = _get(
        path,
        sc,
        "transports",
        "scenario",
        list,
        avail,
        lambda v: v and all(t in avail for t in v),
        "a list of transports from " + ", ".join(avail),
    )
    sh = data.get("short", {})
    if not isinstance(sh, dict):
        raise _err(path, "short", "a [short] table")
    for key in sh:
        if key not in ("sizes", "iters", "warmup", "time_scale"):
            raise _err(path, f"short.{key}", "one of sizes, iters, warmup, time_scale")
    jobs_raw = data.get("job")
    if not isinstance(jobs_raw, list) or not jobs_raw:
        raise _err(path, "job", "one or more [[job]] tables")
    jobs = [_job(path, i, j, sh if short else {}) for i, j in enumerate(jobs_raw)]
    seen: dict[str, str] = {}
    for j in jobs:
        for n in j.nodes or ["*"]:
            if n in seen or (n == "*" and seen) or "*" in seen:
                raise _err(path, f"job.{j.name}.nodes", "accelerators no other job uses", j.nodes)
            seen[n] = j.name
    if len({j.name for j in jobs}) != len(jobs):
        raise _err(path, "job.name", "a different name for every job")
    scale = (
        _get(path, sh, "time_scale", "short", float, 1.0, lambda v: v > 0, "a number > 0")
        if short
        else 1.0
    )
    seed = _get(path, sc, "seed", "scenario", int, 1)
    rng = random.Random(seed)
    fl = [_fault(path, i, f, scale, rng) for i, f in enumerate(data.get("fault", []))]
    return Scenario(
        name=p.stem,
        path=path,
        description=_get(path, sc, "description", "scenario", str, ""),
        explain=_get(path, sc, "explain", "scenario", str, ""),
        lab=_get(path, sc, "lab", "scenario", str, expected="a lab file or netns-labs/ name"),
        seed=seed,
        transports=transports,
        adaptive=_get(path, sc, "adaptive", "scenario", bool, False),
        alone=_get(path, sc, "alone", "scenario", bool, False),
        metric=_get(
            path,
            sc,
            "metric",
            "scenario",
            str,
            "jct",
            lambda v: v in METRICS,
            "one of " + ", ".join(METRICS),
        ),
        jobs=jobs,
        faults=sorted(fl, key=lambda f: f.at_s),
        short=short,
    )


def _job(path: str, i: int, j, short: dict) -> JobSpec:
    where = f"job[{i}]"
    if not isinstance(j, dict):
        raise _err(path, where, "a table")
    known = {
        "name",
        "collective",
        "nodes",
        "sizes",
        "iters",
        "warmup",
        "algo",
        "dtype",
        "op",
        "root",
        "uneven",
    }
    for key in j:
        if key not in known:
            raise _err(path, f"{where}.{key}", "a known key (" + ", ".join(sorted(known)) + ")")
    name = _get(path, j, "name", where, str, f"job{i}")
    where = f"job.{name}"
    coll = _get(path, j, "collective", where, str, expected="one of " + ", ".join(COLLECTIVES))
    try:
        coll = canonical(coll)
    except ValueError:
        raise _err(path, f"{where}.collective", "one of " + ", ".join(COLLECTIVES), coll) from None
    nodes = _get(
        path,
        j,
        "nodes",
        where,
        list,
        None,
        lambda v: len(v) >= 2 and all(isinstance(x, str) for x in v),
        "a list of two or more accelerator names",
    )
    sizes_raw = short.get("sizes", j.get("sizes"))
    if not isinstance(sizes_raw, list) or not sizes_raw:
        raise _err(path, f"{where}.sizes", 'a list of sizes such as ["1M", "64M"]', sizes_raw)
    try:
        sizes = [bench.parse_size(str(x), f"{where}.sizes") for x in sizes_raw]
    except bench.BenchError as exc:
        raise LabFileError(
            path, f"{where}.sizes", "sizes such as 8K, 64M", detail=str(exc)
        ) from None
    iters = short.get(
        "iters", _get(path, j, "iters", where, int, 5, lambda v: v >= 1, "an integer >= 1")
    )
    warmup = short.get(
        "warmup", _get(path, j, "warmup", where, int, 1, lambda v: v >= 0, "an integer >= 0")
    )
    return JobSpec(
        name=name,
        collective=coll,
        nodes=nodes,
        sizes=sizes,
        iters=int(iters),
        warmup=int(warmup),
        algo=_get(path, j, "algo", where, str, "ring"),
        dtype=_get(path, j, "dtype", where, str, "float32"),
        op=_get(path, j, "op", where, str, "sum"),
        root=_get(path, j, "root", where, int, 0),
        uneven=_get(path, j, "uneven", where, bool, False),
    )


def _fault(path: str, i: int, f, scale: float, rng: random.Random) -> Fault:
    where = f"fault[{i}]"
    if not isinstance(f, dict):
        raise _err(path, where, "a table")
    for key in f:
        if key not in ("at_s", "link", "node", "set", "jitter_s"):
            raise _err(path, f"{where}.{key}", "one of at_s, link, node, set, jitter_s")
    at = _get(path, f, "at_s", where, float, expected="seconds >= 0", check=lambda v: v >= 0)
    jitter = _get(path, f, "jitter_s", where, float, 0.0, lambda v: v >= 0, "seconds >= 0")
    words = _get(
        path, f, "set", where, str, expected="up, down, loss P, corrupt P, rate R, delay D"
    )
    if ("link" in f) == ("node" in f):
        raise _err(path, where, 'exactly one of link = "..." or node = "..."')
    target = "link" if "link" in f else "node"
    name = _get(path, f, target, where, str)
    change: dict = {}
    if target == "link":
        try:
            change = faults.link_change(words.split())
        except ValueError as exc:
            raise LabFileError(
                path,
                f"{where}.set",
                "up, down, loss P, corrupt P, rate R, delay D",
                detail=str(exc),
            ) from None
    elif words not in ("up", "down"):
        raise _err(path, f"{where}.set", "up or down (a switch)", words)
    return Fault(
        at_s=(at + rng.random() * jitter) * scale,
        target=target,
        name=name,
        words=words.split(),
        change=change,
    )


def listing() -> list[Scenario]:
    return [load(str(p)) for p in sorted(SCENARIO_DIR.glob("*.toml"))]


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


def _spec(sc: Scenario, j: JobSpec, transport_name: str) -> bench.Spec:
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
        seed=sc.seed,
    ).validate()


def _run_jobs(
    sc: Scenario, rec: dict, transport_name: str, jobs: list[JobSpec], with_faults: bool, log
) -> dict:
    """The jobs at once, the fault schedule beside them; results by job."""
    started = threading.Event()
    t0 = [0.0]

    def progress(name: str) -> None:
        if name == "time-0" and not started.is_set():
            t0[0] = time.monotonic()
            started.set()

    runs = [
        bench.Run(
            _spec(sc, j, transport_name), rec, nodes=j.nodes, on_progress=progress, sample=(i == 0)
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
                while time.monotonic() < t0[0] + f.at_s and any(t.is_alive() for t in threads):
                    time.sleep(min(0.01, max(0.0, t0[0] + f.at_s - time.monotonic())))
                if not any(t.is_alive() for t in threads):
                    break
                if f.target == "link":
                    faults.set_link(rec["name"], f.name, f.change)
                    touched[0].add(f.name)
                else:
                    faults.set_node(rec["name"], f.name, f.words[0] == "up")
                    touched[1].add(f.name)
                at = time.monotonic() - t0[0]
                out["faults"].append(
                    {
                        "planned_s": f.at_s,
                        "at_s": at,
                        "target": f.target,
                        "name": f.name,
                        "set": " ".join(f.words),
                    }
                )
                log(f"# t={at:6.2f} s  {f.target} {f.name} {' '.join(f.words)}")
        for t in threads:
            t.join()
    finally:
        faults.restore(rec, *touched)
    out["t0"] = t0[0]
    return out


def _iterations(result: dict, t0: float) -> list[dict]:
    """Every timed iteration of a job: start, end (s after t0) and busbw."""
    out = []
    world, coll = result["world"], result["collective"]
    k = result["lab"]["time_scale"]
    for rr in result.get("real_rows", []):
        start = rr["t0"]
        for end in rr["ends"]:
            dt = end - start
            bw = rr["size"] / (dt / k) / 1e9 * bus_factor(coll, world) if dt > 0 else 0.0
            out.append(
                {"size": rr["size"], "start_s": start - t0, "end_s": end - t0, "busbw_GBps": bw}
            )
            start = end
    return out


def _jct_s(result: dict) -> float:
    rows = result.get("real_rows", [])
    return sum(r["t1"] - r["t0"] for r in rows)


def _phases(iters: list[dict], applied: list[dict]) -> list[dict]:
    """Mean busbw of the iterations that overlap each span between faults (an
    iteration stalled across a whole span counts, at its low busbw)."""
    edges = [0.0] + [f["at_s"] for f in applied] + [float("inf")]
    names = ["before any fault"] + [f"after {f['name']} {f['set']}" for f in applied]
    out = []
    for (a, b), name in zip(zip(edges, edges[1:], strict=False), names, strict=False):
        over = [x for x in iters if x["start_s"] < b and x["end_s"] > a]
        mean = sum(x["busbw_GBps"] for x in over) / len(over) if over else 0.0
        longest = max((x["end_s"] - x["start_s"] for x in over), default=0.0)
        out.append({"phase": name, "iterations": len(over), "busbw_GBps": mean,
                    "longest_iteration_s": longest})  # fmt: skip
    return out


def run(sc: Scenario, rec: dict, log=print) -> dict:
    """Run the scenario over each of its transports on a running lab."""
    _check_against_lab(sc, rec)
    out: dict = {
        "scenario": sc.name,
        "description": sc.description,
        "explain": sc.explain,
        "seed": sc.seed,
        "short": sc.short,
        "metric": sc.metric,
        "planned_faults": [vars(f) for f in sc.faults],
        "transports": {},
    }
    for tname in sc.transports:
        log(f"# {sc.name}: {transport.LABELS[tname]}")
        res = _run_jobs(sc, rec, tname, sc.jobs, True, log)
        alone = {}
        if sc.alone:
            for j in sc.jobs:
                log(f"# {sc.name}: {tname}, job {j.name} alone")
                a = _run_jobs(sc, rec, tname, [j], False, log)
                if j.name in a["jobs"]:
                    alone[j.name] = _jct_s(a["jobs"][j.name])
        per_job = {}
        for j in sc.jobs:
            r = res["jobs"].get(j.name)
            if r is None:
                per_job[j.name] = {"status": "failed", "error": res["errors"].get(j.name, "?")}
                continue
            iters = _iterations(r, res["t0"])
            jct = _jct_s(r)
            before = [
                x["end_s"] - x["start_s"]
                for x in iters
                if not res["faults"] or x["end_s"] <= res["faults"][0]["at_s"]
            ]
            longest = max((x["end_s"] - x["start_s"] for x in iters), default=0.0)
            typical = sorted(before)[len(before) // 2] if before else 0.0
            per_job[j.name] = {
                "status": "ok" if not any(x["wrong"] for x in r["rows"]) else "wrong",
                "collective": j.collective,
                "nodes": j.nodes,
                "jct_real_s": jct,
                "jct_nominal_us": jct / r["lab"]["time_scale"] * 1e6,
                "wrong": sum(x["wrong"] for x in r["rows"]),
                "busbw_GBps": r["rows"][-1]["busbw_GBps"],
                "iterations": iters,
                "phases": _phases(iters, res["faults"]),
                "slowdown_vs_alone": jct / alone[j.name] if alone.get(j.name) else None,
                # an iteration that took over three typical ones (before any
                # fault): the transport stalled for about the difference
                "typical_iteration_s": typical,
                "longest_iteration_s": longest,
                "stalled_s": longest - typical if typical and longest > 3 * typical else 0.0,
            }
        sampled = res["jobs"].get(sc.jobs[0].name)
        out["transports"][tname] = {
            "label": transport.LABELS[tname],
            "jobs": per_job,
            "faults_applied": res["faults"],
            "results": res["jobs"],
            "fidelity": sampled["fidelity"] if sampled else None,
            "stalled": sorted(res["errors"]),
        }
    out["summary"] = summary(sc, out)
    return out


def summary(sc: Scenario, out: dict) -> dict:
    """The scenario's headline figure per transport, and ethplus's ratio to each."""
    fig: dict[str, float | None] = {}
    for t, r in out["transports"].items():
        jobs = [j for j in r["jobs"].values() if j["status"] != "failed"]
        if len(jobs) != len(r["jobs"]):
            fig[t] = None
        elif sc.metric == "jct":
            fig[t] = max(j["jct_real_s"] for j in jobs)
        elif sc.metric == "busbw":
            fig[t] = min(j["busbw_GBps"] for j in jobs)
        elif sc.metric == "slowdown":
            fig[t] = (
                max((j["slowdown_vs_alone"] or 0.0) for j in jobs)
                if sc.alone
                else _fault_slowdown(jobs[0])
            )
        else:  # phases: the last phase's busbw against the first's
            ph = jobs[0]["phases"]
            fig[t] = (
                ph[-1]["busbw_GBps"] / ph[0]["busbw_GBps"]
                if len(ph) > 1 and ph[0]["busbw_GBps"]
                else None
            )
    lower_better = sc.metric in ("jct", "slowdown")
    ratios = {}
    e = fig.get("ethplus")
    for t, v in fig.items():
        if t != "ethplus" and e and v:
            ratios[t] = (v / e) if lower_better else (e / v)
    return {
        "metric": sc.metric,
        "lower_is_better": lower_better,
        "figures": fig,
        "ethplus_advantage": ratios,
    }


def _fault_slowdown(job: dict) -> float | None:
    """Busbw before the first fault over busbw while it lasted (its phase)."""
    ph = job["phases"]
    if len(ph) < 2 or not ph[1]["busbw_GBps"]:
        return None
    return ph[0]["busbw_GBps"] / ph[1]["busbw_GBps"]
