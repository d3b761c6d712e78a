"""`ethplus bench`: one collective over one transport at a range of sizes,
reported as nccl-tests reports it.

Columns (PROTOCOLS.md): size (B), count (elements), type, redop, time (us),
algbw (GB/s), busbw (GB/s), #wrong, and one more, pacing: ``ok``, or
``behind`` when some part of the emulation (a switch's pacer, a NIC engine,
a rank's CPU) fell behind during that size; the JSON's ``behind_why`` says
which (see dataplane/report/fidelity.py).  Times and bandwidths are nominal: real time / k and
real bandwidth x k, k being the lab's time scale.  algbw = size / time,
busbw = algbw x the collective's factor; GB = 1e9 bytes.  The time of a size
is the slowest rank's, averaged over the timed iterations.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dataplane.errors import UsageError
from dataplane.model import catalog
from dataplane.model.catalog import (
    ALGORITHMS,
    bus_factor,
    canonical,
    pick_all_reduce,
    pick_broadcast,
)
from dataplane.report import fidelity
from dataplane.run import inc, reference
from dataplane.run.job import Job, Plan, Workload, iteration_times_s, ranks_per_host
from dataplane.scale import Scale
from dataplane.units import parse_size

SCHEMA = "ethplus-bench/1"
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "bench.schema.json"
COLUMNS = ("size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "pacing")
UNITS = ("(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "", "")
_WIDTHS = (12, 12, 9, 6, 12, 9, 9, 7, 7)


class BenchError(UsageError):
    """A bad argument: one line naming it and what was expected."""


def parse_sizes(spec: str, factor: float = 2.0) -> list[int]:
    """'8K:256M' (with a growth factor), '64M', or '1K,4K,1M'."""
    if factor <= 1:
        raise BenchError(f"--factor: expected a number > 1, got {factor:g}")
    if "," in spec:
        sizes = [parse_size(x) for x in spec.split(",")]
        if sizes != sorted(sizes):
            raise BenchError(f"--sizes: {spec!r} is out of order (expected increasing sizes)")
        return sizes
    lo_hi = spec.split(":")
    if len(lo_hi) == 1:
        return [parse_size(spec)]
    if len(lo_hi) != 2:
        raise BenchError(f"--sizes: {spec!r} is not MIN:MAX, a size, or a comma list")
    lo, hi = (parse_size(x) for x in lo_hi)
    if lo > hi or lo == 0:
        raise BenchError(f"--sizes: {spec!r} is out of order (expected 0 < MIN <= MAX)")
    out, s = [], float(lo)
    while s <= hi:
        if not out or int(s) > out[-1]:
            out.append(int(s))
        s *= factor
    return out


@dataclass
class Spec(Workload):
    """Everything a bench run needs besides the lab, checked."""

    def validate(self) -> Spec:
        """Canonical names, or BenchError naming the argument."""
        try:
            self.collective = canonical(self.collective)
            self.dtype = reference.dtype_name(self.dtype)
        except ValueError as e:
            raise BenchError(str(e)) from None
        if self.transport not in catalog.available():
            known = ", ".join(catalog.available())
            raise BenchError(
                f"--transport: unknown transport {self.transport!r} (expected one of {known})"
            )
        if self.op not in reference.OPS:
            raise BenchError(
                f"--op: unknown operator {self.op!r} (expected one of {', '.join(reference.OPS)})"
            )
        if self.ranks_per_host is not None and self.ranks_per_host < 1:
            raise BenchError(f"--ranks-per-host: expected 1 or more, not {self.ranks_per_host}")
        algos = ALGORITHMS.get(self.collective, ("ring",))
        if self.algo not in algos:
            raise BenchError(
                f"--algo: {self.collective} has no algorithm {self.algo!r}"
                f" (expected one of {', '.join(algos)})"
            )
        if self.algo == "in-network" and self.transport != "ethplus":
            raise BenchError(
                f"--algo in-network: the switches aggregate for the ethplus transport only,"
                f" not {self.transport}"
            )
        item = reference.itemsize(self.dtype)
        if self.sizes[0] < item:
            raise BenchError(
                f"--sizes: {self.sizes[0]} B is smaller than one {self.dtype} element ({item} B)"
            )
        if self.iters < 1 or self.warmup < 0:
            raise BenchError("--iters must be at least 1 and --warmup at least 0")
        if self.cc is not None:
            from dataplane.lab.nic import CC_ALGOS

            if self.cc not in CC_ALGOS:
                raise BenchError(
                    f"--cc: unknown congestion control {self.cc!r}"
                    f" (expected one of {', '.join(CC_ALGOS)})"
                )
            if self.transport != "ethplus":
                raise BenchError(
                    f"--cc: chooses the congestion control of ethplus, not of {self.transport}"
                )
        if self.qps is not None and not 1 <= self.qps <= 16:
            raise BenchError(f"--qps: expected 1 to 16 queue pairs, got {self.qps}")
        if self.tcp_streams is not None and self.tcp_streams < 1:
            raise BenchError(f"--tcp-streams: expected at least 1, got {self.tcp_streams}")
        return self


def ideal_busbw_Bps(rec: dict, algo: str = "ring", world: int = 0) -> float:
    """Per-rank nominal capacity over all its planes (bytes/s): what busbw
    would be on a perfect fabric with a perfect transport.  An in-network
    all-reduce sends each byte out once and gets each result byte once, so
    its algbw can reach the capacity, and its busbw that times 2(n-1)/n."""
    links = {lk["name"]: lk for lk in rec["topology"]["links"]}
    host = next(n for n in rec["topology"]["nodes"] if n["role"] == "host")
    cap = sum(links[p["link"]]["params"]["rate_bps"] for p in host["ports"]) / 8
    return cap * bus_factor("all-reduce", world) if algo == "in-network" else cap


# a job row's real times, and the fabric clock's, per size (what a report
# needs to place each timed iteration)
REAL_ROW_KEYS = ("size", "t0", "t1", "ends", "n0", "n1", "nends", "nruns")


def range_text(r: list[float] | None) -> str:
    """' (iterations LO-HI)' for a figure's iterations' range, '' without one."""
    return f" (iterations {r[0]:.4g}-{r[1]:.4g})" if r else ""


def overlap_text(a: list[float] | None, b: list[float] | None) -> str:
    """Whether two runs' iterations' ranges overlap: if they do, the ratio of
    their figures says as much of the runs' own spread as of what differed."""
    if not a or not b:
        return ""
    if a[0] <= b[1] and b[0] <= a[1]:
        return " (the runs' iterations overlap: within their own spread)"
    return " (the runs' iterations do not overlap)"


