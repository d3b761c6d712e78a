"""The ETH+ software NIC on real labs: byte-exact messages under loss,
reordering and a plane failure; retransmission accounting; NACKs for
trimmed packets; the host kernel's silence; bad input."""

import hashlib
import random
import threading
import time

import numpy as np
import pytest
from conftest import ethplus
from labtools import (
    Capture,
    Lab,
    assert_missed_only_by_ring,
    ethp_frame,
    send_paced,
    shipped_lab,
)

from dataplane.lab import core
from dataplane.lab.nic import BufferTooSmall, Endpoint, NicError, NoReceive, Unreachable
from dataplane.report import stats

pytestmark = pytest.mark.root

KiB, MiB = 1024, 1024 * 1024
OTHER_VERSIONS = [v for v in range(16) if v != core.lib.ETHP_VERSION]


@pytest.fixture(scope="module")
def erack():
    eps = {}
    with shipped_lab("nic", "erack-8x4") as name:
        try:
            yield Lab(name), eps
        finally:
            for ep in eps.values():
                ep.close()


def endpoint(ctx, node: str) -> Endpoint:
    lab, eps = ctx
    if node not in eps:
        eps[node] = Endpoint(lab.name, node)
    return eps[node]


def _moved(delta: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in delta.items() if v)


def transfer(a: Endpoint, b: Endpoint, size: int, tag: int, timeout_s: float = 120) -> None:
    src = np.random.default_rng(size + tag).integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size + 7, dtype=np.uint8)  # a larger buffer: the message says how long
    hr = b.post_recv(a.rank, tag, dst)
    hs = a.post_send(b.rank, tag, src)
    assert a.wait(hs, timeout_s) == size
    assert b.wait(hr, timeout_s) == size
    assert hashlib.sha256(dst[:size]).digest() == hashlib.sha256(src).digest()
    assert not dst[size:].any()


@pytest.mark.parametrize("loss", ["0", "1%", "5%"])
def test_messages_arrive_byte_exact_under_loss(erack, loss):
    lab, _ = erack
    a, b = endpoint(erack, "h0"), endpoint(erack, "h1")
    c0a, c0b = a.counters(), b.counters()
    try:
        lab.link_set("h1-plane2", "loss", loss)
        for i, size in enumerate((1 * KiB, 1 * MiB, 64 * MiB)):
            transfer(a, b, size, tag=100 + i)
    finally:
        lab.link_set("h1-plane2", "loss", "0")
    ca, cb = a.counters(), b.counters()
    delta_a = {k: ca[k] - c0a[k] for k in ca}
    delta_b = {k: cb[k] - c0b[k] for k in cb}
    assert delta_b["msgs_received"] == 3 and delta_a["msgs_sent"] == 3
    placed = 1 * KiB + 1 * MiB + 64 * MiB
    assert delta_b["rx_data_bytes"] == placed  # every byte placed exactly once
    if loss == "0":
        # Nothing is lost on the link, so every retransmission is a
        # duplicate at the receiver, answers a trim (a queue over its
        # threshold while the machine ran a switch late) or a frame the
        # receiver's RX ring dropped (its engine kept off the CPU: a fresh
        # clone's suite saw 4, each resent once; CI once saw 54, with the
        # receiver's engine 26 ms off the CPU).  The only duplicates
        # allowed are the loss detector's rare reordering misjudgements (a
        # plane's switch thread descheduled for longer than the reordering
        # window on this 2-core machine): never a timeout, at most one
        # packet in a thousand.
        moved = f"sender {_moved(delta_a)}, receiver {_moved(delta_b)}"
        resent = delta_b["rx_dup_pkts"] + delta_b["rx_trimmed_pkts"] + delta_b["rx_ring_drops"]
        assert resent == delta_a["retx_pkts"], moved
        assert delta_a["retx_timeout"] == 0, moved
        assert delta_b["rx_dup_pkts"] <= delta_a["tx_data_pkts"] // 1000, moved
    else:
        assert delta_a["retx_bytes"] > 0
        assert delta_a["tx_data_bytes"] == placed + delta_a["retx_bytes"]


