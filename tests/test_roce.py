"""The emulated RoCEv2 transport on real labs: byte-exact under loss,
go-back-N that really goes back, why RoCE keeps one path per queue pair,
DCQCN with CNPs and rate cuts, PFC pauses and their head-of-line blocking."""

import time

import numpy as np
import pytest
from conftest import RUN_ID
from labtools import Lab, lab_up_down

from dataplane.lab.nic import Endpoint
from dataplane.report import fidelity, stats

pytestmark = pytest.mark.root

KiB, MiB = 1024, 1024 * 1024
# DCQCN reacting and recovering faster than the paper's settings (all of them
# nominal, settable in the lab file): timers and CNP interval a fifth, the
# increase steps ten times.
DCQCN_QUICK = (
    "dcqcn_timer_us = 11.0\ncnp_interval_us = 10.0\ndcqcn_rai_mbps = 4000.0\n"
    "dcqcn_rhai_mbps = 40000.0\n"
)
# PFC, with headroom below the (at least 1 MB) buffers
LOSSLESS = "lossless = true\npfc_xoff_bytes = 150000\npfc_xon_bytes = 75000\n"


def _lab_file(tmp_path, base: str, name: str, dcqcn: bool = True, nic_extra: str = "") -> str:
    src = open(f"netns-labs/{base}.toml").read()
    src = src.replace("[switch]\n", "[switch]\n" + LOSSLESS, 1)
    src = src.replace("buffer_bytes = 400000 ", "buffer_bytes = 1000000 ")  # erack's
    if "[nic]" not in src:
        src += "\n[nic]\n"
    src = src.replace("[nic]\n", f"[nic]\ndcqcn = {'true' if dcqcn else 'false'}\n{nic_extra}", 1)
    f = tmp_path / f"{name}.toml"
    f.write_text(src)
    return str(f)


class Ctx:
    def __init__(self, name: str):
        self.lab = Lab(name)
        self.eps: dict[tuple, Endpoint] = {}

    def ep(self, node: str, **kw) -> Endpoint:
        """One engine per node at a time (a second would see the first's
        frames): a node asked for with other settings gets a new one."""
        old = self.eps.get(node)
        if old is not None and old[1] != kw:
            old[0].close()
            old = None
        if old is None:
            self.eps[node] = old = (Endpoint(self.lab.name, node, roce=True, **kw), kw)
        return old[0]

    def close(self, *nodes: str) -> None:
        for node in nodes or list(self.eps):
            e = self.eps.pop(node, None)
            if e is not None:
                e[0].close()


def _module_lab(tmp_path_factory, base: str, suffix: str, *up_args: str, **kw):
    name = f"{RUN_ID}-ro{suffix}"
    f = _lab_file(tmp_path_factory.mktemp(name), base, name, **kw)
    with lab_up_down(name, f, *up_args):
        ctx = Ctx(name)
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture(scope="module")
def erack(tmp_path_factory):
    yield from _module_lab(tmp_path_factory, "erack-8x4", "e")


@pytest.fixture(scope="module")
def erack_k640(tmp_path_factory):
    """Time scale 640 instead of 6400: DCQCN's 55 us timers are 35 ms real, so
    a 2 s window spans some 60 of them (at 6400 it spans 6: too few for rates
    to settle).  Fine for a test that loads one plane only."""
    yield from _module_lab(tmp_path_factory, "erack-8x4", "k", "--time-scale", "640",
                           nic_extra=DCQCN_QUICK)  # fmt: skip


@pytest.fixture(scope="module")
def clos(tmp_path_factory):
    yield from _module_lab(tmp_path_factory, "clos-16", "c")


def transfer(a: Endpoint, b: Endpoint, size: int, tag: int, timeout_s: float = 180) -> float:
    src = np.random.default_rng(size + tag).integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    t0 = time.monotonic()
    hr = b.post_recv(a.rank, tag, dst)
    hs = a.post_send(b.rank, tag, src)
    assert a.wait(hs, timeout_s) == size
    assert b.wait(hr, timeout_s) == size
    dt = time.monotonic() - t0
    assert np.array_equal(src, dst)
    return dt


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


