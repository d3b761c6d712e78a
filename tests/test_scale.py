"""The seed's flagship systems with jobs of all their ranks: ERack+ 64
(64 accelerators x 8 planes) and UPN 512 (512 accelerators x 4 planes),
ranks on rank hosts (as many worker processes as CPUs, the ranks threads
in them).  UPN 512's jobs of all 512 ranks run in the suite (about a
minute and a half in all); ERack+ 64's every collective over every
transport is `slow` (scripts/test --all: a 64-rank uneven all-to-all over
tcp alone took 5 minutes here), and the suite runs it with three
all-reduces; so is UPN 512's all-reduce over kernel TCP (42 s here, with the lab)."""

import contextlib
import re

import pytest
from labtools import module_lab

from dataplane.lab import nic, registry
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
    if algo == "auto":  # a lab whose switches aggregate, over ethplus: the switches
        assert res["rows"][0]["algo"] == "in-network"
        assert "the switches aggregate" in res["rows"][0]["algo_why"]
    # At this lab's k a base RTT is most of a real second: the NICs' rings
    # retire their blocks after 8-16 ms, not each ms (at 1 ms the 512 rings'
    # timers swamped both cores: this all-to-all took 8 minutes), and the
    # report says so.
    notes = " ".join(res["fidelity"]["not_time_scaled"])
    ring_ms = re.search(r"the NICs' (\d+) ms", notes)
    assert ring_ms and 8 <= int(ring_ms[1]) <= nic.RX_RING_TIMEOUT_MAX_MS, notes


def test_upn512_auto_over_roce_on_64_of_its_ranks(upn):
    # over roce the switches cannot aggregate: 64 ranks of 4 KiB a step, a
    # power of two
    nodes = [f"h{i}" for i in range(0, 512, 8)]  # spread over the switch's ports
    res = _bench(upn, "all-reduce", 256 * KiB, nodes, transport="roce", algo="auto")
    _exact(res, 64)
    assert res["rows"][0]["algo"] == "halving-doubling"


@pytest.mark.slow
def test_upn512_auto_over_kernel_tcp_every_rank(upn):
    # Every rank connects only to its halving-doubling
    # partners: 9 peers a rank, 4 streams each; connecting every pair at
    # start (2,044 sockets a rank) failed with "Too many open files".
    res = _bench(upn, "all-reduce", 256 * KiB, transport="tcp", algo="auto")
    _exact(res, 512)
    assert res["rows"][0]["algo"] == "halving-doubling"
    t = res["fidelity"]["kernel_tcp"]
    assert (t["tcp_peers"], t["tcp_streams"]) == (512 * 9, 512 * 9 * 4), t


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


def test_erack64_auto_broadcast_goes_down_the_two_trees(erack64):
    # 64 ranks: the trees, 6 hops deep (the chain's 63 took 7x as long at
    # this size); on a lab whose switches aggregate an all-reduce's auto,
    # not a broadcast's
    res = _bench(erack64, "broadcast", 256 * KiB + 4, transport="ethplus", algo="auto", root=37)
    _exact(res, 64)
    assert res["rows"][0]["algo"] == "tree"
    assert res["rows"][0]["algo_why"] == "6 hops deep, not the chain's 63, pipelined in chunks"


@pytest.mark.slow
@pytest.mark.parametrize("transport_name", catalog.available())
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_erack64_every_collective_on_every_transport(erack64, transport_name, collective):
    algo = "hierarchical" if collective == "all-reduce" else "ring"
    res = _bench(erack64, collective, 256 * KiB + 4, transport=transport_name, algo=algo,
                 uneven=collective == "all-to-all", root=37)  # fmt: skip
    _exact(res, 64)
