"""Collective algorithms and the reference, without a network (ranks are threads)."""

import threading

import numpy as np
import pytest

from dataplane.model.catalog import (
    all_reduce_steps,
    broadcast_steps,
    bus_factor,
    canonical,
    groups_of,
    pick_all_reduce,
    pick_broadcast,
)
from dataplane.run import reference as ref
from dataplane.run.collectives import chain_slice_bytes, double_binary_tree
from dataplane.run.transport import TransportError
from dataplane.run.workload import Case
from tests.localtransport import run_ranks

CASES = [
    ("all-reduce", "ring"),
    ("all-reduce", "halving-doubling"),
    ("all-reduce", "hierarchical"),
    ("all-reduce", "tree"),
    ("all-reduce", "auto"),
    ("reduce-scatter", "ring"),
    ("all-gather", "ring"),
    ("all-to-all", "ring"),
    ("broadcast", "ring"),
    ("broadcast", "tree"),
    ("broadcast", "auto"),
]


def _wrong(world, collective, algo, count, dtype="float32", op="sum", uneven=False, root=0):
    def body(comm):
        case = Case(
            comm, collective, count, dtype=dtype, op=op, algo=algo, uneven=uneven, root=root, seed=7
        )
        case.fill()
        case.run()
        return case.wrong()

    return run_ranks(world, body, dtype)


@pytest.mark.parametrize("collective,algo", CASES)
@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("count", [1, 7, 1000, 2 * ref.PERIOD + 3])
def test_every_collective_is_exact(collective, algo, world, count):
    assert _wrong(world, collective, algo, count) == [0] * world


@pytest.mark.parametrize("dtype", list(ref.DTYPES))
@pytest.mark.parametrize("op", ref.OPS)
def test_types_and_operators(dtype, op):
    assert _wrong(6, "all-reduce", "halving-doubling", 4099, dtype, op) == [0] * 6
    assert _wrong(4, "reduce-scatter", "ring", 3 * ref.PERIOD + 5, dtype, op) == [0] * 4


def test_uneven_all_to_all_and_other_roots():
    assert _wrong(7, "all-to-all", "ring", 50_000, uneven=True) == [0] * 7
    assert _wrong(5, "broadcast", "ring", 300_001, root=3) == [0] * 5
    for world, root in ((5, 3), (6, 5), (19, 7)):  # 19: auto's tree
        for algo in ("tree", "auto"):
            assert _wrong(world, "broadcast", algo, 300_001, root=root) == [0] * world


def test_the_chain_pipelines_a_small_broadcast_in_slices():
    # 256 KiB crossed each hop of the chain whole; now in 8 slices of 32 KiB
    assert [chain_slice_bytes(n << 10) for n in (4, 256, 1024, 2048, 16384)] == [
        32 << 10,
        32 << 10,
        128 << 10,
        256 << 10,
        256 << 10,
    ]
    for count in (65_536, 65_536 * 4 + 3):  # 256 KiB, about 1 MiB: 8 slices
        assert _wrong(8, "broadcast", "ring", count, root=5) == [0] * 8


def _prepared_runs(world: int, collective: str, algo: str, runs: int, ops_max: int) -> list:
    """Each rank's elements wrong in runs runs of a case prepared ahead
    (as the timed runs are), the buffers filled afresh before each, and how
    many runs it built ahead."""
    bar = threading.Barrier(world, timeout=60)

    def body(comm):
        case = Case(comm, collective, 2 * ref.PERIOD + 3, algo=algo, seed=7)
        case.prepare(runs, ops_max)
        ahead = case.runs_prepared
        wrong = []
        for _ in range(runs):
            case.fill()
            bar.wait()
            case.run()
            wrong.append(case.wrong())
            bar.wait()
        return ahead, wrong

    return run_ranks(world, body)


@pytest.mark.parametrize("collective,algo", CASES)
@pytest.mark.parametrize("world", [1, 5])
def test_runs_built_ahead_give_the_same_bits(collective, algo, world):
    # prepared runs share their scratch arrays (the ring's staging), and
    # their copies happen when they run: each run, built before any ran,
    # still gives the reference
    assert _prepared_runs(world, collective, algo, 3, 1 << 20) == [(3, [0, 0, 0])] * world