def test_link_level_retry_hides_corruption_from_the_transport(erack):
    """A link corrupting 2% of frames each way, with link-level retry: the hop
    replays them, so the transport loses nothing to corruption and never
    times out.  What it may resend: a packet a replay held back longer than
    the loss detector's reordering window (a duplicate at the receiver), and
    the payload of one trimmed in the queue that builds behind a replay."""
    lab, _ = erack
    a, b = endpoint(erack, "h4"), endpoint(erack, "h5")
    c0a, c0b, t0 = a.counters(), b.counters(), lab.totals()
    try:
        lab.link_set("h5-plane1", "llr", "on")
        lab.link_set("h5-plane1", "corrupt", "2%")
        for i, size in enumerate((1 * MiB, 16 * MiB)):
            transfer(a, b, size, tag=150 + i)
    finally:
        lab.link_set("h5-plane1", "corrupt", "0")
        lab.link_set("h5-plane1", "llr", "off")
    t = {k: v - t0.get(k, 0) for k, v in lab.totals().items()}
    delta_a = {k: v - c0a[k] for k, v in a.counters().items()}
    delta_b = {k: v - c0b[k] for k, v in b.counters().items()}
    moved = f"sender {_moved(delta_a)}, receiver {_moved(delta_b)}, switches {_moved(t)}"
    # a quarter of the packets and their acks cross that plane: about 27 replays
    assert t["llr_replays"] > 10 and t["drop_corrupt"] == 0, moved
    assert delta_b["rx_data_bytes"] == 17 * MiB, moved
    assert delta_a["retx_pkts"] == delta_b["rx_dup_pkts"] + delta_b["rx_trimmed_pkts"], moved
    assert delta_a["retx_timeout"] == 0, moved


def test_unequal_plane_delays_reorder_but_do_not_corrupt(erack):
    lab, _ = erack
    a, b = endpoint(erack, "h2"), endpoint(erack, "h3")
    try:
        lab.link_set("h3-plane0", "delay", "3us")
        lab.link_set("h3-plane1", "delay", "1500ns")
        for i, size in enumerate((1 * KiB, 1 * MiB, 64 * MiB)):
            transfer(a, b, size, tag=200 + i)
    finally:
        lab.link_set("h3-plane0", "delay", "500ns")
        lab.link_set("h3-plane1", "delay", "500ns")


def test_plane_down_mid_transfer_completes_on_the_rest(erack):
    lab, _ = erack
    a, b = endpoint(erack, "h4"), endpoint(erack, "h5")
    size = 64 * MiB
    done = {}
    c0 = a.counters()

    def run():
        done["ok"] = False
        transfer(a, b, size, tag=300, timeout_s=240)
        done["ok"] = True

    t = threading.Thread(target=run)
    t.start()
    try:
        time.sleep(0.8)
        ethplus("node", "set", lab.name, "plane2", "down", check=True)
        t.join(240)
    finally:
        ethplus("node", "set", lab.name, "plane2", "up", check=True)
    assert done.get("ok"), "the transfer did not complete over the remaining planes"
    assert a.counters(b.rank)["retx_pkts"] > 0
    # oblivious spraying too takes a plane that keeps losing out of its
    # rotation, rather than waiting on timeouts for its window
    moved = {k: v - c0[k] for k, v in a.counters().items()}
    assert moved["plane_failures"] >= 1, _moved(moved)


