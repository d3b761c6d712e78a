"""In-network all-reduce: the switches aggregate (agg.c), the NIC sends
contributions and places results (nic.c).  Results are checked bit for bit
against numpy; what crossed the links is checked against the kernel's
interface counters and the NICs' own, not only the switches'."""

import json
import re
import threading
import time

import pytest
from conftest import ethplus
from labtools import Lab, if_stats, module_lab, shipped_lab

from dataplane.lab import core, registry
from dataplane.model import labfile, library, routing
from dataplane.report import stats
from dataplane.run import bench
from dataplane.run.job import Job, JobError, Plan

MiB = 1 << 20
PAYLOAD = 4096  # bytes of one chunk (nic.PAYLOAD_BYTES)


# ---------------------------------------------------------------- no root


def _topology(name: str) -> dict:
    return labfile.load(name).topology.to_dict()


def _aggs(name: str, members: list[str]) -> list[tuple[str, set[int]]]:
    return [(s, set(p.values())) for s, p in routing.aggregators(_topology(name), members)]


def test_a_job_aggregates_at_the_switches_nearest_all_its_members():
    hosts = [f"h{i}" for i in range(8)]
    # single tier: every plane switch, each reached by its own plane
    assert _aggs("erack-8x4", hosts) == [(f"plane{i}", {i}) for i in range(4)]
    # a Clos: the spines; a job inside one leaf: that leaf alone
    assert [s for s, _ in _aggs("clos-16", ["h0", "h5", "h10", "h15"])] == [
        f"spine{i}" for i in range(4)
    ]
    assert _aggs("clos-16", ["h0", "h1", "h2", "h3"]) == [("leaf0", {0})]
    # dual plane: each plane's spines, through that plane's port
    hpn = _aggs("hpn-16", [f"h{i}" for i in range(16)])
    assert {s for s, _ in hpn} == {"spine0", "spine1", "spine2", "spine3"}
    assert all(len(planes) == 1 for _, planes in hpn)


def test_a_tree_has_the_leaves_with_two_or_more_members_inside():
    topo = _topology("clos-16")
    plan = routing.inc_plan(topo, ["h0", "h1", "h4", "h8", "h9", "h10"])
    assert [st.root for st in plan] == [f"spine{i}" for i in range(4)]
    st = plan[0]
    # leaf1 has one member: it sends to the root itself
    assert st.inner == {"leaf0": 1, "leaf2": 2} and st.root_members == 3
    assert st.hop["h4"] == ("spine0", 0, 3, 0)
    assert st.hop["h0"] == ("leaf0", 0, 2, 0) and st.hop["h10"] == ("leaf2", 0, 3, 2)
    flat = routing.inc_plan(topo, ["h0", "h1", "h4"], tree=False)
    assert all(not s.inner and s.root_members == 3 for s in flat)
    # single tier: no inner nodes
    assert all(not s.inner for s in routing.inc_plan(_topology("erack-8x4"), ["h0", "h1"]))


def test_every_switch_routes_to_every_other_aggregator():
    topo = _topology("clos-16")
    ids = routing.switch_ids(topo)
    tables = routing.tables(topo)
    for sw, table in tables.items():
        for other, k in ids.items():
            assert (routing.AGG_EP_BASE + k in table.ep) == (other != sw), (sw, other)
    # a leaf reaches a spine over the one port between them
    assert len(tables["leaf0"].ep[routing.AGG_EP_BASE + ids["spine2"]]) == 1


