#!/usr/bin/env python3
"""Do small sizes' nominal times depend on k, and does the governed run's
check at a second time scale catch it?  One run.

On erack-8x4, for one transport and collective at --sizes (latency-bound
ones by default): each size's nominal time with k pinned at --k and at 4x
and 16x it, as ratios to the 16x figure (the host's latencies are 1/k of
nominal time: a ratio past 1 is the host's share at that k), with each
run's verdict; then a governed run with its checks (`trials.check_k`):
the k each size ended at, whether it moved, and its figure against the
16x one (target: within 1.05).  Prints real seconds per run.

    sudo .venv/bin/python scripts/bench_kcheck.py [--sizes 64K,1M] [--k 6400]
        [--transport ethplus] [--collective all-reduce] [--iters 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import time

from dataplane.lab import labs
from dataplane.run import bench, trials

FACTORS = (1, 4, 16)


def _row_text(row: dict) -> str:
    verdict = "behind" if row["fell_behind"] else "ok"
    return f"{row['time_us']:9.2f} us {verdict:6}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", default="erack-8x4")
    ap.add_argument("--sizes", default="64K,1M")
    ap.add_argument("--k", type=float, default=6400.0, help="the smallest pinned k")
    ap.add_argument("--transport", default="ethplus")
    ap.add_argument("--collective", default="all-reduce")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    spec = bench.Spec(
        collective=args.collective, sizes=bench.parse_sizes(args.sizes), iters=args.iters,
        warmup=2, transport=args.transport,
    ).validate()  # fmt: skip
    out: dict = {"pinned": {}, "governed": None}
    with labs.session(args.lab) as rec:
        floor = trials.fabric_governor(rec)["floor_k"]
        for f in FACTORS:
            k = args.k * f
            labs.control(rec["name"], {"op": "scale", "k": k})
            t0 = time.monotonic()
            res = bench.run(spec, rec)
            out["pinned"][k] = {"rows": res["rows"], "real_s": time.monotonic() - t0}
            print(f"# pinned at k={k:g}: {time.monotonic() - t0:.1f} s real", file=sys.stderr)
        labs.rescale(rec, floor)
        labs.control(rec["name"], {"op": "scale", "k": "auto"})
        t0 = time.monotonic()
        gov = trials.run(spec, rec, log=lambda m: print(m, file=sys.stderr))
        out["governed"] = {"rows": gov["rows"], "real_s": time.monotonic() - t0,
                           "k_checks": gov["governor"]["k_checks"]}  # fmt: skip
    ks = sorted(out["pinned"])
    top = {r["size_bytes"]: r for r in out["pinned"][ks[-1]]["rows"]}
    print(f"{args.transport} {args.collective} on {args.lab}, nominal time per iteration,"
          f" ratio to k={ks[-1]:g}'s")  # fmt: skip
    for size, ref in top.items():
        cells = []
        for k in ks:
            row = next(r for r in out["pinned"][k]["rows"] if r["size_bytes"] == size)
            cells.append(f"k={k:g}: {_row_text(row)} {row['time_us'] / ref['time_us']:.3f}")
        g = next(r for r in out["governed"]["rows"] if r["size_bytes"] == size)
        moved = any(c["moved"] for c in g.get("k_checks", []))
        lo, hi = g["k_range"]
        cells.append(
            f"governed, checked (k={lo:g}{'' if lo == hi else f'..{hi:g}'}"
            f"{', moved' if moved else ''}): {_row_text(g)} {g['time_us'] / ref['time_us']:.3f}"
        )
        print(f"{size:>10} B  " + "\n              ".join(cells))
    for k in ks:
        print(f"real time pinned at k={k:g}: {out['pinned'][k]['real_s']:.1f} s")
    print(f"real time governed with its checks: {out['governed']['real_s']:.1f} s")
    if args.json:
        bench.write_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