def test_trimmed_packets_are_nacked_and_resent_without_timeouts(erack, record_property):
    lab, _ = erack
    dst = endpoint(erack, "h7")
    senders = [endpoint(erack, h) for h in ("h0", "h2", "h4", "h6")]
    before = {s.rank: s.counters(dst.rank) for s in senders}
    size = 8 * MiB
    bufs = {s.rank: np.zeros(size, dtype=np.uint8) for s in senders}
    srcs = {s.rank: np.full(size, s.rank + 1, dtype=np.uint8) for s in senders}
    hr = {s.rank: dst.post_recv(s.rank, 400, bufs[s.rank]) for s in senders}
    hs = {s.rank: s.post_send(dst.rank, 400, srcs[s.rank]) for s in senders}
    for s in senders:
        assert s.wait(hs[s.rank], 120) == size
        assert dst.wait(hr[s.rank], 120) == size
        assert np.array_equal(bufs[s.rank], srcs[s.rank])
    after = {s.rank: s.counters(dst.rank) for s in senders}
    nacked = sum(after[r]["retx_nack"] - before[r]["retx_nack"] for r in after)
    timeouts = sum(after[r]["retx_timeout"] - before[r]["retx_timeout"] for r in after)
    trims = sum(
        p["trimmed"] for sw in lab.stats()["switches"].values() for p in sw["ports"].values()
    )
    assert trims > 0, "a 4-to-1 incast produced no trimming"
    assert nacked > 0 and dst.counters()["tx_nacks"] >= nacked
    assert timeouts == 0  # trimmed packets come back on a NACK, not a timeout
    # ... and sooner than a timeout would have (the engine's own clock). A
    # NACKed packet waits for its pacer behind the retransmissions NACKed
    # before it, so the slowest of a burst of trims takes about an RTT:
    # 0.5-1.8 base RTTs over 30 runs alone. The timeout is 4 or more.
    worst = max(s.counters(dst.rank)["nack_retx_max_ns"] for s in senders)
    base_rtt_ns = senders[0].config["base_rtt_ns"]
    assert senders[0].config["rto_ns"] >= 4 * base_rtt_ns
    record_property("worst_nack_to_retx_base_rtts", round(worst / base_rtt_ns, 2))
    assert 0 < worst < senders[0].config["rto_ns"], worst


def _goodput_bps(a: Endpoint, b: Endpoint, size: int, tag: int) -> float:
    src, dst = np.ones(size, dtype=np.uint8), np.zeros(size, dtype=np.uint8)
    t0 = time.perf_counter()
    hr = b.post_recv(a.rank, tag, dst)
    hs = a.post_send(b.rank, tag, src)
    a.wait(hs, 240)
    b.wait(hr, 240)
    return size * 8 / (time.perf_counter() - t0)


def test_adaptive_spraying_fills_the_free_planes(erack, record_property):
    """One plane's last hop slowed to a quarter: oblivious round robin is held
    to four times the slow plane; adaptive spraying steers around it."""
    lab, eps = erack
    for node in ("h2", "h3"):  # fresh endpoints at both ends for each mode
        if node in eps:
            eps.pop(node).close()
    size = 32 * MiB
    results = {}
    try:
        lab.link_set("h3-plane0", "rate", "100G")
        for adaptive in (False, True):
            a, b = Endpoint(lab.name, "h2", adaptive=adaptive), Endpoint(lab.name, "h3")
            try:
                results["adaptive" if adaptive else "oblivious"] = _goodput_bps(a, b, size, 700)
            finally:
                a.close()
                b.close()
    finally:
        lab.link_set("h3-plane0", "rate", "400G")
    plane_bps = lab.rec["topology"]["links"][0]["params"]["rate_bps"] / lab.k
    ideal = (3 * plane_bps + plane_bps / 4) * 4096 / core.wire_bytes(4096 + 54)
    for k, v in results.items():
        record_property(f"{k}_fraction_of_ideal", round(v / ideal, 3))
    assert results["adaptive"] > 1.5 * results["oblivious"], results
    assert results["oblivious"] < 0.5 * ideal  # held back by the slow plane, as expected
    # target 0.9 (measured 0.93-0.95 by hand); a little slack for this noisy machine
    assert results["adaptive"] >= 0.85 * ideal, (results, ideal)


