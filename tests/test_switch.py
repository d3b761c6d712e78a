"""The software switch, on real labs: kernel ping/TCP/iperf3 through it,
shaping, delay, ECN, trimming, overflow accounting, spraying, faults,
robustness.  Ground truth is the kernel's counters and captured frames."""

import ipaddress
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest
from conftest import ethplus
from labtools import (
    Capture,
    Lab,
    assert_missed_only_by_ring,
    capture_cli,
    ethp_frame,
    ethp_frames,
    if_stats,
    module_lab,
    send_paced,
)

from dataplane.lab import capture, core
from dataplane.model import routing
from dataplane.report import stats

pytestmark = pytest.mark.root


def _up(name: str, file: str, *extra: str) -> Lab:
    ethplus("lab", "up", file, "--name", name, *extra, check=True)
    return Lab(name)


erack = module_lab("sw", "erack-8x4")


clos = module_lab("sw", "clos-16")


def assert_conserved(lab: Lab) -> dict:
    st = lab.quiesce()
    c = stats.conservation(stats.totals(st))
    assert c["difference"] == 0, c
    return st


def _ping_all(lab: Lab, hosts: list[str]) -> None:
    """Every host pings every other host's every address, in parallel per source."""
    addrs = {h: [p["ip"] for p in lab.nodes[h]["ports"]] for h in hosts}
    for src in hosts:
        dsts = " ".join(ip for h in hosts if h != src for ip in addrs[h])
        script = (
            f"for d in {dsts}; do (ping -n -q -c 1 -W 3 $d >/dev/null || echo FAIL $d) & done; wait"
        )
        r = lab.sh(src, "sh", "-c", script, timeout=60)
        assert "FAIL" not in r.stdout, f"{src}: {r.stdout}"


TCP_ECHO = r"""
import hashlib, socket, sys
mode, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 5001)); s.listen(1); print("ready", flush=True)
    c, _ = s.accept(); h = hashlib.sha256(); got = 0
    while got < n:
        b = c.recv(1 << 16)
        if not b: break
        h.update(b); got += len(b)
    c.sendall(h.hexdigest().encode()); c.close()
else:
    data = bytes((i * 7) & 0xFF for i in range(n))
    c = socket.create_connection((addr, 5001), timeout=30); c.sendall(data)
    print(c.recv(64).decode() == hashlib.sha256(data).hexdigest())
"""


def _tcp_transfer(lab: Lab, src: str, dst: str, dst_ip: str, n_bytes: int = 2_000_000) -> None:
    ns = lab.rec["namespaces"][dst].rsplit("/", 1)[1]
    server = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", TCP_ECHO, "server", dst_ip, str(n_bytes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "ready"
        r = lab.sh(src, sys.executable, "-c", TCP_ECHO, "client", dst_ip, str(n_bytes), timeout=120)
        assert r.stdout.strip() == "True", r
    finally:
        server.kill()
        server.wait()


# ---------------------------------------------------------------- reachability


def test_ping_every_pair_erack(erack):
    _ping_all(erack, [f"h{i}" for i in range(8)])
    assert_conserved(erack)


def test_ping_every_pair_clos(clos):
    _ping_all(clos, [f"h{i}" for i in range(16)])
    assert_conserved(clos)


def _kernel_ip_counters(lab: Lab, node: str) -> dict[str, int]:
    """The IPv4 counters of a node's own kernel (its namespace's /proc/net/snmp)."""
    lines = [x.split() for x in lab.sh(node, "cat", "/proc/net/snmp").stdout.splitlines()]
    names, values = (x for x in lines if x[0] == "Ip:")
    return dict(zip(names[1:], map(int, values[1:]), strict=True))


def test_switch_namespace_kernels_leave_lab_frames_alone(erack):
    # The switch's ring takes its copy; the switch namespace's own kernel
    # must discard the frame as for another host, not try to route it
    # (each would count an address error there) or answer it.
    switches = [n for n, x in erack.nodes.items() if x["role"] == "switch"]
    before = {sw: _kernel_ip_counters(erack, sw) for sw in switches}
    rx0 = erack.totals()["rx_frames"]
    dst = erack.nodes["h6"]["ports"][1]["ip"]
    erack.sh("h1", "ping", "-n", "-q", "-c", "200", "-i", "0.005", dst, timeout=60)
    assert erack.totals()["rx_frames"] - rx0 >= 400  # requests and replies crossed a switch
    for sw in switches:
        after = _kernel_ip_counters(erack, sw)
        moved = {k: after[k] - before[sw][k] for k in after if after[k] != before[sw][k]}
        assert moved == {}, (sw, moved)


def test_kernel_tcp_byte_exact_through_switches(erack, clos):
    _tcp_transfer(erack, "h0", "h7", erack.nodes["h7"]["ports"][3]["ip"])  # plane 3
    _tcp_transfer(clos, "h0", "h15", clos.nodes["h15"]["ports"][0]["ip"])  # leaf0 -> spine -> leaf3
    t = clos.totals()
    assert t["tx_frames"] > 400  # it really went through the switches


def _rx_modes(lab: Lab, timeout_s: float = 0.0, ring_up: bool | None = None) -> dict:
    """Each switch's receive mode (the `rx` block of `lab stats --json`),
    waiting up to timeout_s for every ring to be ring_up."""
    end = time.monotonic() + timeout_s
    while True:
        rx = {name: sw["rx"] for name, sw in lab.stats()["switches"].items()}
        if ring_up is None or all(bool(r["ring_up"]) == ring_up for r in rx.values()):
            return rx
        assert time.monotonic() < end, rx
        time.sleep(0.05)


