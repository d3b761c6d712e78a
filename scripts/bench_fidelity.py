#!/usr/bin/env python3
"""Do nominal results depend on the machine?  The governor against a pinned
time scale, in one run.

On erack-8x4 (time scale auto: governed), for each transport and workload
(all-reduce; all-to-all with MoE-like uneven sizes) at --size: busbw
governed, against busbw pinned at 4x the highest k the governor used in
the timed runs (a k at which the machine is surely not the bottleneck),
and (--hog) governed while a busy loop holds one of the two cores for the
whole run.  Kernel TCP is pinned at most at 0.9 of the k where the
kernel's 120 s RTO cap would cut the lab's minimum RTO (120,000 for 1 ms):
past it a timeout costs less nominal time, not the governed run's TCP.
Prints each ratio (target: 0.93-1.07 for ethplus and roce, 0.90-1.10 for
tcp), the range of k the governor used, each figure's
iterations' range (their slowest and fastest busbw) and whether the
governed and the pinned run's overlap, and the real seconds each run took.
Each transport starts governed from the lab's floor.  With --repeat N each
configuration runs N times and its figure is the median run's, printed
with every run's: an all-to-all's figure moves run to run at one pinned k
(RoCE's 42-55 GB/s; kernel TCP's 30-83 without ECN, 75-78 with it), and a
ratio of two single runs says no more than that spread.

    sudo .venv/bin/python scripts/bench_fidelity.py [--lab erack-8x4] [--size 16M[,1M]]
        [--iters 3] [--transports ethplus,roce,tcp] [--collectives all-reduce,all-to-all]
        [--repeat N] [--hog] [--no-pinned] [--json FILE] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from dataplane.lab import kernel, labs
from dataplane.run import bench, trials
from dataplane.run.job import JobError
from dataplane.units import size_text

WORKLOADS = (("all-reduce", False), ("all-to-all", True))


def _hog() -> None:
    # forked inside the lab's session: its handlers (SIGTERM raises, to clean
    # up the lab) are not the hog's, which just ends
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.sched_setaffinity(0, {1})
    while True:
        pass


def _verdict(behind: bool) -> str:
    return "behind" if behind else "ok"


def _from_floor(rec: dict, floor: float) -> None:
    """k back at the floor, governed from there (as a freshly brought-up lab)."""
    labs.rescale(rec, floor)
    labs.control(rec["name"], {"op": "scale", "k": "auto"})


def _k(res: dict) -> str:
    g = res["governor"]
    return f"{g['k']:g}" if g["k"] == g["k_max"] else f"{g['k']:g}-{g['k_max']:g}"


def _one(spec: bench.Spec, rec: dict, govern: bool) -> tuple[dict, float]:
    t0 = time.monotonic()
    # (the governor alone: no check at a larger k, which would replace its rows)
    res = trials.run(spec, rec, k_check=False) if govern else bench.run(spec, rec)
    return res, time.monotonic() - t0


def _figure(runs: list[tuple[dict, float]]) -> dict:
    """A configuration's runs as one figure: the median run's busbw (the
    mean over its timed iterations), every run's, the iterations' range over
    all of them, whether any fell behind, the k range and the real seconds."""
    rows = [res["rows"][0] for res, _ in runs]
    figures = sorted(r["busbw_GBps"] for r in rows)
    ranges = [r["busbw_range_GBps"] for r in rows if r.get("busbw_range_GBps")]
    return {
        "busbw": statistics.median(figures),
        "runs": [r["busbw_GBps"] for r in rows],
        "range": [min(x[0] for x in ranges), max(x[1] for x in ranges)] if ranges else None,
        "behind": any(r["fell_behind"] for r in rows),
        "k": ", ".join(_k(res) if "governor" in res else f"{res['lab']['time_scale']:g}"
                       for res, _ in runs),
        "real_s": sum(s for _, s in runs),
    }  # fmt: skip


def _text(f: dict) -> str:
    runs = "" if len(f["runs"]) < 2 else " runs " + "/".join(f"{x:.1f}" for x in f["runs"]) + ","
    return (
        f"k={f['k']} {f['busbw']:7.1f} GB/s{runs}{bench.range_text(f['range'])}"
        f" {_verdict(f['behind'])} ({f['real_s']:5.1f} s real)"
    )


def _spread(f: dict) -> str:
    """The runs' own spread at one configuration (max/min of their figures)."""
    return "" if len(f["runs"]) < 2 else f", runs spread {max(f['runs']) / min(f['runs']):.2f}x"