def test_two_senders_share_one_receiver_fairly(erack, record_property):
    lab, eps = erack
    for node in ("h1", "h5", "h6"):
        if node in eps:
            eps.pop(node).close()
    r, s1, s2 = (Endpoint(lab.name, h) for h in ("h1", "h5", "h6"))
    try:
        size = 64 * MiB
        bufs = [np.zeros(size, dtype=np.uint8) for _ in range(2)]
        hr = [r.post_recv(s.rank, 800, b) for s, b in zip((s1, s2), bufs, strict=True)]
        hs = [s.post_send(r.rank, 800, np.ones(size, dtype=np.uint8)) for s in (s1, s2)]
        time.sleep(1.0)
        c0 = [r.counters(s.rank)["rx_data_bytes"] for s in (s1, s2)]
        time.sleep(2.0)
        got = [r.counters(s.rank)["rx_data_bytes"] - c for s, c in zip((s1, s2), c0, strict=True)]
        for h, s in zip(hs, (s1, s2), strict=True):
            s.wait(h, 240)
        for h in hr:
            r.wait(h, 240)
    finally:
        for e in (r, s1, s2):
            e.close()
    share = got[0] / sum(got)
    record_property("share_first_sender", round(share, 3))
    # 0.45-0.54 in 28 runs; was 0.39-0.68 (docs); 0.44-0.53 and 0.47-0.50 in
    # six runs each alone (session 17), 0.417 once under the whole suite's load
    assert 0.40 <= share <= 0.60, got
    sw = lab.stats()["switches"]
    hwm = max(p["classes"]["data"]["q_hwm_bytes"] for s in sw.values() for p in s["ports"].values())
    trim = lab.rec["switch"]["trim_threshold_bytes"]
    record_property("data_queue_hwm_bytes", hwm)
    assert hwm <= trim + 9300  # trimming bounds the data queue: threshold plus one frame


def test_a_nic_receives_frame_by_frame_until_a_run_of_traffic_sets_its_ring_up(erack):
    """A fresh NIC has no RX ring (so no kernel timer runs while it waits):
    a small message comes in frame by frame, a large one sets the ring up,
    and after idling the ring is taken down; every byte arrives either way."""
    lab, eps = erack
    for node in ("h4", "h5", "h6"):  # one NIC per node: close the module's
        if node in eps:
            eps.pop(node).close()
    a, b, d = Endpoint(lab.name, "h4"), Endpoint(lab.name, "h5"), Endpoint(lab.name, "h6")
    try:
        transfer(a, b, 8 * KiB, tag=1)
        c = b.counters()
        assert c["rx_one_by_one"] >= 2 and c["ring_builds"] == 0
        # two senders at once: about 15 frames a millisecond into b
        size = 16 * MiB
        src = [np.full(size, i + 1, dtype=np.uint8) for i in range(2)]
        dst = [np.zeros(size, dtype=np.uint8) for _ in range(2)]
        hr = [b.post_recv(s.rank, 2, x) for s, x in zip((a, d), dst, strict=True)]
        hs = [s.post_send(b.rank, 2, x) for s, x in zip((a, d), src, strict=True)]
        for s, h in zip((a, d), hs, strict=True):
            assert s.wait(h, 120) == size
        for h in hr:
            assert b.wait(h, 120) == size
        assert all(np.array_equal(x, y) for x, y in zip(src, dst, strict=True))
        assert b.counters()["ring_builds"] >= 1
        # parked, and staying so: the tail of the transfer may have set a
        # ring up again (a set-up counts once the ring is joined)
        deadline, last = time.monotonic() + 10, None
        while True:
            c = b.counters()
            now = (c["ring_builds"], c["ring_parks"])
            if now[0] == now[1] and now == last:
                break
            assert time.monotonic() < deadline, c
            last = now
            time.sleep(0.3)
        before = b.counters()["rx_one_by_one"]
        transfer(a, b, 8 * KiB, tag=3)
        assert b.counters()["rx_one_by_one"] >= before + 2
    finally:
        for e in (a, b, d):
            e.close()


