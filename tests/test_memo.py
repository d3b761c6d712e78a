"""memo.once: a value many threads of a process ask for at once is computed once."""

from __future__ import annotations

import time

from conftest import together

from dataplane.memo import once
from dataplane.run import reference as ref


def test_many_threads_asking_at_once_compute_a_value_once():
    calls = []

    @once(maxsize=2)
    def costly(x: int) -> int:
        calls.append(x)
        time.sleep(0.05)
        return x * x

    assert together(16, lambda: costly(3)) == [9] * 16 and calls == [3]
    assert costly(4) == 16 and calls == [3, 4]


def test_a_rank_hosts_ranks_share_one_reference_reduction():
    """The all-reduce's reference for 64 ranks, asked by 64 threads at once
    (as a rank host's ranks check their results): one array, computed once,
    exact."""
    world, count = 64, 1000
    out = together(world, lambda: ref.reduced("sum", count, "float32", 11, world))
    want = sum(ref.pattern(r, count, "float32", 11, world).astype("float64") for r in range(world))
    assert all(ref.wrong(o, want.astype("float32")) == 0 for o in out)
    period = ref._reduced_period("sum", "float32", 11, world)
    assert period is ref._reduced_period("sum", "float32", 11, world)
