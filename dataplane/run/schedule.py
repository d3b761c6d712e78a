"""A collective's schedule on one rank: sends, receives, reductions and
copies, each starting once the ops it depends on have finished.

The collectives (collectives.Comm) build one and hand it to the transport
whole: a transport with an engine runs it there (Transport.run: the ETH+ and
RoCE NICs, ethp_nic_post_sched), with no return to Python per step; any
other runs it step by step from Python (Schedule.run_with, kernel TCP).
Both follow the same dependencies, so both give the same bits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from dataplane.run.reference import reduce_into

SEND, RECV, REDUCE, COPY = 0, 1, 2, 3  # ethp.h's ETHP_SCHED_*
# run_with: how long it waits for the message it expects next before it
# looks at the others (a schedule whose messages finish out of its order);
# doubled up to the most while nothing else finished either
_LOOK_AROUND_S, _LOOK_AROUND_MAX_S = 0.05, 1.0


class Messages(Protocol):
    """What run_with needs of a transport (transport.Transport has it)."""

    def isend(self, peer: int, tag: int, buf) -> object: ...
    def irecv(self, peer: int, tag: int, buf) -> object: ...
    def poll(self, handle: object, timeout_s: float = 0.0) -> bool: ...
    def waitall(self, handles) -> None: ...


class Schedule:
    """The ops of one collective call on one rank, in the order they are
    added (which is also the order ready ops start in).  Buffers are numpy
    arrays that must outlive the run; a reduction is dst = dst (op) src in
    dtype's arithmetic (reference.reduce_into)."""

    def __init__(self, dtype: str, op: str = "sum"):
        self.dtype, self.op = dtype, op
        self.kind: list[int] = []
        self.peer: list[int] = []
        self.tag: list[int] = []
        self.buf: list[np.ndarray] = []
        self.src: list[np.ndarray | None] = []
        self.succ: list[list[int]] = []  # the ops that wait for each
        self.n_deps: list[int] = []
        self.out_of_order = 0  # run_with: messages that finished before the one it waited for

    def __len__(self) -> int:
        return len(self.kind)

    def _add(self, kind: int, peer: int, tag: int, buf, src, after: Iterable[int | None]) -> int:
        i = len(self.kind)
        deps = 0
        for d in after:
            if d is not None:
                self.succ[d].append(i)
                deps += 1
        self.kind.append(kind)
        self.peer.append(peer)
        self.tag.append(tag)
        self.buf.append(buf)
        self.src.append(src)
        self.succ.append([])
        self.n_deps.append(deps)
        return i

    def send(self, peer: int, tag: int, buf: np.ndarray, after: Iterable[int | None] = ()) -> int:
        """Send buf to peer once the ops in after (None: none) are done."""
        return self._add(SEND, peer, tag, buf, None, after)

    def recv(self, peer: int, tag: int, buf: np.ndarray, after: Iterable[int | None] = ()) -> int:
        """Receive peer's message of this tag into buf (posted once after is done)."""
        return self._add(RECV, peer, tag, buf, None, after)

    def reduce(self, dst: np.ndarray, src: np.ndarray, after: Iterable[int | None] = ()) -> int:
        """dst = dst (op) src, once after is done."""
        if dst.shape != src.shape:
            raise ValueError(f"reduce: {dst.shape} against {src.shape}")
        return self._add(REDUCE, 0, 0, dst, src, after)

    def copy(self, dst: np.ndarray, src: np.ndarray, after: Iterable[int | None] = ()) -> int:
        """dst = src, once after is done."""
        if dst.nbytes != src.nbytes:
            raise ValueError(f"copy: {dst.nbytes} bytes against {src.nbytes}")
        return self._add(COPY, 0, 0, dst, src, after)

    def reduces(self) -> bool:
        return REDUCE in self.kind

    def with_peers(self, members: Sequence[int]) -> Schedule:
        """The same schedule with peer p of its sends and receives as members[p]."""
        s = Schedule(self.dtype, self.op)
        s.kind, s.tag, s.buf, s.src = self.kind, self.tag, self.buf, self.src
        s.succ, s.n_deps = self.succ, self.n_deps
        s.peer = [members[p] if k <= RECV else p for k, p in zip(self.kind, self.peer, strict=True)]
        return s

    def run_with(self, t: Messages) -> None:
        """Run every op from Python over t's sends and receives: start what
        is ready, wait for the oldest message something depends on (looking
        at the others now and then, so an order the schedule did not foresee
        cannot stall it), then for what is left."""
        left = list(self.n_deps)
        ready = deque(i for i, d in enumerate(left) if d == 0)
        needed: deque[int] = deque()  # posted messages that others wait for, oldest first
        rest: list = []  # posted messages nothing waits for
        handles: dict[int, object] = {}
        look_s = _LOOK_AROUND_S

        def finish(i: int) -> None:
            for j in self.succ[i]:
                left[j] -= 1
                if not left[j]:
                    ready.append(j)

        while True:
            while ready:
                i = ready.popleft()
                k = self.kind[i]
                if k == REDUCE:
                    reduce_into(self.buf[i], self.src[i], self.op, self.dtype)
                    finish(i)
                elif k == COPY:
                    memoryview(self.buf[i]).cast("B")[:] = memoryview(self.src[i]).cast("B")
                    finish(i)
                else:
                    post = t.isend if k == SEND else t.irecv
                    handles[i] = post(self.peer[i], self.tag[i], self.buf[i])
                    if self.succ[i]:
                        needed.append(i)
                    else:
                        rest.append(handles[i])
            if not needed:
                break
            if t.poll(handles[needed[0]], look_s):
                finish(needed.popleft())
                look_s = _LOOK_AROUND_S
                continue
            done = [i for i in needed if t.poll(handles[i], 0.0)]
            for i in done:
                needed.remove(i)
                finish(i)
            self.out_of_order += len(done)
            look_s = _LOOK_AROUND_S if done else min(2 * look_s, _LOOK_AROUND_MAX_S)
        t.waitall(rest)