def test_inc_slots_must_be_in_range(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('[lab]\nfamily = "erack"\n[switch]\ninc = true\ninc_slots = 0\n')
    with pytest.raises(labfile.LabFileError, match="inc_slots"):
        labfile.load(str(f))


def test_in_network_needs_the_ethplus_transport():
    spec = bench.Spec(collective="all-reduce", transport="tcp", sizes=[MiB], algo="in-network")
    with pytest.raises(bench.BenchError, match="ethplus transport only"):
        spec.validate()
    r = ethplus("bench", "all-reduce", "--lab", "x", "--algo", "in-network", "--transport", "roce")
    assert r.returncode != 0 and "ethplus transport only" in r.stderr
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------- real labs


erack = module_lab("ic", "erack-8x4")


clos = module_lab("ic", "clos-16")


def _job(lab: Lab, sizes: list[int], **kw) -> dict:
    plan = Plan(lab=lab.name, transport="ethplus", collective="all-reduce", sizes=sizes,
                algo="in-network", iters=1, warmup=0, **kw)  # fmt: skip
    return Job(plan, registry.load_lab(lab.name)).run()


def _nic(res: dict) -> dict[str, int]:
    return bench._sum_counters(res["ranks"])


def _per_switch(before: dict, after: dict, key: str) -> dict[str, int]:
    return {
        sw: sum(p[key] for p in after["switches"][sw]["ports"].values())
        - sum(p[key] for p in before["switches"][sw]["ports"].values())
        for sw in after["switches"]
    }


def _host_tx_bytes(lab: Lab, host: str) -> int:
    ns = lab.rec["namespaces"][host]
    return sum(if_stats(ns, p["ifname"])["tx_bytes"] for p in lab.nodes[host]["ports"])


@pytest.mark.root
@pytest.mark.parametrize(
    "dtype,op", [("float32", "sum"), ("bfloat16", "max"), ("float16", "sum"), ("int32", "min")]
)
def test_in_network_all_reduce_is_exact(erack, dtype, op):
    # one element, an odd count (a short last chunk), several windows' worth
    res = _job(erack, [4, 4 * 1001, 3 * MiB + 4], dtype=dtype, op=op)
    assert [r["wrong"] for r in res["rows"]] == [0, 0, 0]


@pytest.mark.root
def test_the_switches_do_the_reduction_and_each_byte_crosses_a_link_once(erack):
    """8 ranks, 16 MiB, two calls: every chunk of every rank is absorbed by
    its plane's switch, each rank sends its buffer once (a ring sends it
    2(n-1)/n = 1.75 times) and gets one result per chunk."""
    size, calls, n = 16 * MiB, 2, 8
    chunks = size // PAYLOAD
    st0 = erack.stats()
    tx0 = _host_tx_bytes(erack, "h3")
    res = _job(erack, [size])
    assert res["rows"][0]["wrong"] == 0
    erack.quiesce()
    st1 = erack.stats()
    absorbed = _per_switch(st0, st1, "agg_consumed")
    dups = _per_switch(st0, st1, "agg_dup")
    results = _per_switch(st0, st1, "agg_results")
    replies = _per_switch(st0, st1, "agg_replies")
    # chunk c goes to plane c mod 4: a quarter of them to each switch
    for sw in (f"plane{i}" for i in range(4)):
        assert absorbed[sw] - dups[sw] == calls * n * chunks // 4, sw
        assert results[sw] - replies[sw] == calls * n * chunks // 4, sw
    nic = _nic(res)
    # every chunk sent once, plus the resends (after a timeout)
    late = nic["inc_retx_pkts"]
    assert nic["inc_tx_pkts"] == calls * n * chunks + late
    # nothing lost on the way up unseen: a contribution sent was absorbed,
    # counted stale (a resend finding its chunk done), or dropped by a
    # switch's RX ring when this machine fell behind (counted)
    stale = sum(_per_switch(st0, st1, "drop_agg_stale").values())
    ring = stats.totals(st1).get("drop_ring", 0) - stats.totals(st0).get("drop_ring", 0)
    lost = nic["inc_tx_pkts"] - sum(absorbed.values()) - stale
    assert 0 <= lost <= ring, (lost, ring, late, stale)
    assert nic["inc_rx_results"] == calls * n * chunks
    assert nic["tx_data_pkts"] == 0  # no point-to-point data at all
    # the kernel saw h3 send its buffer once per call, plus its resends,
    # headers and barriers
    sent = _host_tx_bytes(erack, "h3") - tx0
    h3 = next(r for r in res["ranks"] if r["node"] == "h3")["counters"]
    once = calls * size + h3["inc_retx_pkts"] * PAYLOAD
    assert calls * size <= sent < once * 1.1, (sent, once)
    assert stats.conservation(stats.totals(st1))["difference"] == 0
    out = ethplus("lab", "stats", erack.name, check=True).stdout
    assert re.search(r"\nplane0: .*; aggregated \d+ contributions \(\d+ resent\), sent", out), out


@pytest.mark.root
def test_stats_watch_shows_the_aggregators_at_work(erack):
    """`lab stats --watch --json` during an in-network all-reduce: every
    plane switch's ports to the ranks take contributions in."""
    done: list[dict] = []
    t = threading.Thread(target=lambda: done.append(_job(erack, [64 * MiB])))
    t.start()
    try:
        time.sleep(1.5)
        r = ethplus("lab", "stats", erack.name, "--watch", "1", "--count", "2", "--json",
                    check=True)  # fmt: skip
    finally:
        t.join()
    assert done and done[0]["rows"][0]["wrong"] == 0
    busy = {
        sw
        for line in r.stdout.splitlines()
        for sw, ports in json.loads(line)["switches"].items()
        if any(c["agg_consumed"] > 0 for c in ports.values())
    }
    assert busy == {f"plane{i}" for i in range(4)}, r.stdout


@pytest.mark.root
def test_in_network_all_reduce_recovers_from_loss(erack):
    """5% loss each way on one rank's link to one plane: lost contributions
    are sent again, lost results are sent again by the aggregator, and the
    result is still exact."""
    st0 = erack.stats()
    erack.link_set("h2-plane1", "loss", "5%")
    try:
        res = _job(erack, [2 * MiB])
    finally:
        erack.link_set("h2-plane1", "loss", "0")
    assert res["rows"][0]["wrong"] == 0
    nic = _nic(res)
    assert nic["inc_retx_pkts"] > 0 and nic["inc_timeouts"] > 0
    erack.quiesce()
    st1 = erack.stats()
    assert _per_switch(st0, st1, "drop_loss")["plane1"] > 0
    assert _per_switch(st0, st1, "agg_replies")["plane1"] > 0
    assert _per_switch(st0, st1, "drop_agg_stale")["plane1"] == 0


@pytest.mark.root
def test_a_plane_down_before_the_job_is_left_out(erack):
    """plane1 is down when the job starts: its chunks go to the three other
    planes' switches, and the result is exact.  (A plane that fails during a
    call fails the call: chunks do not move.)"""
    st0 = erack.stats()
    ethplus("node", "set", erack.name, "plane1", "down", check=True)
    try:
        res = _job(erack, [MiB + 8])
    finally:
        ethplus("node", "set", erack.name, "plane1", "up", check=True)
    assert res["rows"][0]["wrong"] == 0
    assert res["ranks"][0]["transport"]["inc_aggregators"] == [0, 2, 3]
    erack.quiesce()
    absorbed = _per_switch(st0, erack.stats(), "agg_consumed")
    assert absorbed["plane1"] == 0 and min(absorbed[f"plane{i}"] for i in (0, 2, 3)) > 0


@pytest.mark.root
def test_two_jobs_aggregate_side_by_side(erack):
    """Two 4-rank jobs at once, each its own group at the same switches."""
    out: dict[str, dict] = {}

    def run(name: str, nodes: list[str]) -> None:
        out[name] = _job(erack, [4 * MiB + 8], nodes=nodes, sample=name == "a")

    threads = [
        threading.Thread(target=run, args=("a", ["h0", "h2", "h4", "h6"])),
        threading.Thread(target=run, args=("b", ["h7", "h5", "h3", "h1"])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert {k: v["world"] for k, v in out.items()} == {"a": 4, "b": 4}
    assert [out[k]["rows"][0]["wrong"] for k in "ab"] == [0, 0]


@pytest.mark.root
def test_clos_aggregates_at_the_spines_over_udp(clos):
    st0 = clos.stats()
    res = _job(clos, [MiB + 4], nodes=["h0", "h5", "h10", "h15"])
    assert res["rows"][0]["wrong"] == 0
    res = _job(clos, [MiB], nodes=["h1", "h2", "h3", "h0"])
    assert res["rows"][0]["wrong"] == 0
    clos.quiesce()
    absorbed = _per_switch(st0, clos.stats(), "agg_consumed")
    chunks = (MiB + 4 + PAYLOAD - 1) // PAYLOAD
    assert sum(absorbed[f"spine{i}"] for i in range(4)) >= 2 * 4 * chunks
    assert all(absorbed[f"spine{i}"] > 0 for i in range(4))
    assert absorbed["leaf0"] >= 2 * 4 * (MiB // PAYLOAD)
    assert absorbed["leaf1"] == absorbed["leaf2"] == absorbed["leaf3"] == 0


@pytest.mark.root
def test_clos_aggregates_in_a_tree_leaves_first(clos):
    """Two members under each of three leaves: each leaf reduces its two
    members' chunks and sends one partial up; the spines reduce the three
    partials and send the result down to the leaves, which send it on.  The
    spines see half the frames a flat reduction would send them."""
    size, calls, n = 2 * MiB, 2, 6
    chunks = size // PAYLOAD
    st0 = clos.stats()
    up0 = _uplink_tx_packets(clos, "leaf0")
    res = _job(clos, [size], nodes=["h0", "h1", "h4", "h5", "h8", "h9"])
    assert res["rows"][0]["wrong"] == 0
    clos.quiesce()
    st1 = clos.stats()
    got = {k: _per_switch(st0, st1, k) for k in ("agg_consumed", "agg_dup", "agg_results")}

    def total(kind: str, key: str) -> int:
        return sum(v for sw, v in got[key].items() if sw.startswith(kind))

    assert total("leaf", "agg_dup") == total("spine", "agg_dup") == 0
    assert got["agg_consumed"]["leaf3"] == 0
    # leaves: every member's chunks, and the spines' results coming down
    assert total("leaf", "agg_consumed") == calls * chunks * (n + 3)
    # spines: one partial per chunk from each of the three leaves
    assert total("spine", "agg_consumed") == calls * chunks * 3
    assert total("spine", "agg_results") == calls * chunks * 3
    # leaves: one partial up per chunk, and one result per member down
    assert total("leaf", "agg_results") == calls * chunks * (3 + n)
    assert _nic(res)["inc_rx_results"] == calls * chunks * n
    # the kernel: leaf0's links to the spines carried one frame per chunk,
    # not one per member (flat, h0's and h1's would both go up)
    assert _uplink_tx_packets(clos, "leaf0") - up0 == calls * chunks


def _uplink_tx_packets(lab: Lab, switch: str) -> int:
    ns = lab.rec["namespaces"][switch]
    return sum(
        if_stats(ns, p["ifname"])["tx_packets"]
        for p in lab.nodes[switch]["ports"]
        if p["peer"].startswith("spine")
    )


@pytest.mark.root
def test_bench_on_some_nodes_shows_where_it_aggregated(clos):
    r = ethplus("bench", "all-reduce", "--lab", clos.name, "--algo", "in-network",
                "--nodes", "h4,h5,h8,h9", "--sizes", "256K", "--iters", "1",
                "--warmup", "0")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "in-network all-reduce (the switches reduce)) on lab" in r.stdout
    assert ": 4 ranks" in r.stdout  # (then "," or, rank hosts, " in 2 processes,")
    # the fidelity report: the two leaves reduce first, the spines finish
    lines = {ln.split(":")[0].strip(): ln for ln in r.stdout.splitlines() if "agg_consumed=" in ln}
    assert set(lines) == {"leaf1", "leaf2", "spine0", "spine1", "spine2", "spine3"}, r.stdout
    bad = ethplus("bench", "all-reduce", "--lab", clos.name, "--nodes", "h0,h99")
    assert bad.returncode != 0 and "--nodes: expected two or more distinct" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.root
def test_a_tree_recovers_from_loss_above_and_below(clos):
    st0 = clos.stats()
    clos.link_set("leaf1-spine2", "loss", "5%")
    clos.link_set("h1-leaf0", "loss", "5%")
    try:
        res = _job(clos, [MiB], nodes=["h0", "h1", "h4", "h5"])
    finally:
        clos.link_set("leaf1-spine2", "loss", "0")
        clos.link_set("h1-leaf0", "loss", "0")
    assert res["rows"][0]["wrong"] == 0
    assert _nic(res)["inc_retx_pkts"] > 0
    clos.quiesce()
    st1 = clos.stats()
    replies = _per_switch(st0, st1, "agg_replies")
    assert replies["leaf0"] > 0 and replies["leaf1"] + replies["spine2"] > 0


@pytest.mark.root
def test_a_lab_without_inc_is_a_one_line_error(erack, tmp_path):
    rec = registry.load_lab(erack.name)
    rec["switch"]["inc"] = False
    plan = Plan(lab=erack.name, transport="ethplus", collective="all-reduce", sizes=[MiB],
                algo="in-network")  # fmt: skip
    with pytest.raises(JobError, match=r"no in-network computing \(set inc = true"):
        Job(plan, rec)
    f = tmp_path / "noinc.toml"
    f.write_text('[lab]\nfamily = "erack"\n[topology]\naccelerators = 2\nplanes = 1\n')
    r = ethplus("bench", "all-reduce", "--lab", str(f), "--algo", "in-network", "--sizes", "8K")
    assert r.returncode == 1 and "set inc = true under [switch]" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def _small_lab(tmp_path, lab_name: str, accelerators: int) -> Lab:
    """An ERack+ lab of one plane whose switch has 8 slots: a job's quota is
    4 (half), so two jobs fill it."""
    f = tmp_path / "small.toml"
    f.write_text(
        f'[lab]\nfamily = "erack"\n[topology]\naccelerators = {accelerators}\nplanes = 1\n'
        "[switch]\ninc = true\ninc_slots = 8\n"
    )
    ethplus("lab", "up", str(f), "--name", lab_name, check=True)
    return Lab(lab_name)


@pytest.mark.root
def test_a_job_that_ended_gives_its_slots_back_at_once(tmp_path, lab_name):
    """Three jobs in a row on a switch that holds two jobs' slots: each
    ended job withdrew its groups, so the next never finds the switch full
    (it used to wait 5 s for the old groups to go idle, and under load a
    live group could be emptied under its job)."""
    lab = _small_lab(tmp_path, lab_name, 4)
    st0 = lab.stats()
    for _ in range(3):
        res = _job(lab, [MiB + 4])
        assert res["rows"][0]["wrong"] == 0
        assert res["ranks"][0]["transport"]["inc_window"] == 4
    lab.quiesce()
    st1 = lab.stats()
    assert _per_switch(st0, st1, "drop_agg_full")["plane0"] == 0
    assert _per_switch(st0, st1, "agg_consumed")["plane0"] > 0


@pytest.mark.root
def test_a_full_aggregator_makes_a_third_job_wait_for_one_to_end(tmp_path, lab_name):
    """Three jobs at once on a switch that holds two jobs' slots: the one
    that comes last finds it full (its chunks are dropped and resent) until
    one of the others ends, then completes; all three are exact."""
    lab = _small_lab(tmp_path, lab_name, 6)
    st0 = lab.stats()
    out: dict[int, dict] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = _job(lab, [8 * MiB], nodes=[f"h{2 * i}", f"h{2 * i + 1}"])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert [out[i]["rows"][0]["wrong"] for i in range(3)] == [0, 0, 0]
    lab.quiesce()
    st1 = lab.stats()
    assert _per_switch(st0, st1, "drop_agg_full")["plane0"] > 0
    assert sum(_nic(out[i])["inc_timeouts"] for i in range(3)) > 0


@pytest.mark.root
def test_results_pause_no_member_of_a_lossless_fabric(tmp_path, lab_name):
    """With PFC on, result frames are the aggregator's own: no member's
    ingress account is charged for them, so the multicast of results never
    pauses the member whose chunk happened to complete a slot (when it was
    charged, the switches sent 14 pauses in this test)."""
    f = tmp_path / "lossless.toml"
    f.write_text(
        library.find("erack-8x4").read_text().replace("inc = true", "inc = true\nlossless = true")
    )
    ethplus("lab", "up", str(f), "--name", lab_name, check=True)
    lab = Lab(lab_name)
    st0 = lab.stats()
    res = _job(lab, [16 * MiB])
    assert res["rows"][0]["wrong"] == 0
    lab.quiesce()
    st1 = lab.stats()
    assert sum(_per_switch(st0, st1, "agg_consumed").values()) > 0
    assert sum(_per_switch(st0, st1, "pause_tx").values()) == 0
    assert _nic(res)["pauses_rx"] == 0


def test_a_switch_refuses_a_tree_it_cannot_be_part_of():
    """Joining a tree under itself (its partials would come straight back)
    or with a place out of range is refused; so is any join without an
    aggregator."""
    cfg = core.SwitchConfig(agg_id=3, agg_slots=16)
    sw = core.Switch(cfg, 4)
    sw.agg_join(0x1230, 2, 1, 4)
    for args in ((0x1230, 3, 0, 4), (0x1230, 2, 4, 4), (0x1230, 2, 0, 0)):
        with pytest.raises(OSError):
            sw.agg_join(*args)
    with pytest.raises(OSError):
        core.Switch(core.SwitchConfig(), 4).agg_join(0x1230, 2, 1, 4)


@pytest.mark.root
def test_hpn_aggregates_in_trees_on_both_planes():
    """Rail-optimised dual plane: each rail's ToR in a plane reduces its two
    hosts' accelerators first; each plane's spines finish their streams."""
    with shipped_lab("ic", "hpn-16") as name:
        lab = Lab(name)
        st0 = lab.stats()
        res = _job(lab, [MiB + 8])
        assert res["world"] == 16 and res["rows"][0]["wrong"] == 0
        lab.quiesce()
        absorbed = _per_switch(st0, lab.stats(), "agg_consumed")
    tors = [sw for sw in absorbed if sw.startswith("tor")]
    assert len(tors) == 16 and all(absorbed[sw] > 0 for sw in tors), absorbed
    assert all(absorbed[f"spine{i}"] > 0 for i in range(4)), absorbed


def test_a_failed_in_network_all_reduce_says_what_its_endpoint_saw():
    """When an aggregator never answers, the error carries the endpoint's
    in-network counters (sent, resent, results, timeouts, refused), the
    first thing to look at; every name it reads is a real counter."""
    from dataplane.lab import nic
    from dataplane.run.transports import nic as nic_transport

    assert set(nic_transport.INC_COUNTERS) <= set(nic.NIC_COUNTERS)

    class Silent:  # an endpoint whose aggregator never answered
        inc_window = 4

        def all_reduce(self, buf, dtype, op):
            return 1

        def wait(self, handle):
            raise nic.Unreachable("peer unreachable after the retry budget")

        def counters(self):
            return dict.fromkeys(nic.NIC_COUNTERS, 0) | {"inc_tx_pkts": 9, "inc_timeouts": 13}

    t = object.__new__(nic_transport.NicTransport)
    t.ep, t.rank = Silent(), 3
    t._errors, t._unreachable = nic.NicError, nic.Unreachable
    with pytest.raises(nic_transport.TransportError) as e:
        t.all_reduce_in_network(bytearray(16), "sum", "float32")
    msg = str(e.value)
    assert msg.startswith("rank 3: in-network all-reduce: an aggregator (switch) answered nothing")
    assert "tx_pkts 9" in msg and "timeouts 13" in msg and "rx_spoofed 0" in msg