def test_unreachable_peer_fails_in_bounded_time(erack):
    lab, eps = erack
    if "h7" in eps:  # nobody answers for h7 while its NIC is closed
        eps.pop("h7").close()
    a = Endpoint(lab.name, "h3", max_retries=3)
    try:
        t0 = time.monotonic()
        h = a.post_send(7, 900, np.ones(100_000, dtype=np.uint8))
        with pytest.raises(Unreachable):
            a.wait(h, 30)
        assert time.monotonic() - t0 < 10
        assert a.counters(7)["retx_timeout"] > 0
    finally:
        a.close()


def test_buffer_too_small_and_unknown_peer_raise(erack):
    a, b = endpoint(erack, "h6"), endpoint(erack, "h7")
    small = np.zeros(1000, dtype=np.uint8)
    hr = b.post_recv(a.rank, 500, small)
    hs = a.post_send(b.rank, 500, np.ones(5000, dtype=np.uint8))
    with pytest.raises(BufferTooSmall):
        b.wait(hr, 30)
    a.wait(hs, 30)  # the sender's bytes were all acknowledged
    with pytest.raises(NicError, match="no such"):
        a.post_send(99, 1, small)
    with pytest.raises(NicError, match="no accelerator"):
        Endpoint(erack[0].name, "plane0")


def test_fuzz_malformed_eth_frames_at_an_endpoint(erack):
    lab, _ = erack
    a, b = endpoint(erack, "h1"), endpoint(erack, "h0")
    src = lab.port("h3", plane=1)
    dst_port = lab.port("h0", plane=1)
    # inject from the switch's side of h0's plane-1 link: every frame reaches h0
    sw = lab.nodes["plane1"]
    inject_if = next(p["ifname"] for p in sw["ports"] if p["peer"] == "h0")
    inject_ns = lab.rec["namespaces"]["plane1"]
    rng = random.Random(11)
    good = ethp_frame(src, dst_port, size=600, compact=True)
    frames = []
    for i in range(100_000):
        f = bytearray(good)
        kind = i % 4
        if kind == 0:
            f = f[: rng.randrange(15, 54)]  # truncated header
        elif kind == 1:
            f[14] = rng.choice(OTHER_VERSIONS) << 4 | 1  # unknown version
        elif kind == 2:
            f[14 + 24 : 14 + 26] = rng.randrange(601, 65536).to_bytes(2, "big")  # length lies
        else:
            f[14 + 4 : 14 + 6] = rng.randrange(100, 65536).to_bytes(2, "big")  # unknown source
        frames.append(bytes(f))
    size = 32 * MiB
    data = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
    out = np.zeros(size, dtype=np.uint8)
    c0 = b.counters()
    hr = b.post_recv(a.rank, 600, out)
    hs = a.post_send(b.rank, 600, data)
    send_paced(core.Port(inject_if, inject_ns), core.Pool(2048, 9300), frames, 40e6, burst=64)
    assert a.wait(hs, 120) == size and b.wait(hr, 120) == size
    assert np.array_equal(out, data)
    c1 = b.counters()
    d = {k: c1[k] - c0[k] for k in ("rx_malformed", "rx_spoofed", "rx_ring_drops")}
    # three kinds in four fail the parser; the fourth is well formed but
    # does not come from h0's switch (h3's MAC): refused as spoofed.  A frame
    # h0's RX ring dropped (its engine kept off the CPU: a fresh clone's
    # suite saw 48 of 100,000 go so) never reached the parser: the misses
    # may not exceed the ring's drops, and so few (a percent at most) cannot
    # hide a kind the parser let through
    unparsed = len(frames) * 3 // 4 - d["rx_malformed"]
    unrefused = len(frames) // 4 - d["rx_spoofed"]
    assert unparsed >= 0 and unrefused >= 0, d
    assert_missed_only_by_ring(unparsed + unrefused, d["rx_ring_drops"], d)
    assert d["rx_ring_drops"] <= len(frames) // 100, d


