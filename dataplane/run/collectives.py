"""Collective algorithms on numpy buffers, over any transport.

Every algorithm posts all its receives before it sends anything (so no data
ever waits for a receive: the ETH+ NIC would answer receiver-not-ready), and
pipelines large chunks in slices: a slice is reduced and forwarded as soon as
it arrives, while the rest of its chunk is still on the wire, as NCCL's ring
does.  Chunks of a buffer that does not divide by the world size differ by
one element (reference.bounds).
"""

from __future__ import annotations

import functools

import numpy as np

from dataplane.model.catalog import ALGORITHMS, groups_of, pick_all_reduce, pick_broadcast
from dataplane.run.reference import bounds
from dataplane.run.schedule import Schedule
from dataplane.run.transport import Transport

SLICE_BYTES = 512 * 1024  # pipeline unit of the ring algorithms
MAX_SLICES = 16
# the broadcast chain's pipeline unit: the buffer in CHAIN_SLICES_MIN slices
# or more, each CHAIN_SLICE_MIN_BYTES to CHAIN_SLICE_BYTES (a 256 KiB
# broadcast in one slice crossed every hop whole)
CHAIN_SLICE_BYTES = 256 * 1024
CHAIN_SLICE_MIN_BYTES = 32 * 1024
CHAIN_SLICES_MIN = 8
TREE_CHUNK_BYTES = 32 * 1024  # pipeline unit of the tree all-reduce
MAX_TREE_CHUNKS = 64
RENDEZVOUS_BYTES = 256 * 1024  # all-to-all: from this size per peer, send when the peer is ready
_TAG_BITS = 12  # tags per collective call: 4096
_SEQ_MASK = 0x7FFFF  # collective calls' tags: bit 31 clear
P2P_TAG = 1 << 31  # point-to-point messages' tags: bit 31, the user's tag, a count
P2P_USER_TAGS = 256
_ONE = np.ones(1, np.uint8)  # a rendezvous' 'ready'


def _refuse_before_commit(call):
    """A collective that refuses its arguments leaves this rank as it found
    it: a call refused before its first message went out takes back the
    tags it drew, so this rank's next call matches its peers' (who may be
    waiting in theirs)."""

    @functools.wraps(call)
    def guarded(self, *args, **kwargs):
        seq, started = self._seq, self._started
        try:
            return call(self, *args, **kwargs)
        except (ValueError, TypeError):
            if self._started == started:
                self._seq = seq
            raise

    return guarded


def check_counts(counts, world: int, size: int, what: str) -> list[int]:
    """An all-to-all's counts, checked: one non-negative integer per rank,
    their sum within the buffer's size (ValueError naming what is wrong)."""
    try:
        out = [int(c) for c in counts]
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected {world} integers, got {counts!r}") from None
    if len(out) != world or any(c != x for c, x in zip(out, counts, strict=False)):
        raise ValueError(f"{what}: expected {world} integers, got {counts!r}")
    if min(out, default=0) < 0:
        raise ValueError(f"{what}: {min(out)} is negative")
    if sum(out) > size:
        raise ValueError(f"{what}: {sum(out)} elements in all, the buffer holds {size}")
    return out


