#!/usr/bin/env python3
"""The protocol-aware fuzzer against a running lab (dataplane/run/fuzz.py).

Brings up erack-8x4 (or uses --lab, a running lab or a lab file) and, while
every accelerator but the attacker runs all-reduces over each --transports
in turn (every run checked against numpy), sends --frames fuzzed frames per
transport from the attacker: half through its switch, half straight onto
the target's link.  Prints the frames/s sent, the switches' drops by reason,
the endpoints' receive fates, and both balance checks; exits 1 if a result
was wrong, a job failed or a frame went uncounted.

    sudo .venv/bin/python scripts/fuzz_frames.py [--frames 200000] [--rate 25000]
        [--transports ethplus,roce] [--lab erack-8x4] [--attacker h7] [--target h0]
"""

from __future__ import annotations

import argparse
import json
import sys

from dataplane.lab import labs
from dataplane.run import fuzz


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", default="erack-8x4")
    ap.add_argument("--frames", type=int, default=200_000, help="per transport")
    ap.add_argument("--rate", type=float, default=25_000, help="frames/s to send")
    ap.add_argument("--transports", default="ethplus,roce")
    ap.add_argument("--attacker", default="h7")
    ap.add_argument("--target", default="h0")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    bad = False
    results = {}
    with labs.session(args.lab) as rec:
        for t in args.transports.split(","):
            out = fuzz.campaign(rec["name"], args.frames, attacker=args.attacker,
                                target=args.target, transport=t, rate_fps=args.rate,
                                seed=args.seed)  # fmt: skip
            results[t] = out
            s = out["sent"]
            wrong = sum(r["wrong"] for r in out["rows"])
            nic_bad = [c for c in out["nic_conservation"] if c["difference"]]
            print(f"{t}: sent {s['frames']} frames in {s['seconds']:.1f} s"
                  f" ({s['fps']:.0f} frames/s;"
                  f" {s['via_switch']} through {args.attacker}'s switch, {s['direct']} onto"
                  f" {args.target}'s link) while {len(out['rows'])} all-reduce sizes ran,"
                  f" {wrong} elements wrong")  # fmt: skip
            reasons = out["switch_reasons"].items()
            print("  switches, by reason: "
                  + ", ".join(f"{k.removeprefix('drop_')} {v}" for k, v in reasons))  # fmt: skip
            sc = out["switch_conservation"]
            print(f"  switch conservation: {sc['rx_frames']} read, {sc['accounted']} accounted,"
                  f" difference {sc['difference']}")  # fmt: skip
            print("  endpoints, by fate: " + ", ".join(
                f"{k} {v}" for k, v in out["nic_fates"].items()))  # fmt: skip
            print(f"  endpoint balance: {len(out['nic_conservation']) - len(nic_bad)} of"
                  f" {len(out['nic_conservation'])} endpoints balance")  # fmt: skip
            for e in out["errors"]:
                print(f"  job failed: {e}")
            bad |= bool(wrong or nic_bad or sc["difference"] or out["errors"] or not out["rows"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