def test_host_kernel_never_answers_eth_frames(lab_name):
    """Over IPv4/UDP (clos-16), the hosts' kernels must not send ICMP port
    unreachable for ETH+ traffic."""
    ethplus("lab", "up", "clos-16", "--name", lab_name, check=True)
    lab = Lab(lab_name)
    a, b = Endpoint(lab_name, "h0"), Endpoint(lab_name, "h9")
    cap = Capture(lab.port("h0"))
    try:
        transfer(a, b, 4 * MiB, tag=1)
        frames = cap.drain(quiet_s=0.5)
    finally:
        cap.close()
        a.close()
        b.close()
    parsed = []
    for f in frames:
        try:
            parsed.append(core.parse_frame(f))
        except core.WireError:
            pass
    assert any(p.kind == "ethp-udp" for p in parsed)  # acks did come back
    assert not [p for p in parsed if p.ip_proto == 1], "a host answered with ICMP"


def test_nic_honours_pfc_on_a_lossless_fabric(tmp_path, lab_name):
    """Four senders into one receiver on a lossless erack: the switch pauses
    the senders' NICs, which hold their data; nothing is dropped."""
    f = tmp_path / "lossless-erack.toml"
    f.write_text(
        '[lab]\nfamily = "erack"\n[topology]\naccelerators = 5\nplanes = 2\n'
        "[switch]\nlossless = true\ntrimming = false\necn = false\n"
        "pfc_xoff_bytes = 30000\npfc_xon_bytes = 15000\n"
    )
    ethplus("lab", "up", str(f), "--name", lab_name, check=True)
    lab = Lab(lab_name)
    r = Endpoint(lab_name, "h4")
    senders = [Endpoint(lab_name, f"h{i}") for i in range(4)]
    try:
        size = 4 * MiB
        bufs = [np.zeros(size, dtype=np.uint8) for _ in senders]
        srcs = [np.full(size, i + 1, dtype=np.uint8) for i in range(4)]
        hr = [r.post_recv(s.rank, 1, b) for s, b in zip(senders, bufs, strict=True)]
        hs = [s.post_send(r.rank, 1, x) for s, x in zip(senders, srcs, strict=True)]
        for s, h in zip(senders, hs, strict=True):
            assert s.wait(h, 120) == size
        for h in hr:
            assert r.wait(h, 120) == size
        assert all(np.array_equal(b, x) for b, x in zip(bufs, srcs, strict=True))
        paused = sum(s.counters()["pauses_rx"] for s in senders)
    finally:
        for e in (r, *senders):
            e.close()
    t = stats.totals(lab.stats())
    assert t["pause_tx"] > 0 and paused > 0
    assert t["drop_queue_full"] == 0


def test_a_small_message_before_its_receive_is_kept_not_refused(erack):
    """A whole message of up to 64 bytes (a rendezvous' "ready") that comes
    before its receive is kept, as a NIC keeps control messages in a buffer
    that is always posted: no receiver-not-ready, and the receive posted
    later completes at once with its bytes.  A larger one is still refused
    until its receive is posted (the test below)."""
    lab, eps = erack
    for node in ("h2", "h5"):
        if node in eps:
            eps.pop(node).close()
    a, b = Endpoint(lab.name, "h2"), Endpoint(lab.name, "h5")
    try:
        msgs = [np.full(n, i + 1, dtype=np.uint8) for i, n in enumerate((1, 64, 17))]
        sends = [a.post_send(b.rank, 50 + i, m) for i, m in enumerate(msgs)]
        for h, m in zip(sends, msgs, strict=True):
            assert a.wait(h, 30) == m.nbytes  # acked with no receive posted
        outs = [np.zeros(64, dtype=np.uint8) for _ in msgs]
        for i in (2, 0, 1):  # posted in any order: each takes its tag's
            assert b.wait(b.post_recv(a.rank, 50 + i, outs[i]), 5) == msgs[i].nbytes
            assert np.array_equal(outs[i][: msgs[i].nbytes], msgs[i])
        c = a.counters(b.rank)
        assert c["rx_rnrs"] == 0, _moved(c)
    finally:
        a.close()
        b.close()


