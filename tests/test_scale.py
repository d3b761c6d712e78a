"""The seed's flagship systems with jobs of all their ranks: ERack+ 64
(64 accelerators x 8 planes) and UPN 512 (512 accelerators x 4 planes),
ranks on rank hosts (as many worker processes as CPUs, the ranks threads
in them).  The full-size runs are `slow` (scripts/test --all); the suite
runs UPN 512 with a 64-rank job and ERack+ 64 with two all-reduces (a
64-rank uneven all-to-all over tcp alone took 5 minutes here)."""

import contextlib

import pytest
from labtools import module_lab

from dataplane.lab import registry
from dataplane.model import catalog
from dataplane.model.catalog import COLLECTIVES
from dataplane.run import bench, trials

pytestmark = pytest.mark.root
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

upn = module_lab("sc", "upn-512", name_only=True)
erack64 = module_lab("sc", "erack-64x8", name_only=True)


def _bench(lab: str, collective: str, size: int, nodes=None, **kw) -> dict:
    spec = bench.Spec(collective=collective, sizes=[size], iters=1, warmup=0, **kw)
    return bench.run(spec.validate(), registry.load_lab(lab), nodes=nodes)


def _exact(res: dict, world: int) -> None:
    assert res["world"] == world
    assert res["processes"] < world  # rank hosts, not a process per rank
    assert [r["wrong"] for r in res["rows"]] == [0]


def test_upn512_collectives_on_64_of_its_ranks(upn):
    nodes = [f"h{i}" for i in range(0, 512, 8)]  # spread over the switch's ports
    res = _bench(upn, "all-reduce", 256 * KiB, nodes, transport="ethplus", algo="in-network")
    _exact(res, 64)
    assert res["rows"][0]["algo"] == "in-network"
    # auto on a lab whose switches aggregate, over ethplus: the switches
    res = _bench(upn, "all-reduce", 256 * KiB, nodes, transport="ethplus", algo="auto")
    _exact(res, 64)
    assert res["rows"][0]["algo"] == "in-network"
    assert "the switches aggregate" in res["rows"][0]["algo_why"]
    # over roce the switches cannot: 64 ranks of 4 KiB a step, a power of two
    res = _bench(upn, "all-reduce", 256 * KiB, nodes, transport="roce", algo="auto")
    _exact(res, 64)
    assert res["rows"][0]["algo"] == "halving-doubling"
    res = _bench(upn, "all-to-all", 256 * KiB, nodes, transport="ethplus", uneven=True)
    _exact(res, 64)


@pytest.mark.slow
@pytest.mark.parametrize(
    "collective,algo,uneven",
    [("all-reduce", "in-network", False), ("all-reduce", "auto", False),
     ("all-to-all", "ring", True)],
)  # fmt: skip
def test_upn512_every_rank(upn, collective, algo, uneven):
    # The all-to-all at the lab's k, held: 256 ranks a process wait for the
    # CPU at any k, and a governor raising k for it stretched one run past
    # 20 minutes (it is checked for bytes here, not timed).
    hold = trials.held(registry.load_lab(upn)) if uneven else contextlib.nullcontext()
    with hold:
        res = _bench(upn, collective, 256 * KiB, transport="ethplus", algo=algo, uneven=uneven)
    _exact(res, 512)


@pytest.mark.slow
def test_upn512_memory_at_1_MiB_per_rank(upn):
    res = _bench(upn, "all-reduce", MiB, transport="ethplus", algo="in-network")
    _exact(res, 512)
    assert res["workers_peak_rss_bytes"] < 12 * GiB


def test_erack64_hierarchical_tree_and_auto_all_reduce(erack64):
    for algo in ("hierarchical", "tree"):
        res = _bench(erack64, "all-reduce", MiB + 4, transport="ethplus", algo=algo)
        _exact(res, 64)
        assert res["rows"][0]["algo"] == algo
    # (auto: erack-64x8's switches aggregate, so over ethplus they reduce)
    res = _bench(erack64, "all-reduce", MiB + 4, transport="ethplus", algo="auto")
    _exact(res, 64)
    assert res["rows"][0]["algo"] == "in-network"


@pytest.mark.slow
@pytest.mark.parametrize("transport_name", catalog.available())
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_erack64_every_collective_on_every_transport(erack64, transport_name, collective):
    algo = "hierarchical" if collective == "all-reduce" else "ring"
    res = _bench(erack64, collective, 256 * KiB + 4, transport=transport_name, algo=algo,
                 uneven=collective == "all-to-all", root=37)  # fmt: skip
    _exact(res, 64)
