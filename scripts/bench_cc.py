#!/usr/bin/env python3
"""The ETH+ transport's congestion controls side by side, in one run.

Brings up erack-8x4 (or uses a running lab of that name) and runs each
workload over the ethplus transport with NSCC-like, HPCC-like and RCCC-like
(receiver credits) congestion control, or those --cc names, taking turns
(--runs times each, the order reversed every other round, so a noisy minute
hits all).  Workloads: all-to-all with MoE-like uneven sizes (seven senders
converge on every receiver: incast) and the ring all-reduce (one sender per
receiver and plane: no incast).  Per variant it prints the medians of busbw,
of the deepest egress queue (the switches' deepest queue at each sample,
averaged over the run) and of the payloads trimmed, then each one's ratio
to the first named (NSCC by default) for each.

    sudo .venv/bin/python scripts/bench_cc.py [--cc nscc,hpcc,rccc] [--size 16M]
        [--runs 3] [--iters 3] [--lab erack-8x4] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics

from dataplane.lab import labs
from dataplane.model import labfile
from dataplane.run import bench

WORKLOADS = (("all-to-all", True), ("all-reduce", False))  # (collective, uneven)


def _one(rec: dict, collective: str, uneven: bool, cc: str, size: int, iters: int) -> dict:
    spec = bench.Spec(collective=collective, transport="ethplus", sizes=[size], iters=iters,
                      warmup=1, uneven=uneven, cc=cc).validate()  # fmt: skip
    res = bench.run(spec, rec)
    row = res["rows"][0]
    if row["wrong"]:
        raise SystemExit(f"{collective} over ethplus/{cc}: {row['wrong']} wrong elements")
    per_sample = [max(q) for q in zip(*res["series"]["queue_bytes"].values(), strict=True)]
    drops = res["fidelity"]["drops"].values()
    return {
        "busbw_GBps": row["busbw_GBps"],
        "queue_mean_bytes": statistics.mean(per_sample) if per_sample else 0.0,
        "trimmed": sum(d.get("trimmed", 0) for d in drops),
        "ecn_marked": sum(d.get("ecn_marked", 0) for d in drops),
        "clean": res["fidelity"]["clean"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", default="erack-8x4")
    ap.add_argument("--size", default="16M")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--json", help="write every run here")
    ap.add_argument("--cc", default=",".join(labfile.CC_NAMES),
                    help="congestion controls, the first the reference (default: all)")  # fmt: skip
    args = ap.parse_args()
    ccs = [c.strip() for c in args.cc.split(",") if c.strip()]
    if len(ccs) < 2 or len(set(ccs)) != len(ccs) or set(ccs) - set(labfile.CC_NAMES):
        ap.error(f"--cc: expected two or more of {', '.join(labfile.CC_NAMES)}, got {args.cc!r}")
    size = bench.parse_size(args.size, "--size")
    out: dict[str, dict[str, list[dict]]] = {}
    with labs.session(args.lab) as rec:
        for collective, uneven in WORKLOADS:
            name = f"{collective}{' (uneven)' if uneven else ''}"
            runs = out.setdefault(name, {cc: [] for cc in ccs})
            for i in range(args.runs):
                for cc in ccs if i % 2 == 0 else reversed(ccs):
                    runs[cc].append(_one(rec, collective, uneven, cc, size, args.iters))
            med = {
                cc: {k: statistics.median(r[k] for r in v) for k in v[0] if k != "clean"}
                for cc, v in runs.items()
            }
            for cc in ccs:
                m = med[cc]
                clean = "" if all(r["clean"] for r in runs[cc]) else " (NOT clean)"
                print(
                    f"{name} {size >> 20} MiB on {rec['name']}, ethplus/{cc}, medians of"
                    f" {args.runs}: busbw {m['busbw_GBps']:.1f} GB/s, deepest queue"
                    f" {m['queue_mean_bytes'] / 1000:.1f} KB, trimmed {m['trimmed']:.0f},"
                    f" marked {m['ecn_marked']:.0f}{clean}",
                    flush=True,
                )
            ref = med[ccs[0]]
            for cc in ccs[1:]:
                ratio = {k: f"{med[cc][k] / ref[k]:.2f}x" if ref[k] else "n/a" for k in ref}
                print(
                    f"{name}: {cc} / {ccs[0]}: busbw {ratio['busbw_GBps']}, deepest queue"
                    f" {ratio['queue_mean_bytes']}, trimmed {ratio['trimmed']},"
                    f" marked {ratio['ecn_marked']}",
                    flush=True,
                )
    if args.json:
        bench.write_json(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
