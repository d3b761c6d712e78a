#!/usr/bin/env python3
"""What a handshake's timeout does to kernel TCP at a large k: the same job
on the same lab, pinned at one k, with the lab's [tcp] syn_rto = "linux"
(Linux's fixed 1 s of real time before a SYN goes again) and "max" (the
kernel's largest RTO, through the lab's cgroup: cgroup.py), in turns.

Each run brings its own lab up from a copy of --lab with syn_rto set and
takes it down after (`ethplus bench ... --lab FILE --time-scale K`).  It
prints per run the real time, the row (nominal time, busbw, wrong), the
kernel's segments resent and retransmit timeouts in the connections'
set-up and in all, the frames the switches lost before reading them, and
the verdict; then each count's median with "max" over its median with
"linux", measured in the same session.

    sudo .venv/bin/python scripts/bench_syn_rto.py [--lab upn-512] [--k 409600]
        [--collective all-to-all] [--uneven] [--size 256K] [--ranks-per-host 32]
        [--tcp-streams 1] [--rounds 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from dataplane.model import library

SETTINGS = ("linux", "max")
COUNTS = ("tcp_setup_retx_segs", "tcp_setup_rtos", "tcp_retx_segs", "tcp_rtos")


def lab_file(src: str, syn_rto: str, name: str, out_dir: str) -> str:
    """A copy of lab file src named name, its [tcp] syn_rto set."""
    text = open(src).read()
    if "[tcp]" not in text:
        text += "\n[tcp]\n"
    text = text.replace("[tcp]", f'[tcp]\nsyn_rto = "{syn_rto}"', 1)
    text = text.replace("[lab]", f'[lab]\nname = "{name}"', 1)
    path = os.path.join(out_dir, f"{name}.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def one_run(args, syn_rto: str, n: int, out_dir: str) -> dict:
    name = f"syn{os.getpid() % 10000}{syn_rto[0]}{n}"
    src = library.find(args.lab)
    if src is None:
        sys.exit(f"bench_syn_rto: --lab {args.lab!r}: no such lab file ({library.looked_in()})")
    path = lab_file(str(src), syn_rto, name, out_dir)
    js = os.path.join(out_dir, f"{name}.json")
    cmd = [sys.executable, "-m", "cli.main", "bench", args.collective, "--lab", path,
           "--transport", "tcp", "--time-scale", str(args.k), "--sizes", args.size,
           "--iters", "1", "--warmup", "0", "--ranks-per-host", str(args.ranks_per_host),
           "--json", js]  # fmt: skip
    if args.tcp_streams:
        cmd += ["--tcp-streams", str(args.tcp_streams)]
    if args.uneven:
        cmd.append("--uneven")
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    real_s = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"bench_syn_rto: the {syn_rto} run failed: {r.stderr.strip()[-400:]}")
    d = json.load(open(js))
    row, tcp = d["rows"][0], d["fidelity"]["kernel_tcp"]
    return {
        "syn_rto": syn_rto,
        "real_s": real_s,
        "time_us": row["time_us"],
        "busbw_GBps": row["busbw_GBps"],
        "wrong": row["wrong"],
        "switch_ring_drops": (row.get("pacing") or {}).get("ring_drops", 0),
        "verdict": "behind" if row["fell_behind"] else "ok",
        **{c: tcp.get(c, 0) for c in COUNTS},
    }


def show(run: dict) -> None:
    print(
        f"{run['syn_rto']:>6}  {run['real_s']:7.1f} s  {run['time_us']:10.2f} us"
        f"  {run['busbw_GBps']:8.3f} GB/s  wrong {run['wrong']}"
        f"  set-up resent {run['tcp_setup_retx_segs']} (RTOs {run['tcp_setup_rtos']})"
        f"  all resent {run['tcp_retx_segs']} (RTOs {run['tcp_rtos']})"
        f"  switch lost {run['switch_ring_drops']}  {run['verdict']}",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", default="upn-512", help="a lab file, or a netns-labs/ name")
    ap.add_argument("--k", type=float, default=409600.0, help="the pinned time scale")
    ap.add_argument("--collective", default="all-to-all")
    ap.add_argument("--uneven", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--size", default="256K")
    ap.add_argument("--ranks-per-host", type=int, default=32)
    ap.add_argument("--tcp-streams", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1, help="runs of each setting, in turns")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    runs = []
    with tempfile.TemporaryDirectory(prefix="ethp-syn-") as out_dir:
        for n in range(args.rounds):
            order = SETTINGS if n % 2 == 0 else SETTINGS[::-1]
            for syn_rto in order:
                runs.append(one_run(args, syn_rto, n, out_dir))
                show(runs[-1])
    print(f"# max / linux, medians of {args.rounds} run(s) each, k {args.k:g}, same session:")
    for key in ("real_s", "time_us", "switch_ring_drops", *COUNTS):
        med = {s: statistics.median(r[key] for r in runs if r["syn_rto"] == s) for s in SETTINGS}
        ratio = f"{med['max'] / med['linux']:.3f}x" if med["linux"] else "-"
        print(f"#   {key:22} {med['linux']:>14g} -> {med['max']:>14g}  {ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