def test_an_idle_switch_has_no_ring_traffic_sets_one_up_and_idling_parks_it(erack):
    """No RX ring while idle (so no kernel timer runs): a ping goes through
    frame by frame, a stream of small UDP frames (25 a millisecond) sets the
    ring up on the switch it crosses, and once idle again the ring is taken
    down."""
    before = _rx_modes(erack, timeout_s=5, ring_up=False)
    ip3 = erack.nodes["h7"]["ports"][3]["ip"]
    erack.sh("h0", "ping", "-n", "-q", "-c", "3", "-i", "0.2", ip3)
    after_ping = _rx_modes(erack)
    assert after_ping["plane3"]["rx_one_by_one"] >= before["plane3"]["rx_one_by_one"] + 6
    assert after_ping["plane3"]["ring_builds"] == before["plane3"]["ring_builds"]
    ns = erack.rec["namespaces"]["h7"].rsplit("/", 1)[1]
    subprocess.run(
        ["ip", "netns", "exec", ns, "iperf3", "-s", "-D", "-1", "-B", ip3],
        check=True,
        capture_output=True,
    )
    time.sleep(0.3)
    erack.sh("h0", "iperf3", "-c", ip3, "-u", "-b", "40M", "-l", "200", "-t", "1", timeout=60)
    busy = _rx_modes(erack)
    built = busy["plane3"]["ring_builds"] - before["plane3"]["ring_builds"]
    assert built >= 1 and busy["plane3"]["ring_failures"] == 0
    assert busy["plane1"]["ring_builds"] == before["plane1"]["ring_builds"]  # not on its path
    idle = _rx_modes(erack, timeout_s=5, ring_up=False)
    assert idle["plane3"]["ring_parks"] - before["plane3"]["ring_parks"] == built
    assert "receiving frame by frame" in ethplus("lab", "stats", erack.name).stdout
    assert_conserved(erack)


# ---------------------------------------------------------------- shaping and delay


def _iperf_bps(
    lab: Lab, src: str, dst: str, dst_ip: str, seconds: int = 5, streams: int = 1
) -> float:
    ns = lab.rec["namespaces"][dst].rsplit("/", 1)[1]
    subprocess.run(
        ["ip", "netns", "exec", ns, "iperf3", "-s", "-D", "-1", "-B", dst_ip],
        check=True,
        capture_output=True,
    )
    time.sleep(0.3)
    r = lab.sh(
        src, "iperf3", "-c", dst_ip, "-t", str(seconds), "-O", "1", "-P", str(streams), "-J",
        timeout=60,
    )  # fmt: skip
    return json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"]


def test_stats_watch_shows_a_busy_link_each_interval(erack):
    """`lab stats --watch --json` while iperf3 runs h0 -> h1 on plane 1: one
    object per interval, in which plane1's port to h1 sends near its link's
    rate and never above it, and what it shows agrees with the goodput
    iperf3 measured."""
    dst_ip = erack.nodes["h1"]["ports"][1]["ip"]
    done: list[float] = []
    t = threading.Thread(target=lambda: done.append(_iperf_bps(erack, "h0", "h1", dst_ip, 5)))
    t.start()
    try:
        time.sleep(1.5)
        watch = ("--watch", "1", "--count", "3", "--json")
        r = ethplus("lab", "stats", erack.name, *watch, check=True)
    finally:
        t.join()
    intervals = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(intervals) == 3 and intervals[-1]["t_s"] >= 2.9, r.stdout
    utils = [
        c["tx_util"]
        for i in intervals
        for c in i["switches"].get("plane1", {}).values()
        if c["peer"] == "h1"
    ]
    assert len(utils) == 3 and all(0.6 < u <= 1.03 for u in utils), utils
    # iperf3's goodput, as frames on that link (TCP/IP headers on an MTU's payload)
    link = erack.links["h1-plane1"]["params"]
    mtu = link["mtu_bytes"]
    expected = done[0] * erack.k * (mtu + 14) / (mtu - 52) / link["rate_bps"]
    assert abs(statistics.mean(utils) / expected - 1) < 0.1, (utils, expected)


def _tcp_goodput_fraction(mtu: int) -> float:
    """TCP payload per wire byte: IPv4 20 + TCP 32 (timestamps) inside the MTU;
    Ethernet 14 + FCS 4 + preamble 8 + gap 12 outside."""
    return (mtu - 52) / core.wire_bytes(mtu + 14)


@pytest.mark.parametrize("real_mbps", [20, 45])
def test_iperf3_achieves_the_shaped_rate(erack, real_mbps):
    """Two TCP streams fill a shaped link to its rate, whatever the lab's
    congestion control.  (One reno stream under ECN does not: it halves its
    window at the switch's first marks, at 0.2 BDP of queue, and its
    sawtooth then dips below the BDP: 0.93 of the rate at 45 Mbit/s real.)"""
    link = "h1-plane1"
    nominal_bps = real_mbps * 1e6 * erack.k
    try:
        erack.link_set(link, "rate", f"{nominal_bps / 1e9:.6f}G")
        bps = _iperf_bps(erack, "h0", "h1", erack.nodes["h1"]["ports"][1]["ip"], streams=2)
    finally:
        erack.link_set(link, "rate", "400G")
    expected = real_mbps * 1e6 * _tcp_goodput_fraction(4200)
    assert abs(bps - expected) / expected < 0.05, (bps, expected)