def _pinned_k(spec, rec: dict, k_governed: float) -> tuple[float, str]:
    """The k a pinned run uses, 4x the governor's highest, and why not ('' if
    it is): kernel TCP's stays under the k where the kernel's 120 s cap
    would cut the lab's minimum RTO (there a timeout, or a lone tail's probe,
    costs less nominal time: not the same TCP as the governed run's)."""
    k = 4 * k_governed
    note = kernel.tcp_rto_capped_note(rec, k) if spec.transport == "tcp" else ""
    if not note:
        return k, ""
    k_cap = 0.9 * kernel.tcp_rto_min_k_cap(kernel.tcp_settings(rec)[0])
    if k_cap <= k_governed:  # governed past it already: no k is the same TCP
        return k, f"4x (caution: {note})"
    return k_cap, f"{k_cap / k_governed:.2f}x (not 4x, k={k:g}: {note})"


def _compare(spec, rec: dict, floor: float, args, kept) -> tuple[dict, str]:
    """spec governed, pinned at 4x and (--hog) governed beside a hog,
    --repeat times each: the row and the line printed."""
    gov = []
    for _ in range(args.repeat):
        _from_floor(rec, floor)
        gov.append(_one(spec, rec, True))
        kept(gov[-1][0], f"governed-{len(gov)}")
    g = _figure(gov)
    size = spec.sizes[0]
    row = {"collective": spec.collective, "transport": spec.transport, "size_bytes": size,
           "governed": g,
           "trials_governed": [len(r["governor"]["trials"]) for r, _ in gov]}  # fmt: skip
    line = f"{spec.collective:10s} {spec.transport:8s} {size_text(size):>6s} governed {_text(g)}"
    line += _spread(g)
    p = None
    if not args.no_pinned:
        k_pinned, why = _pinned_k(spec, rec, max(r["governor"]["k_max"] for r, _ in gov))
        labs.rescale(rec, k_pinned)  # pinned
        pinned = []
        try:
            for _ in range(args.repeat):
                pinned.append(_one(spec, rec, False))
                kept(pinned[-1][0], f"pinned-4x-{len(pinned)}")
        finally:
            _from_floor(rec, floor)
        p = _figure(pinned)
        row["pinned_4x"] = p
        if why:
            row["pinned_why"] = why
        line += (f"  pinned {why or '4x'} {_text(p)}{_spread(p)}"
                 f"  governed/pinned {g['busbw'] / p['busbw']:.3f}"
                 f"{bench.overlap_text(g['range'], p['range'])}")  # fmt: skip
    if args.hog:
        hogged = []
        for _ in range(args.repeat):
            hog = multiprocessing.Process(target=_hog, daemon=True)
            hog.start()
            try:
                hogged.append(_one(spec, rec, True))
            finally:
                hog.terminate()
                hog.join()
            kept(hogged[-1][0], f"hog-{len(hogged)}")
            _from_floor(rec, floor)
        h = _figure(hogged)
        row["hog"] = h
        line += f"  hog: {_text(h)}"
        if p is not None:
            line += f", hog/pinned {h['busbw'] / p['busbw']:.3f}"
    return row, line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", default="erack-8x4", help="a lab of netns-labs/ (its stem)")
    ap.add_argument("--size", default="16M", help="bytes per rank; a comma list runs each")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each configuration (governed, pinned, hog): its figure is their median,"
        " printed with each run's and their spread (a workload's run-to-run spread at one k"
        " is the floor under any governed/pinned ratio)",
    )
    ap.add_argument("--transports", default="ethplus,roce,tcp")
    ap.add_argument("--collectives", default="all-reduce,all-to-all")
    ap.add_argument("--hog", action="store_true", help="also governed with a CPU hog")
    ap.add_argument(
        "--no-pinned",
        action="store_true",
        help="governed only (a big lab's latency-bound sizes take hours at 4x)",
    )
    ap.add_argument("--json")
    ap.add_argument(
        "--keep",
        metavar="DIR",
        help="write each run's whole result (bench --json: counters, fidelity, the"
        " governor's trials) to DIR, to explain a row afterwards",
    )
    args = ap.parse_args()
    keep = Path(args.keep) if args.keep else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)

    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    def kept(res: dict, how: str) -> None:
        if keep:
            name = f"{res['collective']}-{res['transport']}-{res['rows'][0]['size_bytes']}-{how}"
            bench.write_json(res, str(keep / f"{name}.json"))

    sizes = [bench.parse_size(x) for x in args.size.split(",")]
    out = []
    # killed (timeout, ^C from a parent): unwind, so the session takes its lab down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with labs.session(args.lab) as rec:
        floor = float(rec["time_scale"])
        for collective, uneven in WORKLOADS:
            if collective not in args.collectives.split(","):
                continue
            for t, size in ((t, z) for t in args.transports.split(",") for z in sizes):
                spec = bench.Spec(collective=collective, transport=t, sizes=[size],
                                  iters=args.iters, warmup=1, uneven=uneven).validate()  # fmt: skip
                try:
                    row, line = _compare(spec, rec, floor, args, kept)
                except JobError as e:
                    print(f"{collective:10s} {t:8s} {size} B failed: {e}", flush=True)
                    continue
                out.append(row)
                print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
