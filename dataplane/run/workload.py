"""One collective at one size on one rank: its buffers, one run, and its check.

Sizes follow nccl-tests: ``size`` is the bytes of the largest buffer a rank
holds (all-reduce and broadcast: the buffer; reduce-scatter: the input;
all-gather: the output; all-to-all: what one rank sends), and
``count = size / element size``.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from dataplane.model.catalog import canonical
from dataplane.run import reference as ref
from dataplane.run.collectives import Comm

SENTINEL = 0x5A  # bytes a receive buffer holds before it is filled


class Case:
    def __init__(
        self,
        comm: Comm,
        collective: str,
        count: int,
        *,
        dtype: str = "float32",
        op: str = "sum",
        algo: str = "ring",
        root: int = 0,
        uneven: bool = False,
        seed: int = 1,
    ):
        self.comm, self.c = comm, canonical(collective)
        self.count, self.dtype, self.op, self.algo, self.root = count, dtype, op, algo, root
        self.seed = seed
        self._prepared: deque[list] = deque()  # runs built ahead (prepare)
        n, r = comm.world, comm.rank
        self.n, self.r = n, r
        st = ref.DTYPES[dtype][0]
        b = ref.bounds(count, n)
        self.b = b
        if self.c == "all-to-all":
            m = ref.uneven_counts(count, n, seed) if uneven else ref.even_counts(count, n)
            self.matrix = m
            self.send = np.empty(int(m[r].sum()), st)
            self.recv = np.empty(int(m[:, r].sum()), st)
        elif self.c == "reduce-scatter":
            self.send = np.empty(count, st)
            self.recv = np.empty(b[r + 1] - b[r], st)
        elif self.c == "all-gather":
            self.send = np.empty(b[r + 1] - b[r], st)
            self.recv = np.empty(count, st)
        else:  # all-reduce and broadcast work in place
            self.send = self.recv = np.empty(count, st)

    def fill(self) -> None:
        """Fresh inputs (and poisoned outputs, so stale data cannot pass)."""
        n, r, dt, seed = self.n, self.r, self.dtype, self.seed
        if self.recv is not self.send:
            self.recv.view(np.uint8).fill(SENTINEL)
        if self.c == "broadcast" and r != self.root:
            self.send.view(np.uint8).fill(SENTINEL)
        elif self.c == "all-gather":
            self.send[:] = ref.pattern(r, self.send.size, dt, seed, n, start=self.b[r])
        else:
            self.send[:] = ref.pattern(r, self.send.size, dt, seed, n)

    def prepare(self, runs: int, ops_max: int) -> None:
        """Build the next runs now (Comm.prepare: up to ops_max schedule ops,
        one run at least), so that run() only starts each: done before the
        barrier of the timed runs.  Built after it, 256 ranks of a rank host
        took turns at the GIL for their schedules and began upn-512's
        all-to-all seconds apart."""
        self._prepared.extend(self.comm.prepare(self._call, runs, ops_max))

    @property
    def runs_prepared(self) -> int:
        """Runs built ahead and not yet run."""
        return len(self._prepared)

    def run(self) -> None:
        if self._prepared:
            self.comm.run_prepared(self._prepared.popleft())
        else:
            self._call()

    def _call(self) -> None:
        cm = self.comm
        if self.c == "all-reduce":
            cm.all_reduce(self.send, self.op, self.algo)
        elif self.c == "reduce-scatter":
            cm.reduce_scatter(self.send, self.recv, self.op)
        elif self.c == "all-gather":
            cm.all_gather(self.send, self.recv)
        elif self.c == "all-to-all":
            cm.all_to_all(self.send, self.matrix[self.r], self.recv, self.matrix[:, self.r])
        else:
            cm.broadcast(self.send, self.root, self.algo)

    def expected(self) -> np.ndarray:
        n, r, dt, seed, b = self.n, self.r, self.dtype, self.seed, self.b
        if self.c == "all-reduce":
            return ref.reduced(self.op, self.count, dt, seed, n)
        if self.c == "reduce-scatter":
            return ref.reduced(self.op, b[r + 1] - b[r], dt, seed, n, start=b[r])
        if self.c == "all-gather":
            return np.concatenate(
                [ref.pattern(s, b[s + 1] - b[s], dt, seed, n, start=b[s]) for s in range(n)]
            )
        if self.c == "all-to-all":
            m = self.matrix
            starts = m[:, :r].sum(axis=1)  # where each sender's piece for r begins
            out = np.empty_like(self.recv)
            at = 0
            for s in range(n):
                k = int(m[s, r])
                out[at : at + k] = ref.pattern(s, k, dt, seed, n, start=int(starts[s]))
                at += k
            return out
        return ref.pattern(self.root, self.count, dt, seed, n)

    def wrong(self) -> int:
        """Elements of this rank's result that differ from the reference."""
        return ref.wrong(self.recv, self.expected())