def chain_slice_bytes(nbytes: int) -> int:
    """The broadcast chain's slice for a buffer of nbytes: CHAIN_SLICES_MIN
    of them at least, each CHAIN_SLICE_MIN_BYTES to CHAIN_SLICE_BYTES."""
    return min(CHAIN_SLICE_BYTES, max(CHAIN_SLICE_MIN_BYTES, nbytes // CHAIN_SLICES_MIN))


class Comm:
    """The ranks of one job, joined by a transport."""

    def __init__(self, transport: Transport, dtype: str = "float32"):
        self.t = transport
        self.rank, self.world = transport.rank, transport.world
        self.dtype = dtype
        self._seq = 0
        self._started = 0  # schedules handed to the transport (the guard's 'committed')
        self._p2p: dict[tuple[int, int, int], int] = {}  # (direction, peer, tag) -> messages
        # prepare(): the steps of the call being built (None: run them now),
        # its schedules' ops, and the scratch arrays the prepared runs share
        self._collect: list | None = None
        self._collect_ops = 0
        self._scratch: list[np.ndarray] = []
        self._scratch_used = 0

    # -- prepared runs
    def prepare(self, call, runs: int, ops_max: int) -> list[list]:
        """What `runs` calls of call() would do, built now and run by none:
        each call's schedules (compiled for the transport's engine,
        Transport.compile) and in-network all-reduces, as a list of steps
        for run_prepared, in call order, so that starting one later costs no
        Python.  Stops once they hold ops_max schedule ops (one run at
        least).  The runs share their scratch arrays, so they run one after
        another, each to its end, as collective calls do."""
        out: list[list] = []
        self._scratch, self._collect_ops = [], 0
        try:
            while len(out) < runs and (not out or self._collect_ops < ops_max):
                self._collect, self._scratch_used = [], 0
                call()
                out.append(self._collect)
        finally:
            self._collect, self._scratch = None, []
        return out

    @staticmethod
    def run_prepared(steps: list) -> None:
        """Run one call that prepare() built; return once it is done."""
        for step in steps:
            step()

    def _do(self, step) -> None:
        """Run step() now, or keep it while preparing."""
        if self._collect is None:
            self._started += 1
            step()
        else:
            self._collect.append(step)

    def _scratch_like(self, a: np.ndarray) -> np.ndarray:
        """An array shaped as a, for data on its way: a new one, or while
        preparing, the call's next of the scratch the prepared runs share."""
        if self._collect is None:
            return np.empty_like(a)
        i, pool = self._scratch_used, self._scratch
        self._scratch_used += 1
        if i == len(pool):
            pool.append(np.empty_like(a))
        elif pool[i].shape != a.shape or pool[i].dtype != a.dtype:
            pool[i] = np.empty_like(a)
        return pool[i]

    # -- point to point
    def _p2p_tag(self, direction: int, peer: int, tag: int) -> int:
        """The n-th message of this direction with peer and tag: a sender and
        its receiver count alike, so sends match receives in order (as MPI's
        do), never a collective's messages."""
        if not 0 <= tag < P2P_USER_TAGS:
            raise ValueError(f"point-to-point tag {tag}: expected 0 to {P2P_USER_TAGS - 1}")
        if not 0 <= peer < self.world or peer == self.rank:
            raise ValueError(f"peer {peer}: expected another rank of 0 to {self.world - 1}")
        n = self._p2p.get((direction, peer, tag), 0)
        return P2P_TAG | tag << 23 | (n & 0x7FFFFF)

    def _p2p_post(self, direction: int, peer: int, tag: int, post) -> object:
        """post(wire tag): counted once the transport took it (a refused
        message does not shift the count its peer's side keeps)."""
        handle = post(self._p2p_tag(direction, peer, tag))
        self._p2p[direction, peer, tag] = self._p2p.get((direction, peer, tag), 0) + 1
        return handle

    def isend(self, buf: np.ndarray, peer: int, tag: int = 0) -> object:
        """Start sending buf to peer (wait on the handle with self.t)."""
        return self._p2p_post(0, peer, tag, lambda t: self.t.isend(peer, t, buf))

    def irecv(self, buf: np.ndarray, peer: int, tag: int = 0) -> object:
        """Start receiving peer's next message of this tag into buf."""
        return self._p2p_post(1, peer, tag, lambda t: self.t.irecv(peer, t, buf))

    # -- helpers
    def _tags(self, needed: int):
        if needed > 1 << _TAG_BITS:
            raise ValueError(f"a collective needing {needed} messages per peer is too large")
        base = (self._seq & _SEQ_MASK) << _TAG_BITS
        self._seq += 1
        return lambda i: base | i

    def _slices(self, nbytes: int, unit: int = SLICE_BYTES, most: int = MAX_SLICES) -> int:
        return max(1, min(most, nbytes // unit))

    def _ring(self, steps: int, slices: int, send_of, recv_of, reduce_of=None, members=None,
              op: str = "sum") -> None:  # fmt: skip
        """A pipelined ring over members (every rank, in rank order, by
        default): at step t send send_of(t) right, receive recv_of(t) from
        the left.  Slice j of step t+1's send leaves once slice j of step
        t's receive is in and, where reduce_of(t) gives (dst, src) (arrays
        as long as recv_of(t)), dst = dst op src has run on that slice, so
        send_of(t+1) may be (or be computed from) recv_of(t).  A transport
        with an engine runs the whole schedule itself (Transport.run): no
        return to Python per step."""
        tag = self._tags(steps * slices + 1)
        members = range(self.world) if members is None else members
        i, n = members.index(self.rank), len(members)
        left, right = members[(i - 1) % n], members[(i + 1) % n]

        def cut(a):
            b = bounds(len(a), slices)
            return [(b[j], b[j + 1]) for j in range(slices)]

        # Rendezvous, as all_to_all's: a big first chunk leaves once the
        # right neighbour says its receives are posted.  A rank still busy
        # with the last collective would otherwise turn the data away (RNR),
        # and RoCE's go-back-N resends all that was in flight behind it: how
        # often depends on the workers' real CPU time, so on k.  Both ends
        # judge by the same chunk (what r sends at step 0, r+1 receives).
        wait_ready = send_of(0).nbytes >= RENDEZVOUS_BYTES
        tell_ready = recv_of(0).nbytes >= RENDEZVOUS_BYTES
        plan = []
        for st in range(steps):
            dst, src = reduce_of(st) if reduce_of else (None, None)
            recv, send = recv_of(st), send_of(st)
            for (lo, hi), (slo, shi) in zip(cut(recv), cut(send), strict=True):
                red = (dst[lo:hi], src[lo:hi]) if dst is not None else (None, None)
                plan.append((recv[lo:hi], send[slo:shi], *red))
        last_tag = tag(steps * slices)
        s = Schedule(self.dtype, op)
        ready = self._ready_from(s, right, last_tag) if wait_ready else None
        recvs = [s.recv(left, tag(k), e[0]) for k, e in enumerate(plan)]
        if tell_ready:
            self._tell_ready(s, left, last_tag)
        for j in range(slices):
            s.send(right, tag(j), plan[j][1], after=[ready])
        for k, (_, _, dst, src) in enumerate(plan):
            done = recvs[k] if dst is None else s.reduce(dst, src, after=[recvs[k]])
            if k + slices < len(plan):
                # after the 'ready' too: a left neighbour far ahead may hand
                # us a slice before the right one has posted its receives
                # (seen: RoCE's RNR, then go-back-N, at a small k)
                s.send(right, tag(k + slices), plan[k + slices][1], after=[done, ready])
        self._run(s)

    def _run(self, s: Schedule) -> None:
        """Hand the whole schedule to the transport's engine, or run it from
        Python where the transport has none; return once it is done (while
        preparing: compile it, and keep it to run later)."""
        if self._collect is None:
            self._run_now(s, None)
            return
        self._collect_ops += len(s)
        compiled = self.t.compile(s)
        self._collect.append(lambda: self._run_now(s, compiled))

    def _run_now(self, s: Schedule, compiled: object | None) -> None:
        self._started += 1
        h = self.t.run(s) if compiled is None else self.t.run_compiled(compiled)
        if h is None:
            s.run_with(self.t)
        else:
            self.t.wait(h)

    def _rendezvous(self, nbytes: int) -> bool:
        """Whether a message of nbytes waits for its receiver's 'ready'."""
        return nbytes >= RENDEZVOUS_BYTES

    @staticmethod
    def _ready_from(s: Schedule, peer: int, tag: int) -> int:
        """The receive of peer's word that its receives are posted."""
        return s.recv(peer, tag, np.zeros(1, np.uint8))

    @staticmethod
    def _tell_ready(s: Schedule, peer: int, tag: int, after=()) -> int:
        """Tell peer, which sends to us, that our receives are posted."""
        return s.send(peer, tag, _ONE, after=after)

    # -- collectives
    @_refuse_before_commit
    def all_reduce(self, buf: np.ndarray, op: str = "sum", algo: str = "ring") -> None:
        """In place: every rank ends with the reduction of every rank's buf.
        algo auto: catalog.pick_all_reduce's choice for this size (every
        rank makes the same)."""
        if self.world == 1 or buf.size == 0:
            return
        if algo == "auto":
            algo = pick_all_reduce(self.world, buf.nbytes)[0]
        if algo == "ring":
            self._ring_all_reduce(buf, op)
        elif algo == "halving-doubling":
            self._hd_all_reduce(buf, op)
        elif algo == "hierarchical":
            self._hier_all_reduce(buf, op)
        elif algo == "tree":
            self._tree_all_reduce(buf, op)
        elif algo == "in-network":
            self._do(lambda: self.t.all_reduce_in_network(buf, op, self.dtype))
        else:
            raise ValueError(
                f"unknown all-reduce algorithm {algo!r} ({', '.join(ALGORITHMS['all-reduce'])})"
            )

    def _ring_all_reduce(
        self, buf: np.ndarray, op: str, members=None, scatter: bool = True, gather: bool = True
    ) -> None:
        """The ring all-reduce over members (every rank by default), or one of
        its halves: the reduce-scatter (after which member i holds chunk i+1,
        reduced over members) or the all-gather (which starts from that)."""
        members = range(self.world) if members is None else members
        n, r = len(members), members.index(self.rank)
        if n == 1:
            return
        b = bounds(buf.size, n)

        def chunk(c: int) -> np.ndarray:
            return buf[b[c] : b[c + 1]]

        # Steps 0..n-2 reduce-scatter, n-1..2n-3 all-gather; at step s a rank
        # sends chunk r-s and receives chunk r-s-1 (mod n).
        first = 0 if scatter else n - 1
        last = 2 * (n - 1) if gather else n - 1
        staging = {s: self._scratch_like(chunk((r - s - 1) % n)) for s in range(first, n - 1)}

        def recv_of(s: int) -> np.ndarray:
            s += first
            return staging[s] if s < n - 1 else chunk((r - s - 1) % n)

        def reduce_of(s: int):
            s += first
            return (chunk((r - s - 1) % n), staging[s]) if s < n - 1 else (None, None)

        slices = self._slices(buf.nbytes // n)
        self._ring(
            last - first,
            slices,
            lambda s: chunk((r - s - first) % n),
            recv_of,
            reduce_of,
            members,
            op,
        )

    def _hier_all_reduce(self, buf: np.ndarray, op: str) -> None:
        """Hierarchical (2D) all-reduce: ranks in groups of g consecutive
        ones (catalog.groups_of): a ring reduce-scatter inside each group,
        then a ring all-reduce of each rank's reduced chunk across the groups
        (among the ranks at the same place in theirs), then a ring all-gather
        inside the group.  2(g-1) + 2(n/g-1) steps instead of 2(n-1), the
        same bytes per rank as the flat ring."""
        n, r = self.world, self.rank
        g = groups_of(n)
        first, place = r - r % g, r % g
        group = list(range(first, first + g))
        across = list(range(place, n, g))
        b = bounds(buf.size, g)
        mine = (place + 1) % g  # the chunk a group's reduce-scatter leaves here
        self._ring_all_reduce(buf, op, group, gather=False)
        self._ring_all_reduce(buf[b[mine] : b[mine + 1]], op, across)
        self._ring_all_reduce(buf, op, group, scatter=False)

    def _hd_all_reduce(self, buf: np.ndarray, op: str) -> None:
        """Recursive halving (reduce-scatter) then doubling (all-gather), as
        Rabenseifner; ranks beyond the largest power of two p first fold their
        data into a partner below p and get the result back at the end.  One
        message a level: every rank then talks to one partner at a time (cut
        into pieces that run ahead into the next level, a rank sent to two
        partners at once, and erack-64x8's 16 MiB fell from 0.84 of the ideal
        busbw to 0.60)."""
        n, r = self.world, self.rank
        p = 1 << (n.bit_length() - 1)
        levels = p.bit_length() - 1
        # tags: 0 the fold-in, 1 + i level i's halving, 1 + levels + i its
        # doubling, then the result, then each level's and the extra's 'ready'
        ready_tag = 2 * levels + 2
        tag = self._tags(ready_tag + levels + 2)
        s = Schedule(self.dtype, op)
        # Rendezvous, as the ring's: a message of RENDEZVOUS_BYTES or more
        # leaves once its receiver said its receives are posted (a rank
        # still busy with the last collective would turn it away).  Both
        # ends judge by the same nominal size.
        big = self._rendezvous(buf.nbytes)
        if r >= p:
            ready = self._ready_from(s, r - p, tag(ready_tag + levels)) if big else None
            sent = s.send(r - p, tag(0), buf, after=[ready])
            s.recv(r - p, tag(2 * levels + 1), buf, after=[sent])
            if big:
                self._tell_ready(s, r - p, tag(ready_tag + levels + 1), after=[sent])
            self._run(s)
            return
        b = bounds(buf.size, p)
        # Plan the halving: at level i the partner is r ^ d; keep one half.
        plan = []
        lo, hi = 0, p
        d = p // 2
        while d:
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if r & d == 0 else ((mid, hi), (lo, mid))
            plan.append((r ^ d, keep, give))
            lo, hi = keep
            d //= 2

        def region(span: tuple[int, int]) -> np.ndarray:
            return buf[b[span[0]] : b[span[1]]]

        # Every receive first, in the order they complete (the doubling's
        # from the last level back), then the word that they are posted.
        # writer[c]: the op that last wrote chunk c; a region is sent once
        # every chunk in it is written.
        extra = r + p if r + p < n else None
        ready = [
            self._ready_from(s, peer, tag(ready_tag + i))
            if self._rendezvous(buf.nbytes >> (i + 1)) else None
            for i, (peer, _, _) in enumerate(plan)
        ]  # fmt: skip
        told = None  # the extra rank's word that its result's receive is posted
        if extra is not None and big:
            told = self._ready_from(s, extra, tag(ready_tag + levels + 1))
        pre = self._scratch_like(buf) if extra is not None else None
        got_pre = s.recv(extra, tag(0), pre) if extra is not None else None
        staging = [self._scratch_like(region(keep)) for _, keep, _ in plan]
        got_rs = [s.recv(peer, tag(1 + i), staging[i]) for i, (peer, _, _) in enumerate(plan)]
        got_ag = {
            i: s.recv(plan[i][0], tag(1 + levels + i), region(plan[i][2]))
            for i in reversed(range(levels))
        }
        for i, (peer, _, _) in enumerate(plan):
            if ready[i] is not None:
                self._tell_ready(s, peer, tag(ready_tag + i))
        if extra is not None and big:
            self._tell_ready(s, extra, tag(ready_tag + levels))
        folded = s.reduce(buf, pre, after=[got_pre]) if extra is not None else None
        writer: list[int | None] = [folded] * p

        def written(span: tuple[int, int]) -> list[int | None]:
            return sorted({w for w in writer[span[0] : span[1]] if w is not None})

        for i, (peer, keep, give) in enumerate(plan):
            s.send(peer, tag(1 + i), region(give), after=[ready[i], *written(give)])
            red = s.reduce(region(keep), staging[i], after=[got_rs[i], *written(keep)])
            writer[keep[0] : keep[1]] = [red] * (keep[1] - keep[0])
        for i in reversed(range(levels)):
            peer, keep, give = plan[i]
            s.send(peer, tag(1 + levels + i), region(keep), after=written(keep))
            writer[give[0] : give[1]] = [got_ag[i]] * (give[1] - give[0])
        if extra is not None:
            s.send(extra, tag(2 * levels + 1), buf, after=[told, *written((0, p))])
        self._run(s)

    def _tree_all_reduce(self, buf: np.ndarray, op: str) -> None:
        """The double binary tree all-reduce (as NCCL's tree algorithm): half
        the buffer is reduced up one binary tree and broadcast back down it,
        the other half over a second tree in which the first one's leaves
        are the inner ranks, so every rank sends and receives about as much
        as the others.  Each half goes in chunks, pipelined: a chunk climbs
        while the one before it comes down.  2 log2(n) steps deep, whatever
        the size; each rank sends about the whole buffer once up and once
        down (twice the ring's bytes per rank at large n)."""
        n = self.world
        halves = bounds(buf.size, 2)
        trees = double_binary_tree(n)
        chunks = [
            self._slices((halves[t + 1] - halves[t]) * buf.itemsize, TREE_CHUNK_BYTES,
                         MAX_TREE_CHUNKS)
            for t in range(2)
        ]  # fmt: skip
        # tags per tree: chunk k's climb (k) and descent (chunks + k), then
        # the climb's and the descent's 'ready'
        base = [0, 2 * chunks[0] + 2]
        tag = self._tags(base[1] + 2 * chunks[1] + 2)
        s = Schedule(self.dtype, op)
        for t, (parent, children) in enumerate(trees):
            half = buf[halves[t] : halves[t + 1]]
            if half.size == 0:
                continue
            up, down = parent[self.rank], children[self.rank]
            cb = bounds(half.size, chunks[t])
            parts = [half[cb[k] : cb[k + 1]] for k in range(chunks[t])]

            def tg(i: int, t=t) -> int:
                return tag(base[t] + i)

            ready_up, ready_down = 2 * chunks[t], 2 * chunks[t] + 1
            # Rendezvous, as the ring's, by the half (both ends know it): a
            # rank still in its last collective would turn a chunk away
            big = self._rendezvous(half.nbytes)
            staging = {c: [self._scratch_like(p) for p in parts] for c in down}
            got_up = {c: [s.recv(c, tg(k), staging[c][k]) for k in range(chunks[t])]
                      for c in down}  # fmt: skip
            got_down = [s.recv(up, tg(chunks[t] + k), parts[k]) for k in range(chunks[t])] \
                if up is not None else None  # fmt: skip
            if big:  # our receives are posted: the children may climb, the parent descend
                for c in down:
                    self._tell_ready(s, c, tg(ready_up))
                if up is not None:
                    self._tell_ready(s, up, tg(ready_down))
            parent_ready = self._ready_from(s, up, tg(ready_up)) if big and up is not None else None
            child_ready = {c: self._ready_from(s, c, tg(ready_down)) if big else None
                           for c in down}  # fmt: skip
            for k, part in enumerate(parts):
                reduced = None
                for c in down:
                    reduced = s.reduce(part, staging[c][k], after=[got_up[c][k], reduced])
                if up is not None:
                    # the result lands in part once the parent has it all, so
                    # only after this climb has been received: nothing to wait for
                    s.send(up, tg(k), part, after=[reduced, parent_ready])
                    reduced = got_down[k]
                for c in down:
                    s.send(c, tg(chunks[t] + k), part, after=[reduced, child_ready[c]])
        self._run(s)

    @_refuse_before_commit
    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: str = "sum") -> None:
        """Rank r gets chunk r (reference.bounds) of the reduction of every send."""
        n, r = self.world, self.rank
        b = bounds(send.size, n)
        if recv.size != b[r + 1] - b[r]:
            raise ValueError(f"reduce-scatter: rank {r} needs a {b[r + 1] - b[r]}-element output")
        self._do(lambda: np.copyto(recv, send[b[r] : b[r + 1]]))
        if n == 1 or send.size == 0:
            return

        def chunk(c: int) -> np.ndarray:
            return send[b[c] : b[c + 1]]

        # At step s a rank sends the partial sum of chunk r-s-1 and receives
        # chunk r-s-2; the last receive is its own chunk.
        partial = [self._scratch_like(chunk((r - s - 2) % n)) for s in range(n - 2)] + [recv]

        def send_of(s: int) -> np.ndarray:
            return chunk((r - 1) % n) if s == 0 else partial[s - 1]

        def reduce_of(s: int):
            return partial[s], chunk((r - s - 2) % n)

        self._ring(n - 1, self._slices(send.nbytes // n), send_of, lambda s: partial[s], reduce_of,
                   op=op)  # fmt: skip

    @_refuse_before_commit
    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> None:
        """recv is every rank's send, concatenated in rank order (chunks of
        reference.bounds(recv.size, world))."""
        n, r = self.world, self.rank
        b = bounds(recv.size, n)
        if send.size != b[r + 1] - b[r]:
            raise ValueError(f"all-gather: rank {r} must contribute {b[r + 1] - b[r]} elements")
        self._do(lambda: np.copyto(recv[b[r] : b[r + 1]], send))
        if n == 1 or recv.size == 0:
            return

        def chunk(c: int) -> np.ndarray:
            return recv[b[c] : b[c + 1]]

        self._ring(
            n - 1,
            self._slices(recv.nbytes // n),
            lambda s: chunk((r - s) % n),
            lambda s: chunk((r - s - 1) % n),
        )

    @_refuse_before_commit
    def all_to_all(self, send: np.ndarray, send_counts, recv: np.ndarray, recv_counts) -> None:
        """Rank r sends send_counts[d] elements to each rank d (in order, from
        send) and receives recv_counts[s] from each rank s (in order, into recv)."""
        n, r = self.world, self.rank
        send_counts = check_counts(send_counts, n, send.size, "all-to-all's send counts")
        recv_counts = check_counts(recv_counts, n, recv.size, "all-to-all's receive counts")
        if send_counts[r] != recv_counts[r]:
            raise ValueError(
                f"all-to-all: rank {r} sends itself {send_counts[r]} elements"
                f" and expects {recv_counts[r]}"
            )
        sd = np.concatenate([[0], np.cumsum(send_counts)]).astype(int)
        rd = np.concatenate([[0], np.cumsum(recv_counts)]).astype(int)
        tag = self._tags(2)
        s = Schedule(self.dtype)
        # Staggered order (r+1, r+2, ...): every receiver starts with a different sender.
        order = [(r + i) % n for i in range(1, n)]
        # Rendezvous for big messages: a rank tells each rank that will send
        # it RENDEZVOUS_BYTES or more that its receives are posted, and sends
        # such a message only once told so (a rank still busy with the last
        # collective would turn the data away).  Both ends judge a pair by the
        # same count, so they agree on it.
        item = send.itemsize
        ready = {
            d: self._ready_from(s, d, tag(1))
            for d in order
            if self._rendezvous(item * int(send_counts[d]))
        }
        for src in order:
            s.recv(src, tag(0), recv[rd[src] : rd[src + 1]])
        for src in order:
            if self._rendezvous(item * int(recv_counts[src])):
                self._tell_ready(s, src, tag(1))
        for d in order:
            s.send(d, tag(0), send[sd[d] : sd[d + 1]], after=[ready.get(d)])
        s.copy(recv[rd[r] : rd[r + 1]], send[sd[r] : sd[r + 1]])
        self._run(s)

    @_refuse_before_commit
    def broadcast(self, buf: np.ndarray, root: int = 0, algo: str = "ring") -> None:
        """Root's buf to every rank: down a pipelined chain root, root+1, ...
        (ring), or half down each of two binary trees (tree); auto:
        catalog.pick_broadcast's choice (every rank makes the same)."""
        n, r = self.world, self.rank
        if not 0 <= root < n:
            raise ValueError(f"broadcast: root {root} is not a rank (0 to {n - 1})")
        if n == 1 or buf.size == 0:
            return
        if algo == "auto":
            algo = pick_broadcast(n)[0]
        if algo == "tree":
            self._tree_broadcast(buf, root)
            return
        if algo != "ring":
            raise ValueError(f"unknown broadcast algorithm {algo!r}")
        slices = self._slices(buf.nbytes, chain_slice_bytes(buf.nbytes), (1 << _TAG_BITS) - 1)
        b = bounds(buf.size, slices)
        tag = self._tags(slices + 1)
        pos = (r - root) % n
        prev, nxt = (r - 1) % n, (r + 1) % n
        s = Schedule(self.dtype)
        # the rendezvous, as the ring's: a big buffer's slices leave once the
        # next rank said its receives are posted
        big = self._rendezvous(buf.nbytes)
        ready = self._ready_from(s, nxt, tag(slices)) if big and pos < n - 1 else None
        got = [s.recv(prev, tag(j), buf[b[j] : b[j + 1]]) if pos else None for j in range(slices)]
        if big and pos:
            self._tell_ready(s, prev, tag(slices))
        if pos < n - 1:
            for j in range(slices):
                s.send(nxt, tag(j), buf[b[j] : b[j + 1]], after=[got[j], ready])
        self._run(s)

    def _tree_broadcast(self, buf: np.ndarray, root: int) -> None:
        """Half of root's buf down each of two binary trees over the other
        ranks (double_binary_tree: a rank that forwards in one is a leaf of
        the other), the root the parent of both trees' roots; each half in
        chunks, pipelined.  log2(n) + 1 hops deep; the root sends the buffer
        once, and so does each rank that forwards (half to each of its two
        children, in its one tree), a leaf of both nothing."""
        n, r = self.world, self.rank

        # tree places 0..n-2 are the ranks after the root, in order
        def rank_at(place: int | None) -> int:
            return root if place is None else (root + 1 + place) % n

        me = None if r == root else (r - root - 1) % n
        halves = bounds(buf.size, 2)
        chunks = [
            self._slices((halves[t + 1] - halves[t]) * buf.itemsize, TREE_CHUNK_BYTES,
                         MAX_TREE_CHUNKS)
            for t in range(2)
        ]  # fmt: skip
        base = [0, chunks[0] + 1]  # per tree: its chunks, then its 'ready'
        tag = self._tags(base[1] + chunks[1] + 1)
        s = Schedule(self.dtype)
        for t, (parent, children) in enumerate(double_binary_tree(n - 1)):
            half = buf[halves[t] : halves[t + 1]]
            if half.size == 0:
                continue
            if me is None:  # the root: the parent of this tree's root
                up, down = None, [rank_at(parent.index(None))]
            else:
                up, down = rank_at(parent[me]), [rank_at(c) for c in children[me]]
            cb = bounds(half.size, chunks[t])
            parts = [half[cb[k] : cb[k + 1]] for k in range(chunks[t])]
            ready = base[t] + chunks[t]
            # the rendezvous, by the half (both ends know it), as the ring's
            big = self._rendezvous(half.nbytes)
            got = [s.recv(up, tag(base[t] + k), parts[k]) if up is not None else None
                   for k in range(chunks[t])]  # fmt: skip
            if big and up is not None:
                self._tell_ready(s, up, tag(ready))
            child_ready = {c: self._ready_from(s, c, tag(ready)) if big else None for c in down}
            for k, part in enumerate(parts):
                for c in down:
                    s.send(c, tag(base[t] + k), part, after=[got[k], child_ready[c]])
        self._run(s)


def _inorder_tree(lo: int, hi: int, parent: int | None, out_parent: list,
                  out_children: list) -> int:  # fmt: skip
    """The balanced binary tree over positions lo..hi-1 in order (its root
    the middle one), into out_parent and out_children; returns its root."""
    mid = (lo + hi) // 2
    out_parent[mid] = parent
    for a, b in ((lo, mid), (mid + 1, hi)):
        if a < b:
            out_children[mid].append(_inorder_tree(a, b, mid, out_parent, out_children))
    return mid


def double_binary_tree(n: int) -> list[tuple[list[int | None], list[list[int]]]]:
    """Two binary trees over ranks 0..n-1, each as (parent of each rank, or
    None at its root; children of each rank): the first a balanced tree over
    the ranks in order, the second the same shape with the first one's
    leaves put at its inner places (in order, then its inner ranks at its
    leaves), so a rank that forwards in one tree is a leaf in the other
    (wherever the leaves are as many as the inner ranks)."""
    parent: list[int | None] = [None] * n
    children: list[list[int]] = [[] for _ in range(n)]
    if n:
        _inorder_tree(0, n, None, parent, children)
    inner = [r for r in range(n) if children[r]]
    leaves = [r for r in range(n) if not children[r]]
    # the second tree: the rank at each of the first's places
    at = [0] * n
    for place, rank in zip(inner + leaves, leaves + inner, strict=True):
        at[place] = rank
    parent2: list[int | None] = [None] * n
    children2: list[list[int]] = [[] for _ in range(n)]
    for place in range(n):
        if parent[place] is not None:
            parent2[at[place]] = at[parent[place]]
        children2[at[place]] = [at[c] for c in children[place]]
    return [(parent, children), (parent2, children2)]
