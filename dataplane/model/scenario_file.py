"""Scenario files: their keys, one-line errors, and the Scenario they
describe (jobs, a fault schedule, the headline metric).  Reading one needs
no lab, no root and no compiled C; running one is scenario.py's."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from dataplane.errors import UsageError
from dataplane.model import catalog, changes, library
from dataplane.model import labfile as lf
from dataplane.model.catalog import ALGORITHMS, COLLECTIVES, canonical
from dataplane.model.labfile import CC_NAMES, LabFileError, resolve_path
from dataplane.units import parse_size

METRICS = ("jct", "slowdown", "busbw", "phases")
METRIC_UNITS = {
    "jct": "job completion time, nominal us (lower is better)",
    "slowdown": "slowdown (lower is better)",
    "busbw": "busbw, GB/s nominal (higher is better)",
    "phases": "busbw in the last phase / in the first",
}


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
    at_us: float  # nominal microseconds after the jobs' timed phase starts
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
    cc: str | None
    alone: bool
    metric: str
    jobs: list[JobSpec]
    faults: list[Fault]
    short: bool = False

    def set_iters(self, iters: int) -> None:
        """Every job runs iters timed iterations (more narrow a noisy
        transport's figure: each iteration's busbw is reported)."""
        for j in self.jobs:
            j.iters = iters


def split_run(name: str) -> tuple[str, str | None]:
    """A scenario's run name: a transport, or ethplus/CC with the congestion
    control its NIC runs ("ethplus/hpcc"); gives (transport, cc or None)."""
    base, _, cc = name.partition("/")
    return base, cc or None


def valid_run_name(name) -> bool:
    if not isinstance(name, str):
        return False
    base, cc = split_run(name)
    return base in catalog.available() and (
        cc is None or (base == "ethplus" and cc in CC_NAMES and name.count("/") == 1)
    )


def run_names() -> str:
    """The run names a scenario may list, for error messages."""
    ccs = ", ".join(f"ethplus/{c}" for c in CC_NAMES)
    return f"{', '.join(catalog.available())} (or a congestion control of ethplus: {ccs})"


def _err(path: str, key: str, expected: str, value=None) -> LabFileError:
    return LabFileError(path, key, expected, value)


def resolve(name_or_path: str) -> Path:
    return resolve_path(name_or_path, "scenario file")


def _is_collective(v) -> bool:
    try:
        canonical(v)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


SIZES = lf.Field(
    'a list of sizes such as ["1M", "64M"]', lambda v: isinstance(v, list) and len(v) > 0
)
SHORT_FIELDS = {
    "sizes": SIZES,
    "iters": lf.pos_int(),
    "warmup": lf.nonneg_int(),
    "time_scale": lf.pos_num(1.0, "fault times (at_us) are multiplied by this"),
}
JOB_FIELDS = {
    "name": lf.text(),
    "collective": lf.Field(
        "one of " + ", ".join(COLLECTIVES),
        lambda v: isinstance(v, str) and _is_collective(v),
        lf.REQUIRED,
    ),
    "nodes": lf.text_list(2, "accelerator names"),
    "sizes": SIZES,
    "iters": lf.pos_int(5),
    "warmup": lf.nonneg_int(1),
    "algo": lf.text("ring"),
    "dtype": lf.text("float32"),
    "op": lf.text("sum"),
    "root": lf.nonneg_int(0),
    "uneven": lf.boolean(False),
}
FAULT_SET = changes.CHANGES
FAULT_FIELDS = {
    "at_us": lf.nonneg_num(
        lf.REQUIRED, "microseconds of nominal time after the jobs' timed phase starts"
    ),
    "link": lf.text(),
    "node": lf.text(),
    "set": lf.Field(FAULT_SET, lambda v: isinstance(v, str), lf.REQUIRED),
    "jitter_us": lf.nonneg_num(0.0, "a seeded offset in [0, jitter_us) nominal us"),
}
# Faults were once planned in real seconds (at_s), which met each transport
# at another point of its job, and moved with k: such a file is refused,
# saying how to convert.
REAL_TIME_KEYS = {"at_s": "at_us", "jitter_s": "jitter_us"}


def _scenario_fields() -> dict[str, lf.Field]:
    return {
        "description": lf.text(""),
        "explain": lf.text(""),
        "lab": lf.Field(
            "a lab file or netns-labs/ name", lambda v: isinstance(v, str), lf.REQUIRED
        ),
        "seed": lf.nonneg_int(1),
        "transports": lf.Field(
            f"a list of transports from {run_names()}",
            lambda v: isinstance(v, list) and v and all(map(valid_run_name, v)),
            catalog.available(),
        ),
        "adaptive": lf.boolean(False),
        "cc": lf.one_of(tuple(CC_NAMES)),
        "alone": lf.boolean(False),
        "metric": lf.one_of(METRICS, "jct"),
    }


def load(name_or_path: str, short: bool = False) -> Scenario:
    """Read and check a scenario file; LabFileError (one line) if it is wrong."""
    p = resolve(name_or_path)
    path = str(p)
    data = lf.read_toml(p)
    for key in data:
        if key not in ("scenario", "job", "fault", "short"):
            raise _err(path, key, "one of the sections [scenario], [[job]], [[fault]], [short]")
    if "scenario" not in data:
        raise _err(path, "scenario", "a [scenario] table")
    sc = lf.read_table(path, data["scenario"], "scenario", _scenario_fields())
    sh = lf.read_table(path, data.get("short", {}), "short", SHORT_FIELDS)
    overrides = {k: v for k, v in sh.items() if k != "time_scale" and v is not None}
    jobs_raw = data.get("job")
    if not isinstance(jobs_raw, list) or not jobs_raw:
        raise _err(path, "job", "one or more [[job]] tables")
    jobs = [_job(path, i, j, overrides if short else {}) for i, j in enumerate(jobs_raw)]
    seen: dict[str, str] = {}
    for j in jobs:
        for n in j.nodes or ["*"]:
            if n in seen or (n == "*" and seen) or "*" in seen:
                raise _err(path, f"job.{j.name}.nodes", "accelerators no other job uses", j.nodes)
            seen[n] = j.name
    if len({j.name for j in jobs}) != len(jobs):
        raise _err(path, "job.name", "a different name for every job")
    scale = sh["time_scale"] if short else 1.0
    rng = random.Random(sc["seed"])
    faults_raw = data.get("fault", [])
    if not isinstance(faults_raw, list):
        raise _err(path, "fault", "[[fault]] tables")
    fl = [_fault(path, i, f, scale, rng) for i, f in enumerate(faults_raw)]
    inc = [j.name for j in jobs if j.algo == "in-network"]
    if inc and any(split_run(t)[0] != "ethplus" for t in sc["transports"]):
        raise _err(path, "scenario.transports", f'ethplus only (job {inc[0]} is in-network)',
                   sc["transports"])  # fmt: skip
    return Scenario(
        name=p.stem,
        path=path,
        description=sc["description"],
        explain=sc["explain"],
        lab=sc["lab"],
        seed=sc["seed"],
        transports=sc["transports"],
        adaptive=sc["adaptive"],
        cc=sc["cc"],
        alone=sc["alone"],
        metric=sc["metric"],
        jobs=jobs,
        faults=sorted(fl, key=lambda f: f.at_us),
        short=short,
    )


def _job(path: str, i: int, j, overrides: dict) -> JobSpec:
    if not isinstance(j, dict):
        raise _err(path, f"job[{i}]", "a table", j)
    name = j.get("name", f"job{i}")
    if not isinstance(name, str):
        raise _err(path, f"job[{i}].name", JOB_FIELDS["name"].expected, name)
    where = f"job.{name}"
    v = lf.read_table(path, j, where, JOB_FIELDS) | overrides
    if v["sizes"] is None:
        raise _err(path, f"{where}.sizes", SIZES.expected)
    try:
        sizes = [parse_size(str(x), f"{where}.sizes") for x in v["sizes"]]
    except UsageError as exc:
        raise LabFileError(
            path, f"{where}.sizes", "sizes such as 8K, 64M", detail=str(exc)
        ) from None
    collective = canonical(v["collective"])
    algos = ALGORITHMS.get(collective, ("ring",))
    if v["algo"] not in algos:
        raise _err(path, f"{where}.algo", f"one of {', '.join(algos)} for {collective}", v["algo"])
    return JobSpec(
        name=name,
        collective=collective,
        nodes=v["nodes"],
        sizes=sizes,
        iters=v["iters"],
        warmup=v["warmup"],
        algo=v["algo"],
        dtype=v["dtype"],
        op=v["op"],
        root=v["root"],
        uneven=v["uneven"],
    )


def _fault(path: str, i: int, f, scale: float, rng: random.Random) -> Fault:
    where = f"fault[{i}]"
    for old, new in REAL_TIME_KEYS.items():
        if isinstance(f, dict) and old in f:
            raise LabFileError(
                path, f"{where}.{old}",
                f"{new}: faults are planned in nominal time now, in microseconds after the"
                f" timed phase starts ({old} was real seconds: at time scale k, {old} = S is"
                f" {new} = S * 1e6 / k; at k 19200, {old} = 3 is {new} = 156)",
                f[old],
            )  # fmt: skip
    v = lf.read_table(path, f, where, FAULT_FIELDS)
    if (v["link"] is None) == (v["node"] is None):
        raise _err(path, where, 'exactly one of link = "..." or node = "..."')
    target = "link" if v["link"] is not None else "node"
    words = v["set"]
    change: dict = {}
    if target == "link":
        try:
            change = changes.link_change(words.split())
        except ValueError as exc:
            raise LabFileError(path, f"{where}.set", FAULT_SET, detail=str(exc)) from None
    elif words not in ("up", "down"):
        raise _err(path, f"{where}.set", "up or down (a switch)", words)
    return Fault(
        at_us=(v["at_us"] + rng.random() * v["jitter_us"]) * scale,
        target=target,
        name=v[target],
        words=words.split(),
        change=change,
    )


def listing() -> list[Scenario]:
    """Every scenario in the library (library.py), by name."""
    return [load(str(p)) for p in library.files("scenario file").values()]
