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