def test_late_receive_and_tag_mismatch(erack):
    """Data for a tag nobody posted draws receiver-not-ready replies: the
    sender retries at most 64 RTTs apart (no timeout needed) until the
    receive is posted, however late (here 1.5 s: the retry budget once
    ended under 1 s); if it never is, the send fails with NoReceive after
    the RNR timeout."""
    lab, eps = erack
    for node in ("h2", "h5"):
        if node in eps:
            eps.pop(node).close()
    a, b = Endpoint(lab.name, "h2", rnr_timeout_s=4.0), Endpoint(lab.name, "h5")
    try:
        data = np.arange(300_000, dtype=np.uint8)
        out = np.zeros_like(data)
        hs = a.post_send(b.rank, 42, data)
        time.sleep(1.5)  # the receive comes late
        hr = b.post_recv(a.rank, 42, out)
        assert a.wait(hs, 30) == data.nbytes and b.wait(hr, 30) == data.nbytes
        assert np.array_equal(out, data)
        c = a.counters(b.rank)
        # backoff rounds, not a retransmit-timeout ladder
        assert c["rx_rnrs"] > 0 and c["retx_timeout"] == 0, _moved(c)

        wrong = np.zeros(1000, dtype=np.uint8)
        b.post_recv(a.rank, 43, wrong)  # posted for another tag
        hs = a.post_send(b.rank, 44, np.ones(1000, dtype=np.uint8))
        with pytest.raises(NoReceive, match="tag mismatch"):
            a.wait(hs, 30)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("roce", [False, True])
def test_a_restarted_endpoint_talks_to_peers_that_kept_their_state(erack, roce):
    """Connection epochs: h6 and h7 exchange messages; h6 posts 8 MiB more for
    h7, which h7 never receives: h7 closes and a new h7 opens.  The new
    incarnation tells h6 (its stale frames draw a HELLO), h6 starts its
    unfinished message over, and messages both ways then arrive byte-exact
    within a bounded time."""
    lab, eps = erack
    for node in ("h6", "h7"):  # one NIC per node: close the module's
        if node in eps:
            eps.pop(node).close()
    a = Endpoint(lab.name, "h6", roce=roce)
    b = Endpoint(lab.name, "h7", roce=roce)
    b2 = None
    try:
        transfer(a, b, 1 * MiB, tag=1)
        transfer(b, a, 1 * MiB, tag=2)
        src = np.random.default_rng(3).integers(0, 256, 8 * MiB, dtype=np.uint8)
        hs = a.post_send(b.rank, 3, src)  # in flight to a receiver that will be gone
        time.sleep(0.2)
        b.close()
        b2 = Endpoint(lab.name, "h7", roce=roce)
        t0 = time.monotonic()
        dst = np.zeros(src.size, dtype=np.uint8)
        hr = b2.post_recv(a.rank, 3, dst)
        assert a.wait(hs, 30) == src.size and b2.wait(hr, 30) == src.size
        assert np.array_equal(src, dst), "the unfinished message was not started over whole"
        transfer(b2, a, 4 * MiB, tag=4, timeout_s=30)
        transfer(a, b2, 4 * MiB, tag=5, timeout_s=30)
        took = time.monotonic() - t0
        assert took < 15, f"{took:.1f} s to talk again after the restart"
        ca, cb = a.counters(), b2.counters()
        assert ca["peer_resets"] == 1, ca
        assert cb["tx_hellos"] >= 1 and cb["rx_stale_epoch"] >= 1, cb
    finally:
        a.close()
        (b2 or b).close()
