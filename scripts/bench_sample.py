#!/usr/bin/env python3
"""What sampling a lab's fabric costs: a job's samples (the `sample`
request, one C call per switch, its ports packed) against the full counters
(the `stats` request, which jobs sampled with before), in one run on the same
idle lab, one after the other, alternating.

Per lab: real seconds per request as the job sees it, the fabric's CPU
seconds per request, and the job's memory per sample kept; then the ratios
stats / sample.

    sudo .venv/bin/python scripts/bench_sample.py [--labs erack-8x4,upn-512] [--n 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import tracemalloc

from dataplane.lab import cpu, fabric_client, labs
from dataplane.report import fidelity
from dataplane.run import job


def _stats_sample(lab: str) -> dict:
    """A sample as jobs made them before: the full stats, then its ports
    picked out into a dict of lists."""
    st = job.fabric_stats(lab)
    ports = {
        f"{sw}:{c['peer']}": [c[f] for f in fidelity.SAMPLE_FIELDS]
        for sw, x in st["switches"].items()
        for c in x["ports"].values()
    }
    return {"t": time.monotonic(), "cpu_s": st["cpu_s"], "k": st["time_scale"], "ports": ports}


def _measure(fn, lab: str, n: int, fabric_pid: int) -> tuple[float, float, float]:
    """Median real s per request, fabric CPU s per request, bytes kept per
    sample (n samples kept, as a job keeps them)."""
    kept: list[dict] = []
    times = []
    cpu0 = cpu.process_s(fabric_pid)
    tracemalloc.start()
    for _ in range(n):
        t0 = time.perf_counter()
        kept.append(fn(lab, kept[-1] if kept else None))
        times.append(time.perf_counter() - t0)
    mem, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), (cpu.process_s(fabric_pid) - cpu0) / n, mem / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labs", default="erack-8x4,upn-512")
    ap.add_argument("--n", type=int, default=20, help="requests of each kind (20)")
    args = ap.parse_args()
    for lab_file in args.labs.split(","):
        with labs.session(lab_file) as rec:
            lab = rec["name"]
            pid = int(fabric_client.request(lab, {"op": "ping"})["pid"])
            ports = sum(len(n["ports"]) for n in rec["topology"]["nodes"] if n["role"] == "switch")
            old = new = None
            for _ in range(2):  # alternating: the second pair is the one printed
                old = _measure(lambda x, _p: _stats_sample(x), lab, args.n, pid)
                new = _measure(job.fabric_sample, lab, args.n, pid)
            print(
                f"{lab_file:11s} {ports:5d} switch ports"
                f"  stats: {old[0] * 1e3:7.1f} ms, fabric CPU {old[1] * 1e3:7.1f} ms,"
                f" {old[2] / 1024:7.0f} KiB kept"
                f"  sample: {new[0] * 1e3:6.1f} ms, fabric CPU {new[1] * 1e3:6.1f} ms,"
                f" {new[2] / 1024:6.0f} KiB kept"
                f"  ratios {old[0] / new[0]:.1f}x, {old[1] / max(new[1], 1e-9):.1f}x,"
                f" {old[2] / new[2]:.1f}x"
                f"  (sampled every {fidelity.sample_interval_s(rec):.1f} s)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("bench_sample.py: run as root (it brings labs up)")
    sys.exit(main())