def nominal_row(row: dict, spec: Spec, world: int, k: float, in_network: bool = False) -> dict:
    """A job's row in nominal units (from the fabric clock: time_nominal_s;
    real seconds / k for a row without it), with the bandwidths; an
    all-reduce's or a broadcast's row names its algorithm (--algo auto: the
    one chosen for its size, and why; in_network: whether auto may hand an
    all-reduce to the switches)."""
    t_s = row.get("time_nominal_s")
    t_s = Scale(k).nominal_s(row["time_real_s"]) if t_s is None else t_s
    alg = row["size"] / t_s / 1e9 if t_s > 0 else 0.0
    bus = bus_factor(spec.collective, world)
    # the row's time is the slowest rank's own: its range is each rank's own
    # iterations' (a row from before rank_iters_range_s: the job's)
    its = row.get("rank_iters_range_s") or [x for x in iteration_times_s(row) or [] if x > 0]
    chosen = {}
    if spec.collective in ("all-reduce", "broadcast"):
        algo, why = spec.algo, ""
        if algo == "auto" and spec.collective == "broadcast":
            algo, why = pick_broadcast(world)
        elif algo == "auto":
            algo, why = pick_all_reduce(world, row["size"], in_network)
        chosen = {"algo": algo, "algo_why": why}
    return {
        **chosen,
        "size_bytes": row["size"],
        "count": row["count"],
        "type": spec.dtype,
        "redop": spec.op if spec.collective in ("all-reduce", "reduce-scatter") else "none",
        "time_us": t_s * 1e6,
        "algbw_GBps": alg,
        "busbw_GBps": alg * bus,
        # the slowest and the fastest timed iteration's busbw (on any rank)
        "busbw_range_GBps": [row["size"] / max(its) / 1e9 * bus, row["size"] / min(its) / 1e9 * bus]
        if its
        else None,
        "wrong": row["wrong"],
        "time_real_us": row["time_real_s"] * 1e6,
        "pacing": row.get("pacing"),
        "endpoints": row.get("endpoints"),
        "fell_behind": bool(row.get("fell_behind")),
        "behind_why": row.get("behind_why", []),
        "k_range": row.get("k_range"),
    }


