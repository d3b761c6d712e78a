#!/usr/bin/env python3
"""Many ranks on one machine: one process per rank against rank hosts, in
one run.

For each lab (default erack-8x4 and erack-64x8; upn-512 with --upn), runs
the all-reduce (or --collective; an all-to-all uneven) at each size with one
worker process per rank (where that still runs: per-rank), with the ranks
in rank hosts whose NIC engines share one thread per process (hosts), and in
rank hosts with an engine thread per rank (hosts-own); rank hosts:
--ranks-per-host, default the ranks over as many processes as CPUs.  One
after the other on the same lab, governed from its floor.  Prints per run:
real seconds, CPU-seconds (fabric and workers) per nominal GB moved (in all,
and past the worker processes' start-up, which each process pays once
whatever the job moves: the first ratio grows as a job moves less), the
workers' peak memory (each process's peak, summed), busbw against the ideal,
the k range and the fidelity verdict; then the CPU ratio of one-per-rank to
rank hosts.  The CPU per nominal GB is the job's processes' (the fabric's
and the workers' threads, from schedstat) and, beside it, the whole
machine's busy time over the job (idle-state residency: the job's
coordinator, the kernel's threads and softirqs that ran outside the job's
threads, the lab's idle cost over the job's real time, and anything else
the machine ran then); each lab first prints what it costs up and silent.

    sudo .venv/bin/python scripts/bench_scale.py [--labs erack-8x4,erack-64x8]
        [--sizes 1M,16M] [--iters 2] [--upn] [--modes per-rank,hosts,hosts-own] [--json FILE]
        [--collective all-reduce] [--algo auto] [--transport ethplus] [--time-scale K]
        [--repeat N]

The switches' threads forward the same frames whichever process a rank
runs in, so their CPU bounds what any grouping of ranks into processes can
save; each size's last line says by how much.  CPU per nominal GB moves
with k, and the governor may settle the modes at different ones:
--time-scale K pins both at one k.  Single runs of a mode on this shared
machine differ by 10% and more: --repeat N runs the modes N times in turn
and compares the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from dataplane.errors import EthplusError
from dataplane.lab import cpu, labs
from dataplane.model.catalog import bus_factor
from dataplane.run import bench, trials
from dataplane.run.job import JobError
from dataplane.units import size_text


def _moved_bytes(res: dict, spec: bench.Spec) -> float:
    """Nominal bytes the ranks moved in the whole job: every run of every
    size (the checked run, the warm-ups, the timed runs), busbw's bytes."""
    runs = 1 + max(0, spec.warmup - 1) + spec.iters
    f = bus_factor(spec.collective, res["world"])
    return sum(runs * r["size_bytes"] * f * res["world"] for r in res["rows"])


def _one(rec: dict, size: int, args, per_host: int | None, shared: bool) -> dict:
    spec = bench.Spec(
        collective=args.collective, transport=args.transport, sizes=[size], iters=args.iters,
        warmup=1, ranks_per_host=per_host, shared_engine=shared,
        algo=args.algo if args.collective == "all-reduce" else "ring",
        uneven=args.collective == "all-to-all",
    ).validate()  # fmt: skip
    t0, own0, machine0 = time.monotonic(), cpu.self_s(), cpu.machine_busy_s()
    res = trials.run(spec, rec)
    machine_s = cpu.machine_busy_s() - machine0
    real_s = time.monotonic() - t0
    coordinator_s = cpu.self_s() - own0  # this process: the job's launcher and sampler
    f = res["fidelity"]
    wall = res["wall_s"]
    cpu_s = (f["cpu"]["fabric_cores"] + f["cpu"]["workers_cores"]) * wall
    switches_s = f["cpu"]["fabric_frames_cores"] * wall
    engines_s = f["cpu"]["workers_frames_cores"] * wall
    startup_s = f["cpu"].get("workers_startup_cores", 0.0) * wall
    nominal_GB = _moved_bytes(res, spec) / 1e9
    row = res["rows"][-1]
    return {
        "size": size,
        "algo": row.get("algo", spec.algo),
        "processes": res["processes"],
        "real_s": real_s,
        "job_wall_s": wall,
        "cpu_s": cpu_s,
        "cpu_s_per_nominal_GB": cpu_s / nominal_GB,
        # the worker processes' start-up (Python, imports, the transports'
        # set-up: a cost per process, whatever the job moves), and the rest
        "startup_cpu_s": startup_s,
        "past_startup_cpu_s_per_nominal_GB": (cpu_s - startup_s) / nominal_GB,
        # not in cpu_s: the job's coordinator (this process), which starts the
        # ranks, serves their barriers and samples the fabric and every
        # worker process (so more of them costs it more), and a governed
        # run's trials
        "coordinator_cpu_s": coordinator_s,
        # the whole machine's busy time over the job (cpu.machine_s): every
        # process and kernel thread, the coordinator and softirqs run
        # outside the job's threads included, and whatever else ran beside
        # it (the lab's idle cost over the job's real time too); with
        # --time-scale the job alone, governed its trials as well
        "machine_cpu_s": machine_s,
        "machine_cpu_s_per_nominal_GB": machine_s / nominal_GB,
        # the threads that move frames: the switches' (the same work whatever
        # process a rank runs in) and the NIC engines' (one thread serving
        # many ranks' ports makes fewer passes for the same frames)
        "switches_cpu_s": switches_s,
        "engines_cpu_s": engines_s,
        "switches_cpu_s_per_nominal_GB": switches_s / nominal_GB,
        "frames_cpu_s_per_nominal_GB": (switches_s + engines_s) / nominal_GB,
        "fabric_cpu_s": f["cpu"]["fabric_cores"] * wall,
        "workers_cpu_s": f["cpu"]["workers_cores"] * wall,
        "peak_rss_bytes": res["workers_peak_rss_bytes"],
        "busbw_GBps": row["busbw_GBps"],
        "share_of_ideal": row["busbw_GBps"] / res["ideal_busbw_GBps"],
        "k_range": row.get("k_range"),
        "verdict": "behind" if row["fell_behind"] else "ok",
        "wrong": row["wrong"],
        "endpoints": row.get("endpoints"),
        "governor": res.get("governor"),  # its changes of k and why
    }


