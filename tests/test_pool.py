"""The packet buffer pool, through cffi."""

import pytest

from dataplane.lab.core import Pool, ffi


def test_get_and_put_in_bursts():
    pool = Pool(64, 2048)
    assert pool.size == 64 and pool.available == 64
    pkts, got = pool.get(40)
    assert got == 40 and pool.available == 24
    addrs = {int(ffi.cast("uintptr_t", pkts[i].data)) for i in range(got)}
    assert len(addrs) == 40  # distinct buffers
    assert all(pkts[i].cap >= 2048 for i in range(got))
    more, got2 = pool.get(40)
    assert got2 == 24 and pool.available == 0  # never more than it has
    assert pool.put(pkts, got) == 40
    assert pool.put(more, got2) == 24
    assert pool.available == 64


def test_double_free_and_foreign_packets_refused():
    a, b = Pool(8), Pool(8)
    pkts, got = a.get(4)
    assert a.put(pkts, got) == 4
    assert a.put(pkts, got) == 0  # already returned
    assert b.put(pkts, got) == 0  # not b's
    assert a.available == 8 and b.available == 8


def test_buffers_are_cache_line_aligned():
    from dataplane.lab.core import ffi

    pool = Pool(16, 1500)
    pkts, got = pool.get(16)
    for i in range(got):
        assert int(ffi.cast("uintptr_t", pkts[i].data)) % 64 == 0
    pool.put(pkts, got)


def test_zero_sized_pool_rejected():
    with pytest.raises(MemoryError):
        Pool(0)


def test_small_buffers_go_to_frames_that_fit_and_come_back_to_their_own_stack():
    pool = Pool(4, 4096, small=(8, 1000))
    assert pool.size == 12 and pool.available == 12
    small = [pool.get_for(n) for n in (60, 1000, 64)]
    assert all(k is not None and k.cap == 1024 for k in small)  # 1000 rounded to cache lines
    big = pool.get_for(1025)
    assert big is not None and big.cap >= 4096  # too long for a small one
    held, got = pool.get(8)  # get() hands out full-size ones only
    assert got == 3 and all(held[i].cap >= 4096 for i in range(got))
    assert pool.get_for(2000) is None  # no full-size one left
    rest = [pool.get_for(60) for _ in range(5)]
    assert all(k is not None and k.cap == 1024 for k in rest)
    assert pool.get_for(60) is None  # small ones all taken, and no full-size one either
    arr = ffi.new("struct ethp_pkt *[]", [*small, *rest, big])
    assert pool.put(arr, len(arr)) == 9
    assert pool.put(arr, len(arr)) == 0  # already back
    assert pool.put(held, got) == 3
    # each came back to its own size: 8 small ones again, then full-size ones
    again = [pool.get_for(60) for _ in range(8)]
    assert all(k.cap == 1024 for k in again)
    assert pool.get_for(60).cap >= 4096


def test_a_small_class_larger_than_the_full_size_is_refused():
    with pytest.raises(MemoryError):
        Pool(4, 1024, small=(4, 2048))
