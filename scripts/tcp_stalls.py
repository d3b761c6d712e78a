#!/usr/bin/env python3
"""What stalls kernel TCP's iterations: each run's iterations beside the
kernel's own counts of what recovered them.

Runs the uneven all-to-all (MoE-like sizes) over kernel TCP --runs times on
one lab pinned at --k, and prints per run: busbw, each timed iteration's
nominal microseconds (job-level: from when the previous one had ended on
every rank), how many stalled (longer than --stall x the run's median),
and, over the whole run (check and warm-up runs included), the kernel's
retransmit timeouts, tail-loss probes and the tail losses those probes
repaired (TCPLossProbeRecovery, read in each host's namespace).  With one
segment in flight, Linux's probe timeout is 2 RTT + rto_min, cut to the
RTO: a lost lone tail then waits about an RTO yet counts as a probe.

    sudo .venv/bin/python scripts/tcp_stalls.py [--lab erack-8x4] [--k 28800]
        [--size 16M] [--iters 6] [--runs 4] [--stall 3] [--json FILE]

--lab may be a lab file of your own (its [tcp] rto_min_us, say).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys

from dataplane.errors import EthplusError, UsageError
from dataplane.lab import labs
from dataplane.run import bench
from dataplane.run.job import JobError, iteration_times_s
from dataplane.units import parse_size

COUNTS = ("tcp_rtos", "tcp_loss_probes", "tcp_loss_probe_recoveries", "tcp_retx_segs")


def one_run(spec: bench.Spec, rec: dict, stall: float) -> dict:
    res = bench.run(spec, rec)
    row = res["rows"][0]
    its_us = [t * 1e6 for t in iteration_times_s(res["real_rows"][0]) or []]
    med = statistics.median(its_us) if its_us else 0.0
    c = res["nic_counters"]
    return {
        "busbw_GBps": row["busbw_GBps"],
        "verdict": "behind" if row["fell_behind"] else "ok",
        "iterations_us": its_us,
        "stalled": sum(t > stall * med for t in its_us),
        **{name: c.get(name, 0) for name in COUNTS},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", default="erack-8x4")
    ap.add_argument("--k", type=float, default=28800.0, help="the pinned time scale")
    ap.add_argument("--size", default="16M")
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--stall", type=float, default=3.0, help="stalled: this x the median")
    ap.add_argument("--json", help="write every run's figures to this file")
    args = ap.parse_args()
    if args.runs < 1 or args.iters < 1:
        ap.error("--runs and --iters must be at least 1")
    try:
        size = parse_size(args.size, "--size")
    except UsageError as e:
        ap.error(str(e))
    spec = bench.Spec(collective="all-to-all", transport="tcp", sizes=[size],
                      iters=args.iters, warmup=1, uneven=True).validate()  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the lab comes down
    out = []
    print(f"# kernel TCP uneven all-to-all {args.size} on {args.lab}, k {args.k:g} pinned")
    print("# run  busbw GB/s  verdict  stalled  RTOs  TLPs  TLP repairs  resent  iterations (us)")
    with labs.session(args.lab, time_scale=args.k) as rec:
        for i in range(args.runs):
            try:
                r = one_run(spec, rec, args.stall)
            except JobError as e:
                print(f"{i:5d}  failed: {e}", flush=True)
                continue
            out.append(r)
            its = ", ".join(f"{t:.0f}" for t in r["iterations_us"])
            print(f"{i:5d}  {r['busbw_GBps']:10.2f}  {r['verdict']:7s}  {r['stalled']:7d}"
                  f"  {r['tcp_rtos']:4d}  {r['tcp_loss_probes']:4d}"
                  f"  {r['tcp_loss_probe_recoveries']:11d}  {r['tcp_retx_segs']:6d}  {its}",
                  flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"k": args.k, "lab": args.lab, "runs": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except EthplusError as e:  # a bad lab file, a lab of that name running: no traceback
        print(f"tcp_stalls.py: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