IDLE_WINDOW_S = 2.0


def _idle_cores() -> float:
    """The whole machine's busy cores over IDLE_WINDOW_S: with a lab up and
    no job, what every job's machine figure has beside it per real second."""
    b0, t0 = cpu.machine_busy_s(), time.monotonic()
    time.sleep(IDLE_WINDOW_S)
    return (cpu.machine_busy_s() - b0) / (time.monotonic() - t0)


def _print(lab: str, mode: str, r: dict) -> None:
    k = r["k_range"]
    k_text = f"k {k[0]:g}..{k[1]:g}" if k else "k ?"
    print(
        f"{lab:11s} {size_text(r['size']):>7s} {mode:8s} {r['processes']:3d} proc {r['algo']}"
        f"  real {r['real_s']:7.1f} s  CPU {r['cpu_s_per_nominal_GB']:8.2f} s/GB"
        f" (fabric {r['fabric_cpu_s']:.1f} s, workers {r['workers_cpu_s']:.1f} s;"
        f" of which switch threads {r['switches_cpu_s']:.1f} s,"
        f" NIC engines {r['engines_cpu_s']:.1f} s, start-up {r['startup_cpu_s']:.1f} s;"
        f" coordinator {r['coordinator_cpu_s']:.1f} s;"
        f" past start-up {r['past_startup_cpu_s_per_nominal_GB']:.2f} s/GB;"
        f" machine {r['machine_cpu_s_per_nominal_GB']:.2f} s/GB)"
        f"  peak {r['peak_rss_bytes'] / 2**30:5.2f} GiB"
        f"  busbw {r['busbw_GBps']:6.1f} GB/s = {r['share_of_ideal']:.3f} of ideal"
        f"  {k_text}  {r['verdict']}  #wrong {r['wrong']}",
        flush=True,
    )


def _per_GB(rounds: list[dict[str, dict]], key: str) -> dict[str, list[float]]:
    """Each mode's figure key, a value per round it ran in."""
    out: dict[str, list[float]] = {}
    for runs in rounds:
        for mode, r in runs.items():
            out.setdefault(mode, []).append(r[key])
    return out


def _print_ratios(lab: str, size: int, rounds: list[dict[str, dict]]) -> None:
    """One process per rank's CPU per nominal GB over each other mode's: of
    their medians, and with --repeat, each round's ratio beside it (the
    rounds where both ran); then the same past the worker processes'
    start-up, which a job pays once per process whatever it moves (so the
    first ratio grows as a job moves less)."""
    for key, what in (("cpu_s_per_nominal_GB", "CPU per nominal GB"),
                      ("past_startup_cpu_s_per_nominal_GB", "past start-up"),
                      ("machine_cpu_s_per_nominal_GB", "the whole machine's")):  # fmt: skip
        per_GB = _per_GB(rounds, key)
        base = per_GB.get("per-rank")
        for mode, vals in per_GB.items():
            if mode == "per-rank" or not base:
                continue
            ratio = statistics.median(base) / statistics.median(vals)
            text = (f"{lab:11s} {size_text(size):>7s} {what}, one process"
                    f" per rank / {mode}: {ratio:.2f}x")  # fmt: skip
            if len(rounds) > 1:
                each = [x["per-rank"][key] / x[mode][key]
                        for x in rounds if "per-rank" in x and mode in x]  # fmt: skip
                text += (f" (medians of {len(base)} and {len(vals)} runs;"
                         f" each round: {', '.join(f'{x:.2f}' for x in each)})")  # fmt: skip
            print(text, flush=True)