@pytest.mark.parametrize("loss", ["0", "1%"])
@pytest.mark.parametrize("which", ["erack", "clos"])
def test_messages_arrive_byte_exact(request, which, loss):
    ctx = request.getfixturevalue(which)
    a, b = ctx.ep("h0"), ctx.ep("h5")
    links = [p["link"] for p in ctx.lab.nodes["h5"]["ports"]]
    c0 = a.counters()
    try:
        for lk in links:
            ctx.lab.link_set(lk, "loss", loss)
        for i, size in enumerate((1 * KiB, 1 * MiB + 3, 64 * MiB)):
            transfer(a, b, size, tag=100 + i)
    finally:
        for lk in links:
            ctx.lab.link_set(lk, "loss", "0")
    d = _delta(a.counters(), c0)
    if loss != "0":
        assert d["retx_gbn"] > 0 and d["rx_nacks"] > 0


def test_go_back_n_resends_everything_after_one_loss(erack):
    """One packet lost: RoCE resends it and every packet of its QP sent after
    it (the receiver discarded them); ETH+ resends that one packet."""
    size, lost = 1 * MiB, 40
    a, b = erack.ep("h2", qps=1, drop_psn=lost), erack.ep("h3", qps=1)
    ca, cb = a.counters(b.rank), b.counters(a.rank)
    transfer(a, b, size, tag=7)
    da, db = _delta(a.counters(b.rank), ca), _delta(b.counters(a.rank), cb)
    assert da["tx_injected_drops"] == 1
    assert db["rx_oos_drops"] > 10, "packets sent after the lost one were discarded"
    assert da["retx_gbn"] >= db["rx_oos_drops"] + 1, "each discarded packet was resent"
    assert db["tx_nacks"] == 1 and da["rx_nacks"] == 1  # one NAK per gap
    assert db["rx_data_pkts"] == size // 4096  # placed exactly once each
    # one engine per node: the RoCE ones would see (and be woken by) every
    # ETH+ frame, and held the ETH+ engines up for 40 ms at times
    erack.close("h2", "h3")
    e_a = Endpoint(erack.lab.name, "h2", drop_psn=lost)
    e_b = Endpoint(erack.lab.name, "h3")
    try:
        src = np.arange(size, dtype=np.uint8)
        dst = np.zeros_like(src)
        hr, hs = e_b.post_recv(e_a.rank, 8, dst), e_a.post_send(e_b.rank, 8, src)
        e_a.wait(hs, 60), e_b.wait(hr, 60)
        assert np.array_equal(src, dst)
        assert e_a.counters()["retx_pkts"] == 1  # selective: only the lost one
    finally:
        e_a.close()
        e_b.close()


def test_one_qp_sprayed_over_paths_collapses(erack, record_property):
    """Why RoCE keeps one path per QP: spray one QP's packets over planes whose
    delays differ (as real paths' do) and go-back-N treats every reordering
    as a loss.  The unsprayed QP takes plane 0, made the slowest of the four."""
    delays = {"h6-plane0": "2us", "h6-plane1": "500ns", "h6-plane2": "1us", "h6-plane3": "1500ns"}
    try:
        for link, delay in delays.items():
            erack.lab.link_set(link, "delay", delay)
        a, b = erack.ep("h4", qps=1), erack.ep("h6", qps=1)
        t_one_path = transfer(a, b, 2 * MiB, tag=1)
        sa, sb = erack.ep("h4", qps=1, roce_spray=True), erack.ep("h6", qps=1, roce_spray=True)
        c0 = sb.counters(sa.rank)
        t_sprayed = transfer(sa, sb, 2 * MiB, tag=2)
        d = _delta(sb.counters(sa.rank), c0)
    finally:
        for link in delays:
            erack.lab.link_set(link, "delay", "500ns")
    record_property("oos_drops", d["rx_oos_drops"])
    record_property("time_ratio", round(t_sprayed / t_one_path, 2))
    assert d["rx_oos_drops"] > 50 and sa.counters(sb.rank)["retx_gbn"] > 50, d
    # One path is one plane; sprayed, it has all four, and is still slower.
    assert t_sprayed > 1.5 * t_one_path, (t_sprayed, t_one_path)


INCAST_MSGS = 4