def _ping_rtt_ms(lab: Lab, src: str, dst_ip: str, n: int = 12) -> float:
    r = lab.sh(src, "ping", "-n", "-c", str(n), "-i", "0.05", dst_ip, timeout=60)
    rtts = sorted(float(x) for x in re.findall(r"time=([\d.]+) ms", r.stdout))
    assert len(rtts) == n, r.stdout
    return rtts[n // 2]


def test_link_delay_shows_in_ping_rtt(erack):
    dst = erack.nodes["h3"]["ports"][2]["ip"]
    links = ("h2-plane2", "h3-plane2")
    try:
        for lk in links:
            erack.link_set(lk, "delay", "0")
        base_ms = _ping_rtt_ms(erack, "h2", dst)
        erack.link_set("h3-plane2", "delay", "2us")
        rtt_ms = _ping_rtt_ms(erack, "h2", dst)
    finally:
        for lk in links:
            erack.link_set(lk, "delay", "500ns")
    # the path crosses h3-plane2 twice per round trip
    expected_ms = base_ms + 2 * 2e-6 * erack.k * 1e3
    assert abs(rtt_ms - expected_ms) / expected_ms < 0.10, (rtt_ms, expected_ms, base_ms)


# ---------------------------------------------------------------- congestion


def _incast(lab: Lab, senders: list[str], dst: str, plane: int, n_each: int, **frame_kw) -> list:
    """Several hosts blast ETH+ frames at one host on one plane; returns captured frames."""
    d = lab.port(dst, plane=plane)
    cap = Capture(d)
    pool = core.Pool(4096, 9300)
    try:
        threads = []
        for i, s in enumerate(senders):
            sp = lab.port(s, plane=plane)
            frames = [
                ethp_frame(sp, d, psn=j, entropy=i * 1000 + j, **frame_kw) for j in range(n_each)
            ]
            port = core.Port(sp.ifname, sp.ns)
            threads.append(
                threading.Thread(target=send_paced, args=(port, pool, frames, 60e6 / 1.0))
            )
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return cap.drain()
    finally:
        cap.close()


def _frames_to(frames: list[bytes], dst: int) -> list[core.Parsed]:
    return [p for p in ethp_frames(frames) if p.addr.dst_ip == dst]


def test_congested_egress_marks_ce_and_receiver_sees_it(erack):
    d = erack.port("h4", plane=0)
    got = _frames_to(_incast(erack, ["h5", "h6", "h7"], "h4", 0, 300, size=3000, tos=0x02), d.ip)
    assert got
    ce = [p for p in got if p.ecn == 3]
    assert ce, "no CE mark reached the receiver"
    assert all(p.ecn in (2, 3) for p in got)
    t = erack.quiesce()["switches"]["plane0"]["ports"]
    marked = sum(p["ecn_marked"] for p in t.values())
    assert marked >= len(ce)
    assert_conserved(erack)


def test_trimming_cuts_payload_and_flags_it(erack):
    d = erack.port("h0", plane=1)
    got = _frames_to(
        _incast(
            erack, ["h1", "h2", "h3", "h4"], "h0", 1, 300, size=4000, flags=core.FLAGS["trimmable"]
        ),
        d.ip,
    )
    trimmed = [p for p in got if p.header.flags & core.FLAGS["trimmed"]]
    assert trimmed, "a synchronised burst produced no trimmed frame"
    for p in trimmed:
        assert p.payload == b"" and p.header.len_bytes == 4000
    intact = [p for p in got if not p.header.flags & core.FLAGS["trimmed"]]
    for p in intact:
        assert len(p.payload) == 4000
    st = assert_conserved(erack)
    assert sum(p["trimmed"] for p in st["switches"]["plane1"]["ports"].values()) >= len(trimmed)


def test_overflow_drops_equal_frames_lost_exactly(erack):
    """Sent minus received, from the kernel's interface counters, equals the
    switch's counted drops: no frame vanishes unaccounted."""
    plane = 2
    hosts = [f"h{i}" for i in range(8)]
    ports = {h: erack.port(h, plane=plane) for h in hosts}
    before = {h: if_stats(p.ns, p.ifname) for h, p in ports.items()}
    st0 = erack.stats()
    _incast(erack, ["h0", "h1", "h2", "h3", "h5", "h6"], "h7", plane, 400, size=4000)
    st1 = assert_conserved(erack)
    after = {h: if_stats(p.ns, p.ifname) for h, p in ports.items()}
    sent = sum(after[h]["tx_packets"] - before[h]["tx_packets"] for h in hosts)
    received = sum(after[h]["rx_packets"] - before[h]["rx_packets"] for h in hosts)

    sw = f"plane{plane}"
    dropped = stats.switch_drops(st1["switches"][sw]) - stats.switch_drops(st0["switches"][sw])
    assert dropped > 0, "the burst did not overflow the buffer"
    assert sent - received == dropped


# ---------------------------------------------------------------- spraying


def test_spraying_spreads_over_all_spines_tcp_stays_on_one(clos):
    src, dst = clos.port("h0"), clos.port("h4")  # leaf0 -> leaf1 over 4 spines
    leaf_ports = {p["peer"]: p["ifname"] for p in clos.nodes["leaf0"]["ports"]}
    spines = [f"spine{i}" for i in range(4)]

    def spine_tx():
        ports = clos.stats()["switches"]["leaf0"]["ports"]
        return [ports[leaf_ports[s]]["tx_frames"] for s in spines]

    rng = random.Random(7)
    n = 4000
    frames = [ethp_frame(src, dst, size=200, entropy=rng.randrange(65536), psn=i) for i in range(n)]
    before = spine_tx()
    send_paced(core.Port(src.ifname, src.ns), core.Pool(1024, 9300), frames, 50e6)
    clos.quiesce()
    counts = [a - b for a, b in zip(spine_tx(), before, strict=True)]
    assert sum(counts) == n
    chi2 = sum((c - n / 4) ** 2 / (n / 4) for c in counts)
    assert chi2 < 16.27, counts  # 3 degrees of freedom, p = 0.001

    for flow in range(3):
        before = spine_tx()
        _tcp_transfer(clos, "h0", "h4", clos.nodes["h4"]["ports"][0]["ip"], 300_000 + flow)
        clos.quiesce()
        used = [a - b for a, b in zip(spine_tx(), before, strict=True)]
        assert sum(1 for u in used if u > 0) == 1, used  # one flow, one spine


# ---------------------------------------------------------------- faults


def test_link_down_counts_and_up_restores(erack):
    dst = erack.nodes["h6"]["ports"][0]["ip"]
    try:
        erack.link_set("h6-plane0", "down")
        r = erack.sh("h5", "ping", "-n", "-c", "3", "-i", "0.1", "-W", "1", dst, check=False)
        assert r.returncode != 0
        port = erack.stats()["switches"]["plane0"]["ports"]
        assert sum(p["drop_link_down"] for p in port.values()) >= 3
    finally:
        erack.link_set("h6-plane0", "up")
    assert erack.sh("h5", "ping", "-n", "-c", "2", "-W", "3", dst, check=False).returncode == 0


def test_injected_loss_rate(erack):
    src, dst = erack.port("h2", plane=3), erack.port("h3", plane=3)
    n = 20000
    frames = [ethp_frame(src, dst, size=64, psn=i, entropy=i) for i in range(n)]
    before = if_stats(dst.ns, dst.ifname)["rx_packets"]
    try:
        erack.link_set("h3-plane3", "loss", "1%")
        send_paced(core.Port(src.ifname, src.ns), core.Pool(1024, 9300), frames, 40e6)
        erack.quiesce()
    finally:
        erack.link_set("h3-plane3", "loss", "0")
    received = if_stats(dst.ns, dst.ifname)["rx_packets"] - before
    lost = (n - received) / n
    assert 0.007 < lost < 0.013, (
        lost,
        {k: v for k, v in erack.totals().items() if k.startswith("drop") and v},
    )
    assert_conserved(erack)


def test_injected_corruption_is_dropped_as_a_bad_fcs_would_be(erack):
    src, dst = erack.port("h5", plane=2), erack.port("h1", plane=2)
    n = 5000
    # the compact form: no host kernel answers it, so only these frames cross the link
    frames = [ethp_frame(src, dst, size=200, psn=i, entropy=i, compact=True) for i in range(n)]
    before = if_stats(dst.ns, dst.ifname)["rx_packets"]
    t0 = erack.totals()
    try:
        erack.link_set("h5-plane2", "corrupt", "5%")  # host -> switch direction
        send_paced(core.Port(src.ifname, src.ns), core.Pool(1024, 9300), frames, 40e6)
        erack.quiesce()
    finally:
        erack.link_set("h5-plane2", "corrupt", "0")
    received = if_stats(dst.ns, dst.ifname)["rx_packets"] - before
    corrupted = erack.totals()["drop_corrupt"] - t0["drop_corrupt"]
    assert n - received == corrupted
    assert 0.035 < corrupted / n < 0.065, corrupted


def _ping_rtts_ms(lab: Lab, src: str, dst_ip: str, n: int) -> list[float]:
    r = lab.sh(src, "ping", "-n", "-c", str(n), "-i", "0.05", "-W", "2", dst_ip)
    rtts = [float(x) for x in re.findall(r"time=([\d.]+) ms", r.stdout)]
    assert len(rtts) == n, r.stdout
    return rtts


def test_link_jitter_spreads_delay_and_keeps_order(erack):
    """A link with jitter J: each crossing waits the link's delay plus a
    uniform draw of up to J, so a ping's two crossings add J on average and
    spread its RTT over more than J; frames on the link keep their order."""
    lk = "h3-plane2"
    dst = next(p for p in erack.nodes["h3"]["ports"] if p["plane"] == 2)["ip"]
    j_ms = 1000 * erack.k / 1e6  # 1 us nominal
    src_p, dst_p = erack.port("h6", plane=2), erack.port("h3", plane=2)
    frames = [ethp_frame(src_p, dst_p, size=500, psn=i, compact=True) for i in range(300)]
    base = _ping_rtts_ms(erack, "h4", dst, 20)
    cap = Capture(dst_p)
    try:
        erack.link_set(lk, "jitter", "1us")
        jittered = _ping_rtts_ms(erack, "h4", dst, 40)
        send_paced(core.Port(src_p.ifname, src_p.ns), core.Pool(512, 9300), frames, 20e6)
        got = [p for p in ethp_frames(cap.drain(quiet_s=1.0)) if p.header.dst_ep == dst_p.ep]
    finally:
        cap.close()
        erack.link_set(lk, "jitter", "0")
    added = statistics.mean(jittered) - statistics.mean(base)
    assert 0.7 * j_ms < added < 1.3 * j_ms, (added, j_ms)
    assert max(jittered) - min(jittered) > j_ms, jittered
    assert [p.header.psn for p in got] == list(range(300))


def test_a_long_link_holds_over_a_thousand_frames_in_flight_in_order(erack):
    """A link whose delay holds far more frames than a few (a long cable at
    full rate): every frame crosses it, once, in the order sent, on both
    of its delay lines (the host's side into the switch, the switch's out
    to the next host), while frames keep joining and leaving them."""
    links = ("h6-plane2", "h3-plane2")
    delay_us = 40  # x k: about 0.26 s of real time at k 6400, 1,200 frames
    src_p, dst_p = erack.port("h6", plane=2), erack.port("h3", plane=2)
    frames = [ethp_frame(src_p, dst_p, size=500, psn=i, compact=True) for i in range(4000)]
    ring0 = stats.totals(erack.stats()).get("drop_ring", 0)
    cap = Capture(dst_p)
    try:
        for lk in links:
            erack.link_set(lk, "delay", f"{delay_us}us")
        send_paced(core.Port(src_p.ifname, src_p.ns), core.Pool(512, 9300), frames, 20e6)
        had = len(cap.frames)  # what h3 had received when h6 had sent every frame
        got = [p for p in ethp_frames(cap.drain(quiet_s=2.0)) if p.header.dst_ep == dst_p.ep]
    finally:
        cap.close()
        for lk in links:
            erack.link_set(lk, "delay", "500ns")  # the lab file's
    # the rest were on the link then: about 2,400 at k 6400 (a second's
    # sending spread over 0.26 s of delay on each line)
    assert len(frames) - had > 1000, had
    psns = [p.header.psn for p in got]
    assert psns == sorted(set(psns)), "frames reordered or repeated on the link"
    # every frame, unless a switch's RX ring dropped it
    ring_drops = stats.totals(erack.stats()).get("drop_ring", 0) - ring0
    assert_missed_only_by_ring(len(frames) - len(psns), ring_drops, (len(psns), ring_drops))
    assert ring_drops <= len(frames) // 100, ring_drops


def _llr_links(lab: Lab, links: tuple[str, ...], *change: str) -> None:
    for link in links:
        lab.link_set(link, *change)


def test_link_level_retry_repairs_corruption_in_order(erack):
    """With LLR on, the hop replays a corrupted frame: every frame arrives,
    once and in order, and no drop is counted; each replay costs the link a
    round trip (the NACK's trip back) and the frame's time again.  That is
    go-back-N's price, a link round trip of capacity per error (here, where
    frames are small, about 190 of these frames' time): the offered load
    leaves room for it."""
    src, dst = erack.port("h5", plane=2), erack.port("h1", plane=2)
    links = ("h5-plane2", "h1-plane2")  # into the switch, and out of it
    n = 3000
    frames = [ethp_frame(src, dst, size=200, psn=i, entropy=7, compact=True) for i in range(n)]
    t0 = erack.totals()
    cap = Capture(dst)
    try:
        _llr_links(erack, links, "llr", "on")
        _llr_links(erack, links, "corrupt", "1%")
        send_paced(core.Port(src.ifname, src.ns), core.Pool(1024, 9300), frames, 10e6)
        st = assert_conserved(erack)
        got = [p for p in ethp_frames(cap.drain(quiet_s=1.0)) if p.header.dst_ep == dst.ep]
    finally:
        cap.close()
        _llr_links(erack, links, "corrupt", "0")
        _llr_links(erack, links, "llr", "off")
    t = {k: v - t0.get(k, 0) for k, v in stats.totals(st).items()}
    assert [p.header.psn for p in got] == list(range(n))
    assert sum(t[k] for k in stats.DROP_REASONS) == 0, t
    # 1% on each of two traversals: 60 expected
    assert 35 < t["llr_replays"] < 90, t["llr_replays"]
    round_trip_ns = 2 * erack.links["h5-plane2"]["params"]["delay_ns"] * erack.k
    assert t["llr_replay_ns"] >= t["llr_replays"] * round_trip_ns


def test_link_level_retry_gives_up_on_a_dead_link(erack):
    """A link that corrupts every frame: LLR replays each a bounded number
    of times, then drops it as corrupt; the switch keeps its accounting."""
    src, dst = erack.port("h6", plane=1), erack.port("h2", plane=1)
    n = 10
    frames = [ethp_frame(src, dst, size=200, psn=i, compact=True) for i in range(n)]
    t0 = erack.totals()
    before = if_stats(dst.ns, dst.ifname)["rx_packets"]
    try:
        erack.link_set("h6-plane1", "llr", "on")
        erack.link_set("h6-plane1", "corrupt", "100%")
        send_paced(core.Port(src.ifname, src.ns), core.Pool(64, 9300), frames, 1e6)
        st = assert_conserved(erack)
    finally:
        erack.link_set("h6-plane1", "corrupt", "0")
        erack.link_set("h6-plane1", "llr", "off")
    t = {k: v - t0.get(k, 0) for k, v in stats.totals(st).items()}
    assert if_stats(dst.ns, dst.ifname)["rx_packets"] == before  # nothing got through
    assert t["drop_corrupt"] == n
    assert t["llr_replays"] == 8 * n


def test_llr_from_the_lab_file(tmp_path, lab_name):
    """`llr = true` in [link] turns it on for every link of the lab, as
    `lab show` says; a corrupting link then replays instead of dropping."""
    f = tmp_path / "llr.toml"
    f.write_text(
        '[lab]\nfamily = "erack"\n[topology]\naccelerators = 2\nplanes = 1\n[link]\nllr = true\n'
    )
    lab = _up(lab_name, str(f))
    shown = ethplus("lab", "show", lab_name, check=True).stdout
    assert re.search(r"^h0-plane0 .* on$", shown, re.M), shown
    src, dst = lab.port("h0"), lab.port("h1")
    lab.link_set("h0-plane0", "corrupt", "10%")
    frames = [ethp_frame(src, dst, size=200, psn=i, compact=True) for i in range(200)]
    before = if_stats(dst.ns, dst.ifname)["rx_packets"]
    send_paced(core.Port(src.ifname, src.ns), core.Pool(256, 9300), frames, 2e6)
    t = stats.totals(assert_conserved(lab))
    assert if_stats(dst.ns, dst.ifname)["rx_packets"] - before == 200  # every frame, replayed
    assert t["llr_replays"] > 5 and t["drop_corrupt"] == 0, t


def test_ping_through_a_corrupting_link_with_llr_loses_nothing(erack):
    """Kernel ping over a link corrupting 20% of frames each way: with LLR
    nothing is lost, and the replayed echoes come back a link round trip
    late; without it a third of the pings die."""
    dst = next(p["ip"] for p in erack.nodes["h3"]["ports"] if p["plane"] == 3)
    lk = "h3-plane3"
    rtt_ns = 2 * erack.links[lk]["params"]["delay_ns"] * erack.k

    def ping() -> tuple[int, list[float]]:
        r = erack.sh("h4", "ping", "-n", "-c", "40", "-i", "0.05", "-W", "1", dst, check=False)
        return len(re.findall(r"time=", r.stdout)), [
            float(x) for x in re.findall(r"time=([\d.]+) ms", r.stdout)
        ]

    try:
        erack.link_set(lk, "corrupt", "20%")
        lost_without = 40 - ping()[0]
        erack.link_set(lk, "llr", "on")
        answered, rtts_ms = ping()
    finally:
        erack.link_set(lk, "corrupt", "0")
        erack.link_set(lk, "llr", "off")
    assert lost_without >= 5, lost_without
    assert answered == 40
    late = [t for t in rtts_ms if t > min(rtts_ms) + 0.9 * rtt_ns / 1e6]
    assert len(late) >= 5, rtts_ms


def test_plane_down_and_up(erack):
    dst = erack.nodes["h1"]["ports"][3]["ip"]
    try:
        ethplus("node", "set", erack.name, "plane3", "down", check=True)
        r = erack.sh("h0", "ping", "-n", "-c", "2", "-i", "0.1", "-W", "1", dst, check=False)
        assert r.returncode != 0
        ports = erack.stats()["switches"]["plane3"]["ports"]
        assert sum(p["drop_node_down"] for p in ports.values()) >= 2
        other = erack.nodes["h1"]["ports"][2]["ip"]
        assert (
            erack.sh("h0", "ping", "-n", "-c", "1", "-W", "3", other, check=False).returncode == 0
        )
    finally:
        ethplus("node", "set", erack.name, "plane3", "up", check=True)
    assert erack.sh("h0", "ping", "-n", "-c", "2", "-W", "3", dst, check=False).returncode == 0


def test_capture_writes_both_directions_of_a_link_to_pcap(erack, tmp_path):
    out = tmp_path / "h0.pcap"
    h0 = next(p["ip"] for p in erack.nodes["h0"]["ports"] if p["plane"] == 0)
    h1 = next(p["ip"] for p in erack.nodes["h1"]["ports"] if p["plane"] == 0)
    p = capture_cli(erack, "h0-plane0", "-w", str(out), "-c", "4", "--seconds", "30")
    erack.sh("h0", "ping", "-n", "-c", "2", "-i", "0.3", h1)
    _, err = p.communicate(timeout=40)
    assert p.returncode == 0 and "4 frames into" in err, err
    recs = capture.read_pcap(str(out))
    icmp = [(t, core.parse_frame(f).addr) for t, f in recs]
    ips = [
        (str(ipaddress.IPv4Address(a.src_ip)), str(ipaddress.IPv4Address(a.dst_ip)))
        for _, a in icmp
    ]
    assert ips == [(h0, h1), (h1, h0)] * 2, ips
    # a request is seen entering the link at the switch, its reply leaving it
    # at h0: four link delays apart (h0's link both ways, h1's both ways)
    four_delays_ns = 4 * erack.links["h0-plane0"]["params"]["delay_ns"] * erack.k
    for (t_req, _), (t_rep, _) in (icmp[0:2], icmp[2:4]):
        assert t_rep - t_req >= 0.9 * four_delays_ns, (t_rep - t_req, four_delays_ns)


def test_capture_prints_a_line_per_frame(erack):
    h2 = next(p["ip"] for p in erack.nodes["h2"]["ports"] if p["plane"] == 1)
    p = capture_cli(erack, "h2-plane1", "-c", "2", "--seconds", "30")
    erack.sh("h3", "ping", "-n", "-c", "1", h2)
    out, err = p.communicate(timeout=40)
    lines = out.splitlines()
    assert p.returncode == 0 and len(lines) == 2, (out, err)
    assert "plane1 > h2" in lines[0] and "ICMP" in lines[0] and f"> {h2}" in lines[0]
    assert "h2 > plane1" in lines[1] and "ICMP" in lines[1]
    r = ethplus("capture", erack.name, "no-such-link", "-c", "1")
    assert (
        r.returncode == 1 and "no link 'no-such-link'" in r.stderr and "Traceback" not in r.stderr
    )


def test_capture_stops_when_its_lab_goes_down(tmp_path, lab_name):
    f = tmp_path / "tiny.toml"
    f.write_text('[lab]\nfamily = "erack"\n[topology]\naccelerators = 2\nplanes = 1\n')
    lab = _up(lab_name, str(f))
    p = capture_cli(lab, "h0-plane0")
    ethplus("lab", "down", lab_name, check=True)
    _, err = p.communicate(timeout=20)
    assert p.returncode == 1 and f"lab {lab_name} went down" in err, err


def test_fault_commands_reject_bad_input(erack):
    for args, msg in [
        (("no-such-link", "down"), "no link 'no-such-link'"),
        (("h0-plane0", "loss", "150%"), "expected a probability"),
        (("h0-plane0", "rate", "0G"), "expected a rate"),
        (("h0-plane0", "delay", "soon"), "expected a delay"),
        (("h0-plane0", "jitter", "lots"), "expected a delay"),
        (("h0-plane0", "explode"), "expected one of"),
        (("h0-plane0", "llr", "maybe"), "llr on|off"),
    ]:
        r = ethplus("link", "set", erack.name, *args)
        assert r.returncode == 1 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = ethplus("node", "set", erack.name, "h0", "down")
    assert r.returncode == 1 and "no switch 'h0'" in r.stderr


# ---------------------------------------------------------------- robustness


def _bad_contribution(rng: random.Random, src, agg_id: int) -> bytes:
    """An in-network all-reduce contribution to src's switch's aggregator
    with one field out of range (members, index, window, type, operator, or
    a length that is no whole number of elements)."""
    members, index, window, dtype, op, size = 4, 1, 8, 0, 0, 64
    which = rng.randrange(6)
    if which == 0:
        members = 0
    elif which == 1:
        index = members + rng.randrange(100)
    elif which == 2:
        window = rng.choice([0, 5000])
    elif which == 3:
        dtype = rng.randrange(4, 256)
    elif which == 4:
        op = rng.randrange(3, 256)
    else:
        size = 4 * rng.randrange(1, 100) + rng.randrange(1, 4)
    lib = core.lib
    addr = core.Addr(dst_mac=src.gw_mac, src_mac=src.mac, src_ip=src.ip,
                     dst_ip=lib.ETHP_AGG_NET + agg_id, src_port=0xC000,
                     dst_port=core.UDP_PORT)  # fmt: skip
    hdr = core.Header(opcode=lib.ETHP_OP_AGG, src_ep=src.ep, dst_ep=lib.ETHP_AGG_EP_BASE + agg_id,
                      msg_id=rng.randrange(1 << 32), psn=rng.randrange(1 << 32),
                      tag=members << 16 | index, len_bytes=size,
                      ts_ns=dtype << 24 | op << 16 | window)  # fmt: skip
    return core.build_frame(addr, hdr, bytes(size))


def _garbage(rng: random.Random, src, agg_id: int) -> bytes:
    kind = rng.randrange(6)
    if kind == 5:
        return _bad_contribution(rng, src, agg_id)
    eth = src.gw_mac + src.mac
    if kind == 0:  # random bytes
        return rng.randbytes(rng.randrange(14, 200))
    if kind == 1:  # bad EtherType
        return eth + rng.randrange(0x0600, 0xFFFF).to_bytes(2, "big") + bytes(40)
    good = ethp_frame(src, src, size=rng.randrange(0, 300), psn=rng.randrange(1 << 30))
    if kind == 2:  # truncated
        return good[: rng.randrange(14, max(15, len(good) - 1))]
    if kind == 3:  # IPv4 total length beyond the frame (checksum fixed: only the length lies)
        b = bytearray(good)
        b[16:18] = min(65535, len(good) - 14 + rng.randrange(1, 1000)).to_bytes(2, "big")
        b[24:26] = b"\0\0"
        c = core.inet_csum(bytes(b[14:34]))
        b[24:26] = c.to_bytes(2, "big")
        return bytes(b)
    b = bytearray(good)  # ETH+ length larger than the payload it carries
    b[42 + 24 : 42 + 26] = (len(good) - 82 + rng.randrange(1, 1000)).to_bytes(2, "big")
    return bytes(b)


def test_switch_survives_100k_malformed_frames_and_keeps_forwarding(erack):
    """Random bytes, bad EtherTypes, truncated frames, lying lengths and
    aggregator contributions with fields out of range."""
    src = erack.port("h4", plane=1)
    rng = random.Random(3)
    agg_id = routing.switch_ids(erack.rec["topology"])["plane1"]
    frames = [_garbage(rng, src, agg_id) for _ in range(100_000)]
    before_tx = if_stats(src.ns, src.ifname)["tx_packets"]
    st0 = stats.totals(erack.stats())
    dst = erack.nodes["h5"]["ports"][1]["ip"]
    ns = erack.rec["namespaces"]["h6"].rsplit("/", 1)[1]
    ping = subprocess.Popen(
        ["ip", "netns", "exec", ns, "ping", "-n", "-q", "-i", "0.05", "-W", "2", "-c", "60", dst],
        stdout=subprocess.PIPE,
        text=True,
    )
    send_paced(core.Port(src.ifname, src.ns), core.Pool(2048, 9300), frames, 55e6, burst=64)
    out, _ = ping.communicate(timeout=60)
    assert " 0% packet loss" in out, out
    erack.quiesce()
    injected = if_stats(src.ns, src.ifname)["tx_packets"] - before_tx
    assert injected >= 100_000
    st1 = stats.totals(erack.stats())
    delta = {
        k: st1[k] - st0[k] for k in (*stats.DROP_REASONS, *stats.LOST_BEFORE_READ, "ctl_consumed")
    }
    assert sum(delta.values()) == injected, delta
    assert st1["drop_malformed"] - st0["drop_malformed"] > 30_000
    assert st1["agg_consumed"] == st0["agg_consumed"]  # the aggregator took none of them
    assert_conserved(erack)


def test_stats_command_reports_and_conserves(erack):
    out = ethplus("lab", "stats", erack.name, check=True).stdout
    assert "conservation:" in out and "difference 0" in out
    st = erack.stats()
    assert set(st["switches"]) == {f"plane{i}" for i in range(4)}
    port = next(iter(st["switches"]["plane0"]["ports"].values()))
    assert set(core.SW_COUNTERS) <= set(port)
    assert set(port["classes"]) == {"high", "data"}


def test_fabric_crash_is_reported(lab_name):
    ethplus("lab", "up", "erack-8x4", "--name", lab_name, check=True)
    j = json.loads(open(f"/run/ethplus/labs/{lab_name}/journal.json").read())
    os.kill(j["fabric_pid"], signal.SIGKILL)
    time.sleep(0.2)
    ls = json.loads(ethplus("lab", "ls", "--json", check=True).stdout)
    assert next(x for x in ls if x["name"] == lab_name)["status"].startswith("failed")
    r = ethplus("lab", "stats", lab_name)
    assert r.returncode == 1 and "not running" in r.stderr


@pytest.mark.parametrize("alpha", [1.0, 0.25])
def test_shared_buffer_dynamic_threshold(tmp_path, lab_name, alpha):
    """One buffer for all of a switch's queues: a congested queue takes
    alpha / (1 + alpha) of it (the dynamic threshold), far less than its
    port's own 4 MB, and what does not fit is counted as a shared-buffer drop."""
    total = 600_000
    f = tmp_path / "shared.toml"
    f.write_text(
        '[lab]\nfamily = "erack"\n[topology]\naccelerators = 3\nplanes = 1\n'
        "[link]\nbuffer_bytes = 4000000\n[switch]\ntrimming = false\necn = false\n"
        f"shared_buffer_bytes = {total}\ndt_alpha = {alpha}\n"
    )
    lab = _up(lab_name, str(f))
    shown = ethplus("lab", "show", lab_name, check=True).stdout
    assert f"shared buffer 600 KB (alpha {alpha:g})" in shown, shown
    src, dst = lab.port("h1"), lab.port("h0")
    lab.link_set("h0-plane0", "rate", "100G")  # the way out to h0 is slower than h1 sends
    n = 400
    frames = [ethp_frame(src, dst, size=4000, psn=i, entropy=i, compact=True) for i in range(n)]
    before = if_stats(dst.ns, dst.ifname)["rx_packets"]
    send_paced(core.Port(src.ifname, src.ns), core.Pool(1024, 9300), frames, 3 * 100e9 / lab.k)
    st = assert_conserved(lab)
    received = if_stats(dst.ns, dst.ifname)["rx_packets"] - before
    sw = st["switches"]["plane0"]
    port = next(c for c in sw["ports"].values() if c["peer"] == "h0")
    expect = alpha / (1 + alpha) * total
    assert 0.9 * expect <= port["q_hwm_bytes"] <= expect + 4100, (port["q_hwm_bytes"], expect)
    # what h0's kernel did not get is exactly what the threshold dropped
    assert n - received == port["drop_shared_full"] > 0 and port["drop_queue_full"] == 0
    assert sw["buffer"]["hwm_bytes"] <= total


def test_lossless_fabric_pauses_instead_of_dropping(tmp_path, lab_name):
    # h0 is a raw sender, which ignores pauses: its frames wait in leaf0's
    # headroom for it, 2 MB (the egress buffers are the lab's, 4 BDP)
    f = tmp_path / "lossless.toml"
    f.write_text(
        '[lab]\nfamily = "clos"\n[switch]\nlossless = true\nforwarding = "ecmp"\n'
        "trimming = false\necn = false\npfc_xoff_bytes = 40000\npfc_xon_bytes = 20000\n"
        "pfc_headroom_bytes = 2000000\n"
    )
    lab = _up(lab_name, str(f))
    src, dst = lab.port("h0"), lab.port("h4")
    # the spines' links into leaf1 are slow: leaf1 fills, pauses the spines,
    # which fill and pause leaf0; h0's frames wait in leaf0 instead of dying
    for s in range(4):
        lab.link_set(f"leaf1-spine{s}", "rate", "25G")
    cap = Capture(dst)
    try:
        frames = [
            ethp_frame(src, dst, size=4000, psn=i, entropy=i, src_port=777) for i in range(250)
        ]
        send_paced(core.Port(src.ifname, src.ns), core.Pool(1024, 9300), frames, 60e6)
        st = assert_conserved(lab)
        got = _frames_to(cap.drain(quiet_s=1.0), dst.ip)
    finally:
        cap.close()
    t = stats.totals(st)
    assert t["pause_tx"] > 0 and t["pause_rx"] > 0
    assert sum(t[k] for k in stats.DROP_REASONS) == 0
    assert sorted(p.header.psn for p in got) == list(range(250))
    paused = sum(
        c["classes"]["data"]["paused_ns"]
        for sw in st["switches"].values()
        for c in sw["ports"].values()
    )
    assert paused > 0


def test_lossless_egress_never_tail_drops_and_a_sender_ignoring_pauses_loses_past_headroom(
    tmp_path, lab_name
):
    """On a lossless fabric an egress buffer does not bound a queue: the
    ingress's XOFF plus headroom does. A raw sender ignores the pauses, so
    what it sends past that is dropped, every frame counted."""
    f = tmp_path / "headroom.toml"
    f.write_text(
        '[lab]\nfamily = "erack"\n[topology]\naccelerators = 2\nplanes = 1\n'
        "[switch]\nlossless = true\ntrimming = false\necn = false\n"
        "pfc_xoff_bytes = 20000\npfc_xon_bytes = 10000\npfc_headroom_bytes = 30000\n"
        "ecn_kmin_bytes = 5000\necn_kmax_bytes = 10000\n"
        "[link]\nbuffer_bytes = 15000\n"
    )
    lab = _up(lab_name, str(f))
    shown = ethplus("lab", "show", lab_name, check=True).stdout
    assert "lossless (PFC: XOFF 20 KB, XON 10 KB, headroom 30 KB)" in shown, shown
    src, dst = lab.port("h0"), lab.port("h1")
    lab.link_set("h1-plane0", "rate", "10G")
    cap = Capture(dst)
    try:
        n = 200
        frames = [ethp_frame(src, dst, size=2000, psn=i, entropy=i) for i in range(n)]
        send_paced(core.Port(src.ifname, src.ns), core.Pool(1024, 9300), frames, 3 * 10e9 / lab.k)
        st = assert_conserved(lab)
        got = _frames_to(cap.drain(quiet_s=1.0), dst.ip)
    finally:
        cap.close()
    port = next(c for c in st["switches"]["plane0"]["ports"].values() if c["peer"] == "h1")
    t = stats.totals(st)
    assert t["pause_tx"] > 0
    assert n - len(got) == t["drop_headroom"] > 0, (len(got), t["drop_headroom"])
    assert t["drop_queue_full"] == 0
    # the queue outgrew its 15 KB buffer, and no more than XOFF + headroom
    assert 15000 < port["q_hwm_bytes"] <= 20000 + 30000, port["q_hwm_bytes"]
