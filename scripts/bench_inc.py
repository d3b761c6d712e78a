#!/usr/bin/env python3
"""In-network all-reduce against the ring, on one lab, in one run.

Brings up erack-8x4 (or uses a running lab of that name) and, for each size,
runs all-reduce over the ethplus transport with the ring and with in-network
aggregation, alternating (--runs times each, so a noisy minute hits both),
then prints the median time of each, the speed-up of in-network over the
ring, and each one's busbw as a share of its own ideal (the ring: one rank's
capacity; in-network: that x 2(n-1)/n, since each byte crosses a rank's
links once each way).  With --roce, the ring over emulated RoCEv2 too.

--tree-vs-flat instead brings up clos-16 twice at once (with
--oversubscription, default 2: the leaves' uplinks are the narrow part), one
with aggregation trees (the leaves reduce their hosts' chunks first) and one
flat (every host sends to the spines), and alternates in-network runs on the
two.

    sudo .venv/bin/python scripts/bench_inc.py [--sizes 1M,16M,64M] [--runs 3]
        [--iters 3] [--lab erack-8x4] [--roce] [--json FILE]
    sudo .venv/bin/python scripts/bench_inc.py --tree-vs-flat [--oversubscription 2]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import tempfile
from pathlib import Path

from dataplane.lab import labs
from dataplane.model import library
from dataplane.run import bench


def _one(rec: dict, transport: str, algo: str, size: int, iters: int) -> dict:
    spec = bench.Spec(collective="all-reduce", transport=transport, sizes=[size], iters=iters,
                      warmup=1, algo=algo).validate()  # fmt: skip
    res = bench.run(spec, rec)
    row = res["rows"][0]
    if row["wrong"]:
        raise SystemExit(f"{transport}/{algo} at {size} B: {row['wrong']} wrong elements")
    return {
        "time_us": row["time_us"],
        "busbw_GBps": row["busbw_GBps"],
        "share": row["busbw_GBps"] / res["ideal_busbw_GBps"],
        "clean": res["fidelity"]["clean"],
    }


def _clos_file(directory: str, name: str, tree: bool, oversubscription: float) -> str:
    text = library.find("clos-16").read_text()
    text = re.sub(r"(?m)^oversubscription = .*$", f"oversubscription = {oversubscription}", text)
    text = text.replace("inc = true", f"inc = true\ninc_tree = {str(tree).lower()}")
    path = Path(directory) / f"{name}.toml"
    path.write_text(text)
    return str(path)


def tree_vs_flat(args) -> dict:
    out: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        recs = {
            kind: stack.enter_context(
                labs.session(_clos_file(d, f"inc-{kind}", kind == "tree", args.oversubscription))
            )
            for kind in ("tree", "flat")
        }
        for size in bench.parse_sizes(args.sizes):
            runs = out.setdefault(str(size), {"tree": [], "flat": []})
            for i in range(args.runs):
                for kind in ("tree", "flat") if i % 2 == 0 else ("flat", "tree"):
                    runs[kind].append(_one(recs[kind], "ethplus", "in-network", size, args.iters))
            med = {k: statistics.median(r["time_us"] for r in v) for k, v in runs.items()}
            clean = {k: all(r["clean"] for r in v) for k, v in runs.items()}
            print(
                f"in-network all-reduce {size >> 10} KiB on clos-16 (oversubscription"
                f" {args.oversubscription:g}), {args.runs} run(s) each, medians: tree"
                f" {med['tree']:.1f} us{'' if clean['tree'] else ' (NOT clean)'}, flat"
                f" {med['flat']:.1f} us{'' if clean['flat'] else ' (NOT clean)'};"
                f" the tree is {med['flat'] / med['tree']:.2f}x the flat one's speed",
                flush=True,
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", default="erack-8x4")
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--roce", action="store_true", help="also the ring over emulated RoCEv2")
    ap.add_argument("--json", help="write every run here")
    ap.add_argument("--tree-vs-flat", action="store_true", help="trees against flat, on clos-16")
    ap.add_argument("--oversubscription", type=float, default=2.0)
    args = ap.parse_args()
    if args.tree_vs_flat:
        out = tree_vs_flat(args)
        if args.json:
            bench.write_json(out, args.json)
        return 0
    variants = [("ethplus", "ring"), ("ethplus", "in-network")]
    if args.roce:
        variants.append(("roce", "ring"))
    out: dict[str, dict[str, list[dict]]] = {}
    with labs.session(args.lab) as rec:
        for size in bench.parse_sizes(args.sizes):
            runs = out.setdefault(str(size), {f"{t}/{a}": [] for t, a in variants})
            for i in range(args.runs):
                for t, a in variants if i % 2 == 0 else reversed(variants):
                    runs[f"{t}/{a}"].append(_one(rec, t, a, size, args.iters))
            med = {k: statistics.median(r["time_us"] for r in v) for k, v in runs.items()}
            ring, inc = med["ethplus/ring"], med["ethplus/in-network"]
            parts = [
                f"{k} {med[k]:.1f} us (busbw {statistics.median(r['share'] for r in v):.3f}"
                f" of its ideal{'' if all(r['clean'] for r in v) else ', NOT clean'})"
                for k, v in runs.items()
            ]
            print(
                f"all-reduce {size >> 10} KiB, {args.runs} run(s) each, medians: "
                + "; ".join(parts)
                + f"; in-network is {ring / inc:.2f}x the ring's speed"
                + (f", {med['roce/ring'] / inc:.2f}x roce's" if "roce/ring" in med else ""),
                flush=True,
            )
    if args.json:
        bench.write_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