def _incast(ctx, flows: list[tuple[str, str]], seconds: float, warm_s: float | None = None,
            windows: int = 1, **kw) -> dict:  # fmt: skip
    """Every flow (src, dst) streams on one QP (plane 0) for warm_s (default
    seconds) and then seconds: the bytes/s each delivered in the second
    part, and everyone's counters.  Each flow is INCAST_MSGS messages of
    512 MiB (one buffer each way, posted again): more than a flow alone at
    its link's rate can send before the end at k 640 (78 MB/s real for 2
    GiB: 27 s).  With one message a flow once finished before the windows
    did, and read 0 B/s after, as if DCQCN had starved it (a fresh clone's
    suite, and a run in eight here: the first flow had 467 MB of its 537
    through before the windows began, the second 118 MB; the second's
    posts came seconds after the first's); `finished` says whether one
    did."""
    nodes = sorted({n for f in flows for n in f})
    ctx.close(*nodes)
    eps = {n: ctx.ep(n, qps=1, **kw) for n in nodes}
    size = 512 * MiB
    keep = []
    for i, (s, d) in enumerate(flows):
        src, dst = np.ones(size, np.uint8), np.zeros(size, np.uint8)
        keep += [src, dst]
        for m in range(INCAST_MSGS):
            tag = 20 + i + 100 * m
            eps[d].post_recv(eps[s].rank, tag, dst)
            eps[s].post_send(eps[d].rank, tag, src)
    st0 = ctx.lab.totals()
    time.sleep(seconds if warm_s is None else warm_s)
    sw0, eng0 = ctx.lab.totals(), {n: eps[n].counters() for n in nodes}
    marks = [[eps[d].counters(eps[s].rank)["rx_data_bytes"] for s, d in flows]]
    rate_marks = [[eps[s].counters(eps[d].rank)["rate_bps"] for s, d in flows]]
    for _ in range(windows):
        time.sleep(seconds)
        marks.append([eps[d].counters(eps[s].rank)["rx_data_bytes"] for s, d in flows])
        rate_marks.append([eps[s].counters(eps[d].rank)["rate_bps"] for s, d in flows])
    st1 = ctx.lab.totals()
    per_window = [
        [(e - m) / seconds for e, m in zip(b, a, strict=True)]
        for a, b in zip(marks, marks[1:], strict=False)
    ]
    out = {
        "rates": per_window[-1],
        "windows": per_window,
        # each sender's rate (DCQCN's) at the start and at each window's end
        "sender_rates": [list(col) for col in zip(*rate_marks, strict=True)],
        "senders": [eps[s].counters(eps[d].rank) for s, d in flows],
        "sender_nics": [eps[s].counters() for s, _ in flows],  # pauses are per port
        "receivers": [eps[d].counters(eps[s].rank) for s, d in flows],
        "switch": {k: st1.get(k, 0) - st0.get(k, 0) for k in st1},
        # flows whose every message was delivered before the windows ended
        "finished": [
            f"{s}->{d}"
            for (s, d), got in zip(flows, marks[-1], strict=True)
            if got >= INCAST_MSGS * size
        ],  # fmt: skip
    }
    # whether the machine kept up while the windows were measured: frames
    # the switches never read, an engine (a sender's or a receiver's) late
    # past its pacers' catch-up, or frames its RX ring dropped (the verdicts'
    # checks: fidelity.HOST_DROPS, LOST_SHARE_MAX, the endpoints' ring drops)
    dropped = sum(st1.get(k, 0) - sw0.get(k, 0) for k in fidelity.HOST_DROPS)
    out["host_behind"] = [f"the switches' rings dropped {dropped} frames"] if dropped else []
    for n in nodes:
        c0, c1 = eng0[n], eps[n].counters()
        lost_share = (c1["eng_lost_ns"] - c0["eng_lost_ns"]) / (windows * seconds * 1e9)
        ring = c1["rx_ring_drops"] - c0["rx_ring_drops"]
        if lost_share > fidelity.LOST_SHARE_MAX:
            out["host_behind"].append(f"{n}'s engine lost {lost_share:.1%} of its link time")
        if ring:
            out["host_behind"].append(f"{n}'s RX ring dropped {ring} frames")
    ctx.close(*nodes)  # mid-transfer: the rest is cut short
    return out


