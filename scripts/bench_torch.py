#!/usr/bin/env python3
"""PyTorch jobs on erack-8x4: the ethplus torch backend against stock gloo
over kernel TCP, and the backend's overhead over `ethplus bench`.

One lab (pinned k), everything in one run:
1. examples/ddp_mlp.py and examples/moe_step.py under `ethplus run`, with
   the ethplus backend (ethplus transport) and with --backend gloo: nominal
   communication time per step, busbw of each's main collective, verdict;
2. the backend's own cost: a loop of one collective at one size under
   `ethplus run` (each call timed by the backend) against `ethplus bench`
   for the same collective, size and algorithm (the ring, and the switches'
   all-reduce), alternating, --runs times.
   Target: the backend's time per call within 10% of bench's.

Run as root: .venv/bin/python scripts/bench_torch.py [--runs N] [--time-scale K]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from dataplane.model.catalog import bus_factor
from dataplane.run import launcher

ROOT = Path(__file__).resolve().parent.parent

ETHPLUS = [sys.executable, "-m", "cli.main"]
LOOP = ROOT / "scripts" / "torch_loop.py"
WARMUP = 3


def ethplus(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([*ETHPLUS, *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"ethplus {' '.join(args)} failed: {r.stderr[-2000:]}")
    return r


def run_json(lab: str, out: Path, *args: str) -> dict:
    ethplus("run", lab, "--json", str(out), *args)
    return json.loads(out.read_text())


def per_call(result: dict, name: str, skip: int = 0) -> list[tuple[int, float]]:
    """(bytes, nominal s) of each call of collective name (launcher.call_times),
    the first skip left out."""
    return [(b, t) for n, b, t in launcher.call_times(result) if n == name][skip:]


def verdict(result: dict) -> str:
    f = result["fidelity"]
    return "clean" if f["clean"] else "NOT CLEAN (machine saturated)"


def job(lab: str, tmp: Path, script: str, steps: int, main: str, backend: str) -> dict:
    res = run_json(lab, tmp / f"{Path(script).stem}-{backend}.json", "--backend", backend,
                   "--", "python", str(ROOT / script), "--steps", str(steps))  # fmt: skip
    comm_s = sum(r["time_s"] for r in res["summary"] if r["collective"] not in ("send", "recv"))
    calls = per_call(res, main)
    big = max(b for b, _ in calls)
    top = [t for b, t in calls if b == big]
    world = len(res["ranks"])
    factor = bus_factor(main, world)
    busbw = big / statistics.median(top) / 1e9 * factor
    return {"comm_us_per_step": comm_s / steps * 1e6, "size": big, "busbw": busbw,
            "verdict": verdict(res)}  # fmt: skip


def jobs(lab: str, tmp: Path) -> None:
    print(f"{'job':<10} {'backend':<16} {'comm us/step':>13} {'main collective':>22}"
          f" {'busbw GB/s':>11}  verdict")  # fmt: skip
    for script, steps, coll in (("examples/ddp_mlp.py", 6, "all-reduce"),
                                ("examples/moe_step.py", 6, "all-to-all")):  # fmt: skip
        rows = {b: job(lab, tmp, script, steps, coll, b) for b in ("ethplus", "gloo")}
        for b, r in rows.items():
            label = "ethplus/ethplus" if b == "ethplus" else "gloo (TCP)"
            what = f"{coll} {r['size']} B"
            print(f"{Path(script).stem:<10} {label:<16} {r['comm_us_per_step']:>13.1f}"
                  f" {what:>22} {r['busbw']:>11.2f}  {r['verdict']}")  # fmt: skip
        g, e = rows["gloo"], rows["ethplus"]
        ratio = e["comm_us_per_step"] / g["comm_us_per_step"]
        print(
            f"{'':<10} ethplus/gloo: comm time {ratio:.2f}x, busbw {e['busbw'] / g['busbw']:.2f}x\n"
        )


def overhead(lab: str, tmp: Path, runs: int, iters: int) -> None:
    print("backend overhead: time per call under `ethplus run` (torch) / `ethplus bench`,"
          " same collective, size and algorithm, alternating runs")  # fmt: skip
    cases = (("all-reduce", "1M", "ring"), ("all-reduce", "16M", "ring"),
             ("all-reduce", "1M", "in-network"), ("all-reduce", "16M", "in-network"),
             ("all-to-all", "1M", "ring"))  # fmt: skip
    for coll, size, algo in cases:
        what = f"{coll} {size}" + (f" {algo}" if coll == "all-reduce" else "")
        ratios = []
        for i in range(runs):
            b = json.loads(ethplus_bench(lab, tmp, coll, size, algo, iters, i))
            bench_us = b["rows"][0]["time_us"]
            t = run_json(lab, tmp / f"loop-{coll}-{size}-{algo}-{i}.json", "--algo", algo, "--",
                         "python", str(LOOP), coll, size, str(iters + WARMUP))  # fmt: skip
            torch_us = statistics.mean(x for _, x in per_call(t, coll, skip=WARMUP)) * 1e6
            ratios.append(torch_us / bench_us)
            bench_ok = "clean" if b["fidelity"]["clean"] else "NOT CLEAN"
            print(f"  {what}: run {i + 1}: torch {torch_us:.1f} us ({verdict(t)}),"
                  f" bench {bench_us:.1f} us ({bench_ok}),"
                  f" ratio {torch_us / bench_us:.3f}")  # fmt: skip
        med = statistics.median(ratios)
        print(f"  {what}: median ratio {med:.3f} ({min(ratios):.3f}-{max(ratios):.3f}):"
              f" {'met' if med <= 1.10 else 'NOT met'} (target <= 1.10)\n")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="alternating overhead runs (3)")
    p.add_argument("--time-scale", type=float, help="k (default: the lab's auto k, pinned)")
    p.add_argument("--iters", type=int, default=20, help="calls per overhead run (20)")
    p.add_argument("--only", choices=["jobs", "overhead"], help="one part only")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_torch.py: run as root")
    lab = f"ethpbt{os.getpid() % 10000}"
    up = ["lab", "up", "erack-8x4", "--name", lab]
    up += ["--time-scale", str(args.time_scale)] if args.time_scale else ["--pin"]
    ethplus(*up)
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            k = json.loads(ethplus("lab", "show", lab, "--json").stdout)["time_scale"]
            print(f"erack-8x4, 8 ranks, k={k:g} (pinned)\n")
            if args.only != "overhead":
                jobs(lab, tmp)
            if args.only != "jobs":
                overhead(lab, tmp, args.runs, args.iters)
    finally:
        subprocess.run([*ETHPLUS, "lab", "down", lab], capture_output=True, cwd=ROOT)
    return 0


def ethplus_bench(lab: str, tmp: Path, coll: str, size: str, algo: str, iters: int,
                  i: int) -> str:  # fmt: skip
    out = tmp / f"bench-{coll}-{size}-{algo}-{i}.json"
    ethplus("bench", coll, "--lab", lab, "--sizes", size, "--iters", str(iters), "--warmup",
            str(WARMUP), "--algo", algo, "--no-govern", "--json", str(out))  # fmt: skip
    return out.read_text()


if __name__ == "__main__":
    sys.exit(main())
