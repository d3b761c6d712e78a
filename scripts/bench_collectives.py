#!/usr/bin/env python3
"""All-reduce busbw as a fraction of the ideal, per transport, in one run.

Brings up erack-8x4 (or uses a running lab of that name), runs all-reduce at
64 MiB over each transport one after the other on the same lab, and prints
busbw / ideal (ideal: one rank's nominal capacity over all its planes), the
fidelity verdict, and each transport's figure as a ratio to tcp's.

    sudo .venv/bin/python scripts/bench_collectives.py [--size 64M] [--iters 5]
        [--transports ethplus,tcp] [--tcp-streams N] [--algo ring]
"""

from __future__ import annotations

import argparse
import sys

from dataplane.lab import labs
from dataplane.model import catalog
from dataplane.run import bench


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", default="erack-8x4")
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--algo", default="ring")
    ap.add_argument("--transports", default=",".join(catalog.available()))
    ap.add_argument("--tcp-streams", type=int)
    ap.add_argument("--json", help="write every result here")
    args = ap.parse_args()
    out = {}
    with labs.session(args.lab) as rec:
        for t in args.transports.split(","):
            spec = bench.Spec(
                collective="all-reduce", transport=t, sizes=bench.parse_sizes(args.size),
                iters=args.iters, warmup=args.warmup, algo=args.algo,
                tcp_streams=args.tcp_streams,
            ).validate()  # fmt: skip
            res = bench.run(spec, rec)
            row = res["rows"][-1]
            f = res["fidelity"]
            share = row["busbw_GBps"] / res["ideal_busbw_GBps"]
            extra = ""
            if t == "tcp":
                extra = f", {res['transport_config'].get('streams')} stream(s) per pair"
            print(
                f"{t:8s} all-reduce {bench.parse_sizes(args.size)[0] >> 20} MiB: busbw"
                f" {row['busbw_GBps']:.1f} GB/s = {share:.3f} of ideal"
                f" ({res['ideal_busbw_GBps']:.0f} GB/s){extra}; k={row.get('k_range')};"
                f" #wrong {row['wrong']};"
                f" fidelity {'clean' if f['clean'] else 'NOT clean'}"
                f" (lost link time {f['pacer']['lost_link_ns'] / 1e6:.0f} ms,"
                f" machine {f['cpu']['machine_busy_share']:.0%} busy)",
                flush=True,
            )
            out[t] = {"share_of_ideal": share, "result": res}
    if "tcp" in out:
        for t, v in out.items():
            if t != "tcp":
                print(f"{t} / tcp busbw: {v['share_of_ideal'] / out['tcp']['share_of_ideal']:.2f}x")
    if args.json:
        bench.write_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