def test_dcqcn_shares_a_port_fairly_with_cnps_and_rate_cuts(erack_k640):
    """Two QPs into one port: after 3 s, over three 2 s windows, they share
    it within +-30% in all, and in no window does either get less than a
    third of the other's (a spread of 1.0; a starved flow is 2.0).  DCQCN
    oscillates (a cut lands on one flow before the other, and one flow can
    stay ahead for a while): single windows of 0.389 and 0.590 were seen,
    the three windows in all at most 0.175 in eight runs, and once every
    window at 0.20-0.27 (one flow ahead for all 9 ms nominal).  In eight
    later runs, alone on the machine, 7 of 24 windows were past 0.15 (at
    most 0.265) and the three in all at most 0.143 (docs/performance.md,
    session 49)."""
    # judged on a run the machine kept up with: under a busy loop on each
    # core one run starved a flow (0 B/s in two windows) while the switches'
    # rings dropped 92 frames
    for _ in range(3):
        r = _incast(erack_k640, [("h1", "h0"), ("h2", "h0")], 2.0, warm_s=3.0, windows=3)
        if not r["host_behind"]:
            break
    else:
        pytest.fail(f"the machine fell behind in three runs: {r['host_behind']}")
    spread = [abs(a - b) / ((a + b) / 2) for a, b in r["windows"]]
    a, b = (sum(col) for col in zip(*r["windows"], strict=True))
    # the senders' rates and the switches' counters beside the windows: how
    # the cuts fell, and whether the machine fell behind (late frames)
    why = (r["windows"], r["sender_rates"], r["switch"])
    assert not r["finished"], f"a flow ran out of data before the windows ended: {r['finished']}"
    assert abs(a - b) / ((a + b) / 2) <= 0.3 and max(spread) < 1.0, why
    assert all(x["tx_cnps"] > 0 for x in r["receivers"])
    assert all(x["rx_cnps"] > 0 and x["rate_cuts"] > 0 for x in r["senders"])
    # a rate recovers to the line's between cuts: below it at one mark or more
    # of four (the last mark alone was at the line's once in a full suite)
    assert all(min(x) < 625_000_000 for x in r["sender_rates"]), r["sender_rates"]


def test_without_dcqcn_pfc_pauses_instead(erack):
    r = _incast(erack, [("h1", "h0"), ("h2", "h0")], 1.5, dcqcn=False)
    assert all(x["tx_cnps"] == 0 for x in r["receivers"])
    assert all(x["rate_cuts"] == 0 for x in r["senders"])
    assert r["switch"]["pause_tx"] > 0, "the congested switch paused its senders"
    assert sum(x["pauses_rx"] for x in r["sender_nics"]) > 0
    drops = {k: r["switch"][k] for k in stats.DROP_REASONS if r["switch"].get(k)}
    assert not drops, f"lossless, yet the switches dropped: {drops}"


def test_pfc_head_of_line_blocking_slows_an_innocent_flow(erack):
    """h1 sends to h3 (nobody else does) and to h0; when h2, h4 and h5 also
    send to h0, h0's switch port pauses h1's whole uplink and h1 -> h3 slows,
    although its own path is idle.  Alone it has half of h1's uplink
    (3.6-3.9 MB/s real at k 6400), blocked 0.42-0.49 of that in nine runs
    (docs/performance.md, session 51).  Judged on a pair of runs the machine
    kept up with, up to three pairs: a fresh clone's suite once measured the
    innocent flow alone at half its usual rate (1.97 MB/s), and the
    receivers' engines were not checked then."""
    for _ in range(3):
        alone = _incast(erack, [("h1", "h3"), ("h1", "h0")], 1.5, dcqcn=False)
        blocked = _incast(
            erack, [("h1", "h3"), ("h1", "h0"), ("h2", "h0"), ("h4", "h0"), ("h5", "h0")], 1.5,
            dcqcn=False,
        )  # fmt: skip
        if not alone["host_behind"] + blocked["host_behind"]:
            break
    else:
        pytest.fail(f"the machine fell behind in three pairs: {alone['host_behind']}, "
                    f"{blocked['host_behind']}")  # fmt: skip
    innocent_alone, innocent_blocked = alone["rates"][0], blocked["rates"][0]
    # every flow's rate and every engine's counters beside the two: whether
    # the innocent flow alone had its half of the uplink
    why = (alone["rates"], blocked["rates"], alone["sender_nics"], alone["receivers"])
    assert innocent_blocked < 0.75 * innocent_alone, why
    assert blocked["switch"]["pause_tx"] > 0 and blocked["sender_nics"][0]["pauses_rx"] > 0
