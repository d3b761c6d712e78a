#!/usr/bin/env python3
"""What kernel TCP's congestion control costs and whether it holds with k.
One run.

For each --ccs name (the first is the baseline), a copy of --lab with
`[tcp] congestion_control` set to it, and for each --k: kernel TCP's busbw
for each --workloads item (all-reduce, uneven all-to-all, and one flow each
way: an all-reduce between two accelerators, --pair), alternating the
congestion controls run by run (--rounds), each run's verdict, and per
workload: each one's median against the baseline's at the same k, and its
largest k's against its smallest (tcp's band: 0.90-1.10).  CE marks (the
senders' count of segments delivered CE-marked) beside each figure.

    sudo .venv/bin/python scripts/bench_tcp_cc.py [--lab erack-8x4] [--ccs reno,cubic]
        [--k 25600] [--size 16M] [--iters 3] [--rounds 2] [--pair h0,h4] [--json FILE]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

from dataplane.lab import labs
from dataplane.model import library
from dataplane.run import bench

WORKLOADS = {
    "all-reduce": {"collective": "all-reduce"},
    "all-to-all-uneven": {"collective": "all-to-all", "uneven": True},
    "one-flow-each-way": {"collective": "all-reduce", "pair": True},
}


def lab_copy(lab: str, cc: str, where: Path) -> Path:
    """A copy of lab's file whose [tcp] congestion_control is cc."""
    found = library.find(lab)
    if found is None:
        raise SystemExit(f"--lab {lab!r}: no such lab file or shipped lab")
    text = found.read_text()
    line = f'congestion_control = "{cc}"\n'
    text, n = re.subn(r'^congestion_control = "\w+"\n', line, text, flags=re.M)
    if not n:
        text = text.replace("[tcp]\n", "[tcp]\n" + line, 1)
    path = where / f"{lab}-{cc}.toml"
    path.write_text(text)
    return path


def one_run(path: Path, k: float, spec: bench.Spec, nodes) -> dict:
    with labs.session(str(path), k) as rec:
        res = bench.run(spec, rec, nodes=nodes)
    row = res["rows"][0]
    return {"busbw_GBps": row["busbw_GBps"], "ok": not row["fell_behind"],
            "ce": res["nic_counters"].get("tcp_delivered_ce", 0)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", default="erack-8x4")
    ap.add_argument("--ccs", default="reno,cubic")
    ap.add_argument("--k", default="25600", help="comma list of pinned time scales")
    ap.add_argument("--size", default="16M")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pair", default="h0,h4", help="the one-flow workload's two accelerators")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args()
    ccs, ks = args.ccs.split(","), [float(k) for k in args.k.split(",")]
    runs: dict[tuple[str, str, float], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="ethp-cc-") as tmp:
        files = {cc: lab_copy(args.lab, cc, Path(tmp)) for cc in ccs}
        for name in args.workloads.split(","):
            w = WORKLOADS[name]
            spec = bench.Spec(
                collective=w["collective"], transport="tcp", uneven=w.get("uneven", False),
                sizes=bench.parse_sizes(args.size), iters=args.iters, warmup=1,
            ).validate()  # fmt: skip
            nodes = args.pair.split(",") if w.get("pair") else None
            for k in ks:
                for r in range(args.rounds):
                    for cc in ccs if r % 2 == 0 else ccs[::-1]:
                        run = one_run(files[cc], k, spec, nodes)
                        runs.setdefault((name, cc, k), []).append(run)
                        print(f"# {name} {cc} k={k:g}: {run['busbw_GBps']:.2f} GB/s,"
                              f" {run['ce']} CE, {'ok' if run['ok'] else 'behind'}",
                              file=sys.stderr)  # fmt: skip

    def med(name: str, cc: str, k: float) -> float:
        return statistics.median(x["busbw_GBps"] for x in runs[(name, cc, k)])

    print(f"kernel TCP on {args.lab}, {args.size}, busbw GB/s (median of {args.rounds}),"
          f" CE-marked segments; against {ccs[0]} at the same k;"
          " largest k against smallest")  # fmt: skip
    for name in args.workloads.split(","):
        for cc in ccs:
            cells = []
            for k in ks:
                xs = runs[(name, cc, k)]
                verdict = "ok" if all(x["ok"] for x in xs) else "BEHIND"
                cells.append(
                    f"k={k:g}: {med(name, cc, k):7.2f} ({verdict}, CE"
                    f" {statistics.median(x['ce'] for x in xs):.0f})"
                    f" x{med(name, cc, k) / med(name, ccs[0], k):.3f}"
                )
            held = med(name, cc, ks[-1]) / med(name, cc, ks[0])
            print(f"{name:18} {cc:6} " + "  ".join(cells) +
                  (f"  k {ks[-1]:g}/{ks[0]:g}: {held:.3f}" if len(ks) > 1 else ""))  # fmt: skip
    if args.json:
        bench.write_json([{"workload": n, "cc": c, "k": k, "runs": v}
                          for (n, c, k), v in runs.items()], args.json)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