def test_runs_built_ahead_stop_at_the_op_budget():
    # one run at least; the others are built when they run
    assert _prepared_runs(4, "all-reduce", "ring", 3, 1) == [(1, [0, 0, 0])] * 4


def test_large_buffers_are_pipelined_in_slices():
    # 4 MiB per rank: the ring cuts each chunk into slices; still exact.
    assert _wrong(4, "all-reduce", "ring", 1 << 20) == [0] * 4


def test_a_corrupted_result_is_counted():
    def body(comm):
        case = Case(comm, "all-reduce", 5000, seed=7)
        case.fill()
        case.run()
        if comm.rank == 1:
            case.recv[10:13] += 1
        return case.wrong()

    assert run_ranks(3, body) == [0, 3, 0]


def test_reference_values_are_exact_in_every_type():
    for dtype in ref.DTYPES:
        for world in (2, 64):
            per = ref.reduced("sum", ref.PERIOD * 3, dtype, 1, world)
            wide = np.stack([ref.pattern(r, ref.PERIOD * 3, dtype, 1, world) for r in range(world)])
            if dtype == "bfloat16":
                wide, per = ref.bf16_to_f32(wide), ref.bf16_to_f32(per)
            assert np.array_equal(wide.astype(np.float64).sum(axis=0), per.astype(np.float64))


def test_bfloat16_rounds_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, 3e38], dtype=np.float32)
    back = ref.bf16_to_f32(ref.f32_to_bf16(x))
    assert back.tolist() == [1.0, 1.0, 1.015625, -2.5, np.float32(back[4])]
    assert ref.f32_to_bf16(np.array([1.0], np.float32))[0] == 0x3F80


def test_bus_factors_are_nccl_tests():
    assert bus_factor("all-reduce", 8) == pytest.approx(1.75)
    assert bus_factor("allreduce", 4) == pytest.approx(1.5)
    for c in ("reduce-scatter", "all-gather", "all-to-all"):
        assert bus_factor(c, 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 16) == 1.0
    assert canonical("All_Gather") == "all-gather"
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        canonical("gather")


def test_uneven_all_to_all_with_some_pairs_above_the_rendezvous_size():
    # 512 KiB per rank over 8, skewed (seed 7): some ranks send one peer more
    # than the rendezvous size and others send nobody that much; both ends of
    # every pair must agree on whether it waits (a rank deciding for all its
    # peers at once deadlocked here).
    assert _wrong(8, "all-to-all", "ring", 131072, uneven=True) == [0] * 8


def test_in_network_all_reduce_needs_a_transport_that_offers_it():
    with pytest.raises(TransportError, match="needs the ethplus transport, not local"):
        _wrong(2, "all-reduce", "in-network", 10)
    with pytest.raises(ValueError, match="ring, halving-doubling, hierarchical, tree, in-network"):
        _wrong(2, "all-reduce", "butterfly", 10)


def test_check_all_counts_a_corruption_that_the_first_run_check_misses():
    """--check all (worker.checked_run): inputs refilled, every rank ready,
    one run, its check, for every run.  A transport that corrupts one byte
    of one message in the third run: the first run's check sees nothing,
    the checks of every run count the damage."""
    import threading

    from localtransport import Hub, LocalTransport

    from dataplane.run.collectives import Comm
    from dataplane.run.worker import checked_run
    from dataplane.run.workload import Case

    world, bad = 4, 2 * 2 * (4 - 1) * 4 + 5  # a send of the third run (ring: 6 per rank)
    hub = Hub(world)
    sent = [0]

    class Corrupting(LocalTransport):
        def _isend(self, peer, tag, view):
            with hub.cond:
                sent[0] += 1
                n = sent[0]
            if n == bad:
                view = bytearray(view)
                view[0] ^= 0xFF
            return super()._isend(peer, tag, view)

    gate = threading.Barrier(world)

    class Link:
        def barrier(self, name: str) -> None:
            gate.wait(20)

    out: list = [None] * world

    def one(r: int) -> None:
        case = Case(Comm(Corrupting(hub, r), "float32"), "all-reduce", 4096)
        case.fill()
        case.run()
        first = case.wrong()
        every = first + sum(checked_run(Link(), case, f"time-0-{k}")[0] for k in range(3))
        out[r] = (first, every)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(f for f, _ in out) == 0
    assert sum(e for _, e in out) > 0


