#!/usr/bin/env python3
"""What a NIC engine spends making a peer's state, in one run: N endpoints
of an in-memory fabric (no lab, no root) in one engine group's thread, as a
rank host runs its ranks; every endpoint sends a small message to every
other, twice.  The first exchange makes each endpoint's N - 1 peers (their
state is made on first use, as in a 512-rank all-to-all); the second finds
them made.  Printed: the engine thread's CPU per message in each, and the
first over the second (the cost of making a peer, against the same
messages' cost with the peer already there).

Before the exchanges every endpoint's counters are read once, as a job's
workers do before its timed runs.

    python3 scripts/bench_peers.py [--endpoints 256] [--bytes 512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dataplane.lab import cpu  # noqa: E402
from dataplane.lab.memfabric import FabricSpec, MemFabric  # noqa: E402
from dataplane.lab.nic import EngineGroup  # noqa: E402
from dataplane.run.schedule import Schedule  # noqa: E402


def exchange(eps: dict, nbytes: int, tag: int) -> float:
    """Every endpoint sends nbytes to every other (one schedule each, posted
    before any runs): the engine thread's CPU seconds (this process's frame
    threads: no switch runs here), byte-exact or an error."""
    n = len(eps)
    src = {r: np.full(nbytes, r % 251, np.uint8) for r in eps}
    dst = {r: np.zeros((n, nbytes), np.uint8) for r in eps}
    scheds = {}
    for r in eps:
        s = Schedule("uint8")
        for p in eps:
            if p != r:
                s.recv(p, tag, dst[r][p])
                s.send(p, tag, src[r])
        scheds[r] = s
    c0 = cpu.frame_threads_s(os.getpid())
    hs = {r: eps[r].post_sched(scheds[r]) for r in eps}
    for r, h in hs.items():
        if eps[r].wait(h, 600) is None:
            raise SystemExit(f"endpoint {r}: its exchange did not finish in 600 s")
    c1 = cpu.frame_threads_s(os.getpid())
    for r in eps:
        for p in eps:
            if p != r and not (dst[r][p] == p % 251).all():
                raise SystemExit(f"endpoint {r}: wrong bytes from {p}")
    return c1 - c0


def one_run(n: int, nbytes: int) -> tuple[float, float]:
    """(first exchange's engine CPU us per message, second's)."""
    group = EngineGroup()
    fab = MemFabric(FabricSpec(endpoints=n, planes=4, rate_bps=100_000_000_000))
    try:
        eps = {r: fab.endpoint(r, group=group) for r in range(n)}
        for e in eps.values():
            e.counters()
        msgs = n * (n - 1)
        first = exchange(eps, nbytes, 1)
        second = exchange(eps, nbytes, 2)
        return first / msgs * 1e6, second / msgs * 1e6
    finally:
        fab.close()
        group.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", type=int, default=256)
    ap.add_argument("--bytes", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if a.endpoints < 2 or a.bytes < 1 or a.repeat < 1:
        raise SystemExit("bench_peers: --endpoints 2 or more, --bytes and --repeat 1 or more")
    firsts, seconds = [], []
    for i in range(a.repeat):
        f, s = one_run(a.endpoints, a.bytes)
        firsts.append(f)
        seconds.append(s)
        print(f"run {i}: engine CPU a message: {f:.2f} us making peers, {s:.2f} us with them made")
    f, s = statistics.median(firsts), statistics.median(seconds)
    print(
        f"{a.endpoints} endpoints, {a.endpoints * (a.endpoints - 1)} messages of {a.bytes} B "
        f"an exchange; medians of {a.repeat}: {f:.2f} us a message making peers, {s:.2f} us "
        f"with them made: {f / s:.2f}x"
    )


if __name__ == "__main__":
    main()