def _print_k_note(lab: str, size: int, rounds: list[dict[str, dict]]) -> None:
    """Say so when the governor settled the modes at different k: CPU per
    nominal GB moves with k, so their ratio is then not like for like."""
    spans = {}
    for mode, ranges in _per_GB(rounds, "k_range").items():
        ks = [k for r in ranges if r for k in r]
        if ks:
            spans[mode] = (min(ks), max(ks))
    base = spans.pop("per-rank", None)
    for mode, other in sorted(spans.items()):
        if base and other != base:
            span = ", ".join(
                f"{m} k {a:g}..{b:g}" for m, (a, b) in (("per-rank", base), (mode, other))
            )
            print(f"{lab:11s} {size_text(size):>7s} note: the modes ran at different k ({span});"
                  f" CPU per nominal GB moves with k: --time-scale K compares them at one",
                  flush=True)  # fmt: skip


def _print_ceiling(lab: str, size: int, rounds: list[dict[str, dict]]) -> None:
    """How far grouping ranks into processes can cut the CPU at all: the
    switches' threads forward the same frames whatever process a rank runs
    in, so no grouping spends less than they did (the least of any run's);
    nor, unless a grouping makes the NIC engines' frames cheaper still,
    less than the switches and the engines together did at best.  Against
    one process per rank's median."""
    every = [r for runs in rounds for r in runs.values()]
    switches = min((r["switches_cpu_s_per_nominal_GB"] for r in every), default=0.0)
    frames = min((r["frames_cpu_s_per_nominal_GB"] for r in every), default=0.0)
    base = _per_GB(rounds, "cpu_s_per_nominal_GB").get("per-rank")
    if not base or not switches:
        return
    per_rank = statistics.median(base)
    text = (f"{lab:11s} {size_text(size):>7s} the switches' threads alone: {switches:.2f} s/GB"
            f" whatever the grouping of ranks into processes: one process per rank / that"
            f" = at most {per_rank / switches:.2f}x")  # fmt: skip
    if frames > switches:
        text += (f"; with the NIC engines at their least ({frames:.2f} s/GB in all):"
                 f" at most {per_rank / frames:.2f}x")  # fmt: skip
    print(text, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labs", default="erack-8x4,erack-64x8")
    ap.add_argument("--upn", action="store_true", help="also upn-512 (1M and 4M)")
    ap.add_argument("--sizes", default="1M,16M")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--transport", default="ethplus")
    ap.add_argument("--collective", default="all-reduce")
    ap.add_argument("--algo", default="auto", help="all-reduce: its algorithm (default auto)")
    ap.add_argument("--modes", default="per-rank,hosts,hosts-own")
    ap.add_argument("--ranks-per-host", type=int, help="for the hosts mode (default: see above)")
    ap.add_argument(
        "--time-scale", type=float,
        help="pin every lab at this k (no governor): the modes' CPU compared at one k",
    )  # fmt: skip
    ap.add_argument(
        "--repeat", type=int, default=1,
        help="run each mode this many times (interleaved) and compare medians",
    )  # fmt: skip
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat: expected a count of runs of at least 1, got {args.repeat}")
    plan = [(lab, args.sizes) for lab in args.labs.split(",") if lab]
    if args.upn:
        plan.append(("upn-512", "1M,4M"))
    out: list[dict] = []
    for lab, sizes in plan:
        with labs.session(lab, time_scale=args.time_scale) as rec:
            world = sum(1 for n in rec["topology"]["nodes"] if n["role"] == "host")
            hosts = args.ranks_per_host or -(-world // (os.cpu_count() or 1))
            print(f"{lab:11s} up and silent: the machine {_idle_cores():.3f} cores busy"
                  f" (over {IDLE_WINDOW_S:g} s, before the runs)", flush=True)  # fmt: skip
            for size in bench.parse_sizes(sizes):
                rounds: list[dict[str, dict]] = []  # each round: mode -> its run
                for round_ in range(args.repeat):
                    rounds.append({})  # the modes interleaved: drift hits all alike
                    for mode in args.modes.split(","):
                        per_host = 1 if mode == "per-rank" else hosts
                        shared = mode != "hosts-own"
                        try:
                            r = _one(rec, size, args, per_host, shared)
                        except JobError as e:
                            print(f"{lab:11s} {size_text(size):>7s} {mode:8s} failed: {e}",
                                  flush=True)  # fmt: skip
                            continue
                        _print(lab, mode, r)
                        rounds[-1][mode] = r
                        out.append({"lab": lab, "mode": mode, "round": round_, **r})
                _print_ratios(lab, size, rounds)
                _print_k_note(lab, size, rounds)
                _print_ceiling(lab, size, rounds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EthplusError as e:  # a lab that would not come up, an interrupted run
        print(f"bench_scale: error: {e}", file=sys.stderr)
        sys.exit(1)
