#!/usr/bin/env python3
"""Do nominal results depend on the machine?  The governor against a pinned
time scale, in one run.

On erack-8x4 (time scale auto: governed), for each transport and workload
(all-reduce; all-to-all with MoE-like uneven sizes) at --size: busbw
governed, against busbw pinned at 4x the highest k the governor used in
the timed runs (a k at which the machine is surely not the bottleneck),
and (--hog) governed while a busy loop holds one of the two cores for the
whole run.  Prints each ratio (target: 0.93-1.07 for ethplus and roce,
0.90-1.10 for tcp), the range of k the governor used, each figure's
iterations' range (their slowest and fastest busbw) and whether the
governed and the pinned run's overlap, and the real seconds each run took.
Each transport starts governed from the lab's floor.

    sudo .venv/bin/python scripts/bench_fidelity.py [--lab erack-8x4] [--size 16M[,1M]]
        [--iters 3] [--transports ethplus,roce,tcp] [--collectives all-reduce,all-to-all]
        [--hog] [--no-pinned] [--json FILE] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

from dataplane.lab import labs
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
    res = trials.run(spec, rec) if govern else bench.run(spec, rec)
    return res, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", default="erack-8x4", help="a lab of netns-labs/ (its stem)")
    ap.add_argument("--size", default="16M", help="bytes per rank; a comma list runs each")
    ap.add_argument("--iters", type=int, default=3)
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
                    _from_floor(rec, floor)
                    g, g_s = _one(spec, rec, True)
                    kept(g, "governed")
                    kg = g["governor"]["k_max"]
                    p = p_s = None
                    if not args.no_pinned:
                        labs.rescale(rec, 4 * kg)  # pinned
                        try:
                            p, p_s = _one(spec, rec, False)
                            kept(p, "pinned-4x")
                        finally:
                            _from_floor(rec, floor)
                except JobError as e:
                    print(f"{collective:10s} {t:8s} {size} B failed: {e}", flush=True)
                    continue
                row = {"collective": collective, "transport": t, "size_bytes": size,
                       "k_governed": _k(g), "busbw_governed": g["rows"][0]["busbw_GBps"],
                       "behind_governed": g["rows"][0]["fell_behind"], "real_s_governed": g_s,
                       "trials_governed": len(g["governor"]["trials"])}  # fmt: skip
                g_range = g["rows"][0]["busbw_range_GBps"]
                row["busbw_range_governed"] = g_range
                line = (f"{collective:10s} {t:8s} {size_text(size):>6s}"
                        f" governed k={_k(g):<13s}"
                        f" {row['busbw_governed']:7.1f} GB/s{bench.range_text(g_range)}"
                        f" {_verdict(row['behind_governed'])} ({g_s:5.1f} s real,"
                        f" {row['trials_governed']} trials)")  # fmt: skip
                if p is not None:
                    p_range = p["rows"][0]["busbw_range_GBps"]
                    row.update(busbw_pinned_4x=p["rows"][0]["busbw_GBps"],
                               busbw_range_pinned_4x=p_range,
                               behind_pinned_4x=p["rows"][0]["fell_behind"],
                               real_s_pinned_4x=p_s)  # fmt: skip
                    line += (f"  pinned 4x k={4 * kg:<7g} {row['busbw_pinned_4x']:7.1f} GB/s"
                             f"{bench.range_text(p_range)}"
                             f" {_verdict(row['behind_pinned_4x'])} ({p_s:5.1f} s)  governed/pinned"
                             f" {row['busbw_governed'] / row['busbw_pinned_4x']:.3f}"
                             f"{bench.overlap_text(g_range, p_range)}")  # fmt: skip
                if args.hog:
                    hog = multiprocessing.Process(target=_hog, daemon=True)
                    hog.start()
                    try:
                        h, h_s = _one(spec, rec, True)
                    finally:
                        hog.terminate()
                        hog.join()
                    kept(h, "hog")
                    _from_floor(rec, floor)
                    row.update(k_hog=_k(h), busbw_hog=h["rows"][0]["busbw_GBps"],
                               behind_hog=h["rows"][0]["fell_behind"], real_s_hog=h_s)  # fmt: skip
                    line += (
                        f"  hog: k={row['k_hog']} {row['busbw_hog']:.1f} GB/s"
                        f" {_verdict(row['behind_hog'])} ({row['real_s_hog']:.1f} s)"
                    )
                    if p is not None:
                        line += f", hog/pinned {row['busbw_hog'] / row['busbw_pinned_4x']:.3f}"
                out.append(row)
                print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