def _cells(r: dict) -> list[str]:
    return [
        str(r["size_bytes"]),
        str(r["count"]),
        r["type"],
        r["redop"],
        f"{r['time_us']:.2f}",
        f"{r['algbw_GBps']:.2f}",
        f"{r['busbw_GBps']:.2f}",
        str(r["wrong"]),
        "behind" if r["fell_behind"] else "ok",
    ]


def _line(cells) -> str:
    return " ".join(str(c).rjust(w) for c, w in zip(cells, _WIDTHS, strict=True))


def header(meta: dict, governed: bool = False) -> str:
    return "\n".join(
        [
            f"# ethplus bench {meta['collective']} over {meta['transport']}"
            f" ({meta['transport_label']}) on lab {meta['lab']['name']}: {meta['world']} ranks"
            + (
                f" in {meta['processes']} processes,"
                if meta.get("processes", meta["world"]) != meta["world"]
                else ","
            )
            + f" time scale {meta['lab']['time_scale']:g}"
            + (
                " (governed: from this k up; the k used follows the rows)"
                if meta["lab"].get("governed")
                else ""
            ),  # fmt: skip
            f"# dtype {meta['dtype']}  op {meta['op']}  algo {meta['algo']}  iters {meta['iters']}"
            f"  warmup {meta['warmup']}  (times and bandwidths nominal; GB = 1e9 B)",
            "#",
            "#" + _line(COLUMNS)[1:],
            "#" + _line(UNITS)[1:],
        ]
    )


def format_row(r: dict) -> str:
    """A row of the table; under --algo auto, after a comment line saying
    what auto chose for its size and why."""
    if r.get("algo_why"):
        return f"# {r['size_bytes']} B: auto chose {r['algo']} ({r['algo_why']})\n" + _line(
            _cells(r)
        )
    return _line(_cells(r))


def footer(result: dict) -> str:
    lines = [
        f"# Out of bounds values : {sum(r['wrong'] for r in result['rows'])} "
        + ("OK" if not any(r["wrong"] for r in result["rows"]) else "FAILED"),
        f"# Avg bus bandwidth    : {result['avg_busbw_GBps']:.3f} GB/s"
        f"  ({result['avg_busbw_GBps'] / result['ideal_busbw_GBps']:.1%} of the ideal"
        f" {result['ideal_busbw_GBps']:.1f} GB/s per rank)",
    ]
    return "\n".join(lines)


def run_name(spec: Workload) -> str:
    """How reports name a run: its transport, its congestion control when
    chosen, and its algorithm unless the ring."""
    name = spec.transport if spec.cc is None else f"{spec.transport}/{spec.cc}"
    return name if spec.algo == "ring" else f"{name}/{spec.algo}"


def transport_label(transport_name: str, cc: str | None = None) -> str:
    """A transport as reports name it, with its congestion control if chosen."""
    label = catalog.TRANSPORT_LABELS[transport_name]
    return label if cc is None else f"{label}, {cc.upper()}-like congestion control"