def test_no_ring_slice_reaches_a_rank_before_it_has_posted_its_receives():
    """A NIC turns away a message no receive is posted for (receiver not
    ready; RoCE then resends all in flight behind it, go-back-N).  A rank
    whose left neighbour is far ahead gets a slice, reduces it and would
    pass the result on to a right neighbour that has not started yet: every
    ring slice waits for that neighbour's 'ready' word, not the first ones
    only.  Rank 2 starts late here; no message over the NIC's eager size
    may reach a rank before its receive."""
    import threading
    import time

    from localtransport import Hub, LocalTransport

    from dataplane.run.collectives import Comm

    world, count = 4, 1 << 20  # 1 MiB chunks: two slices a step
    hub = Hub(world)
    posted: set = set()
    unready: list = []

    class Strict(LocalTransport):
        def _irecv(self, peer, tag, view):
            with hub.cond:
                posted.add((peer, self.rank, tag))
            return super()._irecv(peer, tag, view)

        def _isend(self, peer, tag, view):
            with hub.cond:
                if len(view) > 64 and (self.rank, peer, tag) not in posted:
                    unready.append((self.rank, peer, tag))
            return super()._isend(peer, tag, view)

    out: list = [None] * world

    def one(r: int) -> None:
        buf = np.full(count, r + 1, np.float32)
        if r == 2:
            time.sleep(0.5)
        Comm(Strict(hub, r), "float32").all_reduce(buf)
        out[r] = buf

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(o is not None and (o == 10).all() for o in out)
    assert not unready, f"sent before the receiver posted (from, to, tag): {unready[:5]}"


@pytest.mark.parametrize("world", [4, 6, 9, 12, 20, 64])
@pytest.mark.parametrize("count", [5, 2 * ref.PERIOD + 3])
def test_the_hierarchical_all_reduce_is_exact_for_every_grouping(world, count):
    """Groups of 2, 2, 3, 3, 4 and 8 ranks; buffers shorter than the number of
    chunks too (empty chunks at every level)."""
    assert _wrong(world, "all-reduce", "hierarchical", count) == [0] * world


def test_groups_and_steps():
    assert [groups_of(n) for n in (2, 7, 8, 12, 64, 512)] == [1, 1, 2, 3, 8, 16]
    assert all_reduce_steps("ring", 512) == 1022
    assert all_reduce_steps("hierarchical", 512) == 2 * 15 + 2 * 31
    assert all_reduce_steps("hierarchical", 64) == 28
    assert all_reduce_steps("halving-doubling", 64) == 12
    assert all_reduce_steps("halving-doubling", 6) == 6  # 4, and a fold in and out


def test_auto_picks_by_rank_count_and_size_and_says_why():
    assert pick_all_reduce(8, 16 << 20)[0] == "ring"
    assert pick_all_reduce(8, 64 << 10)[0] == "halving-doubling"  # 8 KiB a step
    algo, why = pick_all_reduce(64, 16 << 20)
    assert algo == "halving-doubling"
    assert why == "12 steps, not the flat ring's 126, for the same bytes"
    assert pick_all_reduce(512, 256 << 10)[0] == "halving-doubling"
    algo, why = pick_all_reduce(48, 16 << 20)  # 48 is no power of two
    assert algo == "hierarchical" and why == "8 groups of 6: 24 steps, not the flat ring's 94"
    assert pick_all_reduce(24, 256 << 10)[0] == "tree"
    algo, why = pick_all_reduce(48, 1 << 20)  # up to 4 MiB a rank: the tree
    assert algo == "tree" and why == "10 steps deep, not the flat ring's 94, pipelined in chunks"
    assert pick_all_reduce(17, 64 << 20)[0] == "ring"  # prime: no groups, large: bandwidth
    assert pick_all_reduce(13, 256 << 10)[0] == "ring"  # prime: no groups
    assert pick_all_reduce(64, 1 << 20, in_network=True)[0] == "in-network"


