#!/usr/bin/env python3
"""The NIC engine's own cost, in one run: CPU seconds (the whole process:
both engines' threads and the in-memory fabric's) per GB of one 64 MiB
message between two endpoints of an in-memory fabric (no lab, no root, no
kernel frame path).  With --base DIR (another checkout, its C core built
in place: `python setup.py build_ext --inplace` there), the same transfer
on that build and on this one, in turns, and the ratio of their medians:
the A/B for a change to the engine's hot path.

    python3 scripts/bench_engine.py [--base DIR] [--rounds 3] [--size-mib 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

_ONE = """
import sys, time, statistics
sys.path.insert(0, sys.argv[1])
import numpy as np
import dataplane
assert dataplane.__file__.startswith(sys.argv[1]), dataplane.__file__
from dataplane.lab.memfabric import FabricSpec, MemFabric
size = int(sys.argv[2]) << 20
with MemFabric(FabricSpec(endpoints=2)) as fab:
    eps = {r: fab.endpoint(r) for r in range(2)}
    src, dst = np.ones(size, np.uint8), np.zeros(size, np.uint8)
    out = []
    for i in range(6):  # the first one warms the pages and the peers up
        c0 = time.process_time()
        hr, hs = eps[1].post_recv(0, 10 + i, dst), eps[0].post_send(1, 10 + i, src)
        assert eps[0].wait(hs, 300) == size and eps[1].wait(hr, 300) == size
        out.append((time.process_time() - c0) / (size / 1e9))
    for ep in eps.values():
        ep.close()
print(statistics.median(out[1:]))
"""


def one(tree: str, size_mib: int) -> float:
    r = subprocess.run([sys.executable, "-c", _ONE, os.path.abspath(tree), str(size_mib)],
                       capture_output=True, text=True, check=True, cwd="/")  # fmt: skip
    return float(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="another checkout to compare with (its C core built in place)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size-mib", type=int, default=64)
    a = ap.parse_args()
    if a.rounds < 1 or a.size_mib < 1:
        ap.error("--rounds and --size-mib must be at least 1")
    trees = [("base", a.base), ("this", HERE)] if a.base else [("this", HERE)]
    got: dict[str, list[float]] = {name: [] for name, _ in trees}
    for r in range(a.rounds):
        for name, tree in trees:
            got[name].append(one(tree, a.size_mib))
            print(f"round {r + 1} {name}: {got[name][-1]:.3f} CPU s/GB", flush=True)
    for name, vals in got.items():
        print(f"{name}: median {statistics.median(vals):.3f} CPU s/GB")
    if a.base:
        ratio = statistics.median(got["this"]) / statistics.median(got["base"])
        print(f"this / base: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