def run_label(spec: Workload) -> str:
    label = transport_label(spec.transport, spec.cc)
    if spec.algo == "in-network":
        return f"{label}, in-network all-reduce (the switches reduce)"
    return label if spec.algo == "ring" else f"{label}, {spec.algo}"


def meta(spec: Spec, rec: dict, nodes: list[str] | None = None) -> dict:
    world = len(nodes) if nodes else sum(1 for n in rec["topology"]["nodes"] if n["role"] == "host")
    return {
        "schema": SCHEMA,
        "collective": spec.collective,
        "transport": spec.transport,
        "transport_label": run_label(spec),
        "name": run_name(spec),
        "lab": {
            "name": rec["name"],
            "family": rec["family"],
            "file": rec["file"],
            "time_scale": float(rec["time_scale"]),
            "fabric_lossless": bool(rec["switch"].get("lossless")),
        },
        "world": world,
        "dtype": spec.dtype,
        "op": spec.op,
        "algo": spec.algo,
        "iters": spec.iters,
        "warmup": spec.warmup,
        "root": spec.root,
        "uneven": spec.uneven,
        "tcp_streams": spec.tcp_streams,
        "qps": spec.qps,
        "nodes": nodes,
        # the ranks' worker processes (rank hosts: job.ranks_per_host)
        "processes": -(-world // ranks_per_host(world, spec.ranks_per_host)),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


class Run:
    """One bench run: a Job on a running lab (on some of its accelerators if
    nodes is given), its rows in nominal units as they complete, its result."""

    def __init__(self, spec: Spec, rec: dict, nodes: list[str] | None = None, on_row=None,
                 on_progress=None, sample: bool = True):  # fmt: skip
        self.spec, self.rec, self.on_row = spec, rec, on_row
        self.meta = meta(spec, rec, nodes)
        plan = Plan(lab=rec["name"], nodes=nodes, sample=sample, **dataclasses.asdict(spec))
        self.job = Job(plan, rec, on_result=self._row_done, on_progress=on_progress)

    def _nominal(self, row: dict) -> dict:
        return nominal_row(
            row,
            self.spec,
            self.meta["world"],
            self.meta["lab"]["time_scale"],
            inc.auto_in_network(self.rec, self.spec.transport),
        )

    def _row_done(self, row: dict) -> None:
        fidelity.mark_row(row, self.job.samples, self.rec)
        if self.on_row:
            self.on_row(self._nominal(row))

    def execute(self) -> dict:
        """Run it (raises JobError); returns the result (what --json writes)."""
        res = self.job.run()
        for row in res["rows"]:  # again, now that samples after each row exist
            fidelity.mark_row(row, res["samples"], self.rec)
        rows = [self._nominal(r) for r in res["rows"]]
        return {
            **self.meta,
            "rows": rows,
            "avg_busbw_GBps": sum(r["busbw_GBps"] for r in rows) / len(rows) if rows else 0.0,
            "ideal_busbw_GBps": ideal_busbw_Bps(self.rec, self.job.plan.algo, self.meta["world"])
            / 1e9,
            "fidelity": fidelity.report(res, self.rec),
            "transport_config": res["ranks"][0].get("transport", {}) if res["ranks"] else {},
            "nic_counters": _sum_counters(res["ranks"]),
            "hosts": res["hosts"],
            "workers_peak_rss_bytes": int(fidelity.per_process(res["ranks"], "peak_rss_bytes")),
            "wall_s": res["wall_s"],
            "series": series(res, self.rec),
            "real_rows": [{k: r[k] for k in REAL_ROW_KEYS if k in r} for r in res["rows"]],
        }


def run(spec: Spec, rec: dict, on_row=None, on_progress=None, nodes=None) -> dict:
    """Run the bench on every accelerator of a running lab (or on nodes)."""
    return Run(spec, rec, nodes=nodes, on_row=on_row, on_progress=on_progress).execute()


def check_nodes(text: str | None, rec: dict) -> list[str] | None:
    """--nodes h0,h3,...: the job's accelerators, in rank order (None: all)."""
    if text is None:
        return None
    nodes = [x.strip() for x in text.split(",") if x.strip()]
    hosts = [n["name"] for n in rec["topology"]["nodes"] if n["role"] == "host"]
    bad = [x for x in nodes if x not in hosts]
    if bad or len(set(nodes)) != len(nodes) or len(nodes) < 2:
        raise BenchError(
            f"--nodes: expected two or more distinct accelerators of lab {rec['name']}"
            f" ({hosts[0]}..{hosts[-1]}), got {text!r}"
        )
    return nodes


def _sum_counters(ranks: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in ranks:
        for key, v in r.get("counters", {}).items():
            if key.endswith("_max"):  # the most any rank saw
                out[key] = max(out.get(key, 0), v)
            elif not key.endswith(("_ns", "cwnd_bytes", "credit_bytes", "rx_senders")):
                out[key] = out.get(key, 0) + v
    return out


def series(res: dict, rec: dict) -> dict:
    """Time series for the plots: per-plane utilisation of the switches'
    egress links and the deepest queue per switch, against time in seconds
    since the first sample (real)."""
    samples = res["samples"]
    if len(samples) < 2:
        return {"t_s": [], "plane_util": {}, "queue_bytes": {}, "windows": []}
    plane_of = {n["name"]: n.get("plane") for n in rec["topology"]["nodes"]}
    links = {lk["name"]: lk for lk in rec["topology"]["links"]}
    k = float(rec["time_scale"])
    cap: dict[str, float] = {}
    port_group: dict[str, str] = {}
    for n in rec["topology"]["nodes"]:
        if n["role"] != "switch":
            continue
        group = f"plane {plane_of[n['name']]}" if plane_of[n["name"]] is not None else n["name"]
        for p in n["ports"]:
            key = f"{n['name']}:{p['peer']}"
            port_group[key] = group
            real_bps = Scale(k).real_bps(links[p["link"]]["params"]["rate_bps"])
            cap[group] = cap.get(group, 0.0) + real_bps
    t0 = samples[0]["t"]
    out = {
        "t_s": [],
        "plane_util": {g: [] for g in cap},
        "queue_bytes": {},
        # The timed part of each size, on the same time axis.
        "windows": [[r["size"], r["t0"] - t0, r["t1"] - t0] for r in res["rows"]],
    }
    for a, b in zip(samples, samples[1:], strict=False):
        dt = b["t"] - a["t"]
        out["t_s"].append(b["t"] - t0)
        used = dict.fromkeys(cap, 0.0)
        deepest: dict[str, int] = {}
        for port, v in b["ports"].items():
            g = port_group.get(port)
            if g is None or port not in a["ports"]:
                continue
            used[g] += (v[0] - a["ports"][port][0]) * 8 / dt
            sw = port.split(":")[0]
            deepest[sw] = max(deepest.get(sw, 0), v[1])
        for g in cap:
            out["plane_util"][g].append(used[g] / cap[g] if cap[g] else 0.0)
        for sw, q in deepest.items():
            out["queue_bytes"].setdefault(sw, []).append(q)
    return out


def _jsonable(o: object) -> object:
    if isinstance(o, Mapping):  # a sample's packed ports (fidelity.PortRows)
        return dict(o)
    raise TypeError(f"{type(o).__name__} is not JSON")


def write_json(result: dict, path: str) -> None:
    Path(path).write_text(json.dumps(result, indent=1, default=_jsonable) + "\n")


def write_csv(result: dict, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["collective", "transport", *COLUMNS, "busbw_share_of_ideal"])
        for r in result["rows"]:
            share = (
                r["busbw_GBps"] / result["ideal_busbw_GBps"] if result["ideal_busbw_GBps"] else 0
            )
            w.writerow([result["collective"], result["transport"], *_cells(r), f"{share:.4f}"])
