#!/usr/bin/env python3
"""The scenario suite's full forms, in one run: per scenario, each
transport's headline figure and ethplus's advantage over each baseline.

Targets (issue 7): ecmp-collision job completion at least 1.5x faster than
tcp and roce; plane-failure slowdown within 1.2 x P/(P-1) for ethplus;
incast-alltoall busbw at least 1.3x roce's.

    sudo .venv/bin/python scripts/bench_scenarios.py [--short] [--only NAME,...]
        [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dataplane import lab, report, scenario

TARGETS = {
    "ecmp-collision": ("job completion time, ethplus faster by", {"tcp": 1.5, "roce": 1.5}),
    "incast-alltoall": ("busbw, ethplus higher by", {"roce": 1.3}),
    "incast-alltoall-erack": ("busbw, ethplus higher by", {"roce": 1.3}),
}
PLANES = 4  # erack-8x4: P/(P-1) = 4/3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--only", help="comma list of scenario names")
    ap.add_argument("--out", default="results/bench-scenarios")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else [s.name for s in scenario.listing()]
    summary = {}
    for name in names:
        sc = scenario.load(name, short=args.short)
        with lab.session(sc.lab) as rec:
            res = scenario.run(sc, rec, log=lambda m: print(m, file=sys.stderr, flush=True))
            report.write_scenario(str(Path(args.out) / name), res, rec)
        s = res["summary"]
        summary[name] = s
        figs = ", ".join(
            f"{t} {'stalled' if v is None else f'{v:.3f}'}" for t, v in s["figures"].items()
        )
        print(
            f"{name} ({s['metric']}{', lower is better' if s['lower_is_better'] else ''}): {figs}"
        )
        adv = s["ethplus_advantage"]
        if name in TARGETS:
            what, want = TARGETS[name]
            for t, target in want.items():
                got = adv.get(t)
                verdict = "n/a" if got is None else ("met" if got >= target else "MISSED")
                shown = "-" if got is None else f"{got:.2f}x"
                print(f"  {what} {shown} against {t} (target {target}x): {verdict}")
        elif name == "plane-failure":
            e = s["figures"].get("ethplus")
            bound = 1.2 * PLANES / (PLANES - 1)
            verdict = "n/a" if e is None else ("met" if e <= bound else "MISSED")
            shown = "stalled" if e is None else f"{e:.2f}"
            print(f"  ethplus slowdown {shown} against P/(P-1) = {PLANES / (PLANES - 1):.2f}"
                  f" (target <= {bound:.2f}): {verdict}")  # fmt: skip
        else:
            for t, v in adv.items():
                print(f"  {s['reference']} advantage over {t}: {v:.2f}x")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