def test_auto_broadcast_leaves_the_chain_for_the_trees_from_8_ranks():
    assert pick_broadcast(4) == ("ring", "a chain of 3 hops, pipelined")
    assert pick_broadcast(7)[0] == "ring" and pick_broadcast(8)[0] == "tree"
    assert pick_broadcast(64) == ("tree", "6 hops deep, not the chain's 63, pipelined in chunks")
    assert broadcast_steps("tree", 512) == 9 and broadcast_steps("ring", 512) == 511
    assert broadcast_steps("tree", 2) == broadcast_steps("ring", 2) == 1
    assert broadcast_steps("tree", 1) == broadcast_steps("ring", 1) == 0


def _path_up(parent: list, r: int) -> list[int]:
    path = [r]
    while parent[path[-1]] is not None:
        path.append(parent[path[-1]])
    return path


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 8, 63, 64, 512])
def test_the_double_binary_tree_spans_every_rank_twice_with_inner_ranks_apart(n):
    """Each tree reaches every rank once from its one root, no rank has more
    than two children, and a rank that forwards in one tree is a leaf of the
    other (at most one rank is inner in both when n is odd): the tree
    all-reduce's load is even."""
    inner = []
    for parent, children in double_binary_tree(n):
        roots = [r for r in range(n) if parent[r] is None]
        assert len(roots) == 1
        seen, todo = set(), list(roots)
        while todo:
            r = todo.pop()
            assert r not in seen and len(children[r]) <= 2
            seen.add(r)
            for c in children[r]:
                assert parent[c] == r
                todo.append(c)
        assert seen == set(range(n))
        inner.append({r for r in range(n) if children[r]})
        # a broadcast over n + 1 ranks: one hop to this tree's root, then down
        depth = max(len(_path_up(parent, r)) - 1 for r in range(n))
        assert broadcast_steps("tree", n + 1) == 1 + depth
    assert len(inner[0] & inner[1]) <= n % 2
    assert all_reduce_steps("tree", n) <= 2 * max(1, n).bit_length()


@pytest.mark.parametrize(
    "bad",
    [
        ([5, 4, 4, 4], [4, 4, 4, 4]),  # sends more than the buffer holds
        ([4, 4, 4, 4], [4, 4, -4, 12]),  # a negative count, the sum still right
        ([4, 4, 4], [4, 4, 4, 4]),  # a count short
        ([4.5, 4, 4, 3.5], [4, 4, 4, 4]),  # not whole elements
    ],
)
def test_a_refused_all_to_all_leaves_the_rank_in_step_with_its_peers(bad):
    """Rank 0's first all-to-all is refused (its arguments are wrong) while
    its peers wait in theirs; its corrected call then meets theirs, and
    every rank gets the right data."""
    world = 4

    def body(c):
        send = np.arange(16, dtype=np.float32) + 100 * c.rank
        recv = np.zeros(16, np.float32)
        if c.rank == 0:
            with pytest.raises(ValueError, match="all-to-all"):
                c.all_to_all(send, bad[0], recv, bad[1])
        c.all_to_all(send, [4] * world, recv, [4] * world)
        return recv

    got = run_ranks(world, body)
    for r, recv in enumerate(got):
        want = np.concatenate([np.arange(4 * r, 4 * r + 4) + 100 * s for s in range(world)])
        assert np.array_equal(recv, want.astype(np.float32)), r


def test_a_refused_broadcast_or_send_draws_no_tag():
    def body(c):
        buf = np.full(8, c.rank, np.float32)
        if c.rank == 1:
            with pytest.raises(ValueError, match="root 7"):
                c.broadcast(buf, root=7)
            with pytest.raises(ValueError, match="tag"):
                c.isend(buf, 0, tag=1 << 20)
        c.broadcast(buf, root=0)
        if c.rank == 1:
            c.t.wait(c.isend(buf + 1, 0))
        elif c.rank == 0:
            got = np.zeros(8, np.float32)
            c.t.wait(c.irecv(got, 1))
            assert np.array_equal(got, np.ones(8, np.float32))
        return buf

    assert all(np.array_equal(b, np.zeros(8, np.float32)) for b in run_ranks(3, body))
