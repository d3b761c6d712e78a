"""The AF_PACKET port (TPACKET_V3 RX ring, TPACKET_V2 TX ring) on a real veth pair."""

import contextlib
import json
import os
import re
import subprocess
import threading
import time

import pytest
from conftest import RUN_ID

from dataplane.lab import core, nic
from dataplane.lab.core import Addr, Header, Pool, Port, PortConfig, build_frame, parse_frame

pytestmark = pytest.mark.root


@contextlib.contextmanager
def _namespace_with_veths(tag: str, pairs: list[tuple[str, str]]):
    """A namespace holding both ends of each veth pair, MTU 9000, up."""
    name = f"ethp-{RUN_ID}-{tag}{os.getpid() % 1000}"
    path = f"/run/netns/{name}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        # before any link is up: no IPv6 packet of the kernel's among the frames
        for conf in ("all", "default"):
            core.netns_sysctl(path, f"net/ipv6/conf/{conf}/disable_ipv6", "1")
        cmds = [f"link add {a} mtu 9000 type veth peer name {b} mtu 9000" for a, b in pairs]
        cmds += [f"link set {i} up" for pair in pairs for i in pair]
        subprocess.run(["ip", "-n", name, "-batch", "-"], input="\n".join(cmds) + "\n",
                       text=True, check=True)  # fmt: skip
        yield path
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def veth_ns():
    """One namespace holding both ends of a veth pair: (netns path, a, b)."""
    with _namespace_with_veths("port", [("ethptpa", "ethptpb")]) as path:
        yield path, "ethptpa", "ethptpb"


def _frames(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        size = 1 + (i * 97) % 3000
        payload = bytes((i + j) & 0xFF for j in range(size))
        hdr = Header(psn=i, len_bytes=size, offset_bytes=i * 4096)
        out.append(build_frame(Addr(), hdr, payload, compact=True))
    return out


def _drain(port: Port, pool: Pool, want: int, timeout_s: float = 5.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        if port.wait(50):
            got += port.recv(pool, 64)
    return got


def test_frames_cross_a_veth_byte_exact_and_counters_agree(veth_ns):
    path, a, b = veth_ns
    pool = Pool(1024, 4096)
    tx, rx = Port(a, path), Port(b, path)
    frames = _frames(300)
    sent = 0
    for i in range(0, len(frames), 64):
        sent += tx.send(frames[i : i + 64], pool)
    assert sent == 300
    got = _drain(rx, pool, 300)
    assert got == frames  # every byte, in order
    assert [parse_frame(f).header.psn for f in got] == list(range(300))
    ct, cr = tx.counters(), rx.counters()
    assert ct["tx_frames"] == 300 and ct["tx_bytes"] == sum(map(len, frames))
    assert cr["rx_frames"] == 300 and cr["rx_bytes"] == ct["tx_bytes"]
    assert cr["rx_ring_drops"] == 0
    assert ct["tx_batches"] >= 5
    assert set(ct) == set(core.PORT_COUNTERS)
    assert pool.available == 1024  # nothing leaked


def test_a_port_does_not_read_back_its_own_frames(veth_ns):
    path, a, b = veth_ns
    pool = Pool(256, 4096)
    pa, pb = Port(a, path), Port(b, path)
    pa.send(_frames(10), pool)
    assert len(_drain(pb, pool, 10)) == 10
    time.sleep(0.05)
    assert pa.recv(pool) == []
    assert pa.counters()["rx_frames"] == 0


def test_ring_overflow_is_counted(veth_ns):
    path, a, b = veth_ns
    pool = Pool(4096, 4096)
    small = PortConfig(block_bytes=1 << 14, n_blocks=2, block_timeout_ms=1)
    rx, tx = Port(b, path, small), Port(a, path)
    frame = build_frame(Addr(), Header(len_bytes=1000), bytes(1000), compact=True)
    sent = sum(tx.send([frame] * 64, pool) for _ in range(30))
    time.sleep(0.05)
    got = _drain(rx, pool, sent, timeout_s=0.5)
    c = rx.counters()
    assert c["rx_ring_drops"] > 0
    assert c["rx_frames"] == len(got)
    assert c["rx_frames"] + c["rx_ring_drops"] <= sent


def test_a_burst_larger_than_the_tx_ring_is_sent_in_part_then_resumed(veth_ns):
    path, a, b = veth_ns
    pool = Pool(2048, 4096)
    # a receive ring (4 MiB) that holds all 600 frames (0.9 MB) undrained
    tx, rx = Port(a, path), Port(b, path, PortConfig(n_blocks=64))
    frames = _frames(600)
    first = tx.send(frames, pool)
    assert 0 < first < 600  # the ring holds fewer: the rest is left to retry
    assert tx.counters()["tx_again"] == 600 - first
    sent = first
    while sent < 600:
        k = tx.send(frames[sent:], pool)
        assert k > 0
        sent += k
    assert _drain(rx, pool, 600) == frames  # nothing lost, duplicated or reordered
    assert tx.counters()["tx_frames"] == 600 and rx.counters()["rx_ring_drops"] == 0


def test_a_frame_longer_than_the_mtu_is_counted_and_the_rest_go_out(veth_ns):
    path, a, b = veth_ns
    ns = os.path.basename(path)
    subprocess.run(["ip", "-n", ns, "link", "set", a, "mtu", "1500"], check=True)
    pool = Pool(64, 4096)
    tx, rx = Port(a, path), Port(b, path)
    small = _frames(3)  # distinct, so order and origin show at the receiver
    big = build_frame(Addr(), Header(len_bytes=2000), bytes(2000), compact=True)
    burst = [small[0], big, small[1], small[2]]
    sent = tx.send(burst, pool)
    while sent < len(burst):
        k = tx.send(burst[sent:], pool)
        assert k > 0
        sent += k
    assert _drain(rx, pool, 3) == small
    c = tx.counters()
    assert c["tx_errors"] == 1 and c["tx_frames"] == 3
    time.sleep(0.05)
    assert rx.recv(pool) == []  # the long one never went out


def _links(ns: str) -> list[dict]:
    """The namespace's interfaces with their counters (ip -j -s link)."""
    out = subprocess.run(["ip", "-n", ns, "-j", "-s", "link"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return json.loads(out)


def test_each_of_many_interfaces_keeps_its_own_mtu():
    """A switch's one port sends out of every interface of its namespace (64
    on erack-64x8's plane switches), each bounded by its own MTU: among 80
    interfaces, a frame too long for the one of MTU 1500 is counted and
    refused there and goes out of every other, round after round (the
    second from what the port learned of each in the first)."""
    pairs = [(f"ethpm{i}a", f"ethpm{i}b") for i in range(80)]
    small = pairs[41][0]
    with _namespace_with_veths("mtu", pairs) as path:
        ns = os.path.basename(path)
        subprocess.run(["ip", "-n", ns, "link", "set", small, "mtu", "1500"], check=True)
        index = {lk["ifname"]: lk["ifindex"] for lk in _links(ns)}
        pool = Pool(64, 4096)
        tx = Port(pairs[0][0], path)
        frame = build_frame(Addr(), Header(len_bytes=2000), bytes(2000), compact=True)
        for _ in range(2):
            for a, _ in pairs:
                assert tx.send([frame], pool, ifindex=index[a]) == 1
        c = tx.counters()
        assert c["tx_errors"] == 2 and c["tx_frames"] == 2 * 79, c
        got = {lk["ifname"]: lk["stats64"]["rx"]["packets"] for lk in _links(ns)}
        assert all(got[b] == (0 if a == small else 2) for a, b in pairs), got
        tx.close()


def test_frames_for_a_down_interface_are_refused_not_retried_forever(veth_ns):
    path, a, b = veth_ns
    pool = Pool(64, 4096)
    tx, rx = Port(a, path), Port(b, path)
    subprocess.run(["ip", "-n", os.path.basename(path), "link", "set", a, "down"], check=True)
    frames = _frames(20)
    while_down, after = frames[:10], frames[10:]
    assert tx.send(while_down, pool) == 10  # consumed: a caller would not spin on them
    c = tx.counters()
    assert c["tx_errors"] == 10 and c["tx_frames"] == 0 and c["tx_again"] == 0
    subprocess.run(["ip", "-n", os.path.basename(path), "link", "set", a, "up"], check=True)
    time.sleep(0.2)  # carrier
    assert tx.send(after, pool) == 10
    # only the frames sent once it was up arrive: none from before, not late
    assert _drain(rx, pool, 20, timeout_s=1.0) == after


def test_open_errors_are_clear(veth_ns):
    path, _a, _b = veth_ns
    with pytest.raises(OSError, match="ethpnosuch"):
        Port("ethpnosuch", path)
    with pytest.raises(OSError):
        Port("lo", path, PortConfig(block_bytes=1000))  # not a power of two


def test_the_relay_forwards_every_frame_unchanged_in_order():
    # a -> b (relay in) ... relay out c -> d: what d receives is what a sent
    pairs = [("ethptra", "ethptrb"), ("ethptrc", "ethptrd")]
    with _namespace_with_veths("relay", pairs) as path:
        pool = Pool(1024, 9216)
        # rings of 4 MiB: 500 frames of up to 3 KB, in blocks retired part
        # full each ms, wait there while a loaded machine runs other things
        # (16 blocks overflowed once in CI)
        src, r_in, r_out, dst = (
            Port(i, path, PortConfig(n_blocks=64))
            for i in ("ethptra", "ethptrb", "ethptrc", "ethptrd")
        )
        frames = _frames(500)
        moved: list[int] = []
        t = threading.Thread(target=lambda: moved.append(r_in.relay(r_out, 1500)))
        t.start()
        try:
            for i in range(0, len(frames), 50):
                assert src.send(frames[i : i + 50], pool) == len(frames[i : i + 50])
            got = _drain(dst, pool, len(frames))
        finally:
            t.join()
        drops = [p.counters()["rx_ring_drops"] for p in (r_in, dst)]
        assert got == frames, (len(got), drops)  # every byte, in order
        assert moved == [len(frames)]
        assert r_out.counters()["tx_frames"] == len(frames)


def _numbered(first: int, n: int) -> list[bytes]:
    return [
        build_frame(Addr(), Header(psn=i, len_bytes=200), bytes(200), compact=True)
        for i in range(first, first + n)
    ]


def _psns(frames: list[bytes]) -> list[int]:
    return [parse_frame(f).header.psn for f in frames]


def _send_paced(
    tx: Port, rx: Port, pool: Pool, frames: list[bytes], got: list[bytes], ahead: int = 128
) -> None:
    """Send numbered frames, receiving into got as they go, never more than
    `ahead` frames ahead of the receiver (as a transport's window is): a
    sender that races a receiver the machine is slow to run overflows the
    kernel's queues (the veth's backlog, the socket), which no port can
    help, and frames lost there are not the port's to answer for."""
    first, sent = _psns(frames[:1])[0], 0
    while sent < len(frames):
        sent += tx.send(frames[sent : sent + 64], pool)
        got += rx.recv(pool, 64)
        received = _psns(got[-1:])[0] + 1 if got else first  # in order: the next to come
        if (behind := first + sent - received) > ahead:
            got += _drain(rx, pool, behind - ahead)


def _receive_for(port: Port, pool: Pool, seconds: float) -> list[bytes]:
    """Keep receiving (which is when the port changes mode) for a while."""
    got: list[bytes] = []
    end = time.monotonic() + seconds
    while (now := time.monotonic()) < end:
        port.wait(min(5, int((end - now) * 1000)))  # 0: a poll that does not block
        got += port.recv(pool, 64)
    return got


def test_an_idle_port_has_no_ring_and_a_run_of_traffic_sets_one_up_then_idling_parks_it(veth_ns):
    path, a, b = veth_ns
    pool = Pool(4096, 4096)
    rx = Port(b, path, PortConfig(n_blocks=64, ring_idle_ms=50))
    tx = Port(a, path)
    assert not rx.ring_up
    # a trickle: one frame at a time, no ring
    got = []
    for frame in _numbered(0, 10):
        tx.send([frame], pool)
        time.sleep(0.005)
        got += rx.recv(pool, 64)
    got += _drain(rx, pool, 10 - len(got))
    assert _psns(got) == list(range(10))
    c = rx.counters()
    assert c["rx_one_by_one"] == 10 and c["ring_builds"] == 0 and not rx.ring_up
    # a run of traffic: the ring comes up part way, nothing lost or doubled
    run, got = _numbered(10, 20_000), []
    _send_paced(tx, rx, pool, run, got)
    got += _drain(rx, pool, len(run) - len(got))
    c = rx.counters()
    assert _psns(got) == list(range(10, 10 + len(run))), c  # in order too
    assert c["ring_builds"] == 1 and c["ring_failures"] == 0 and rx.ring_up
    assert 10 < c["rx_one_by_one"] < 10 + len(run)  # some came through the ring
    assert c["rx_blocks"] > 0 and c["rx_ring_drops"] == 0
    # idle: the ring is taken down, and frames come one by one again
    assert _receive_for(rx, pool, 0.5) == []
    c = rx.counters()
    assert c["ring_parks"] == 1 and not rx.ring_up
    assert c["ring_backoffs"] == 0  # it carried a run of traffic: worth setting up
    tx.send(_numbered(30_000, 5), pool)
    assert _psns(_drain(rx, pool, 5)) == list(range(30_000, 30_005))
    assert rx.counters()["rx_one_by_one"] == c["rx_one_by_one"] + 5
    assert rx.counters()["rx_frames"] == 10 + len(run) + 5
    assert pool.available == 4096  # nothing leaked


def _backlog_drops() -> int:
    """Frames the kernel dropped from its per-CPU receive backlogs (every
    CPU, every namespace): a veth hands frames to one, before any socket."""
    with open("/proc/net/softnet_stat") as f:
        return sum(int(line.split()[1], 16) for line in f)


def _send_all(tx: Port, pool: Pool, frames: list[bytes]) -> None:
    sent = 0
    while sent < len(frames):
        k = tx.send(frames[sent : sent + 64], pool)
        sent += k
        if not k:
            time.sleep(0.001)  # the TX ring is full: the kernel drains it


@pytest.mark.parametrize("ring_blocks,expect_lost", [(256, False), (16, True)],
                         ids=["16MiB-ring", "1MiB-ring"])  # fmt: skip
def test_a_burst_before_the_reader_wakes_is_held_as_the_ring_would_hold_it(
    veth_ns, ring_blocks, expect_lost
):
    """While a port takes frames one by one (no ring yet), its socket holds
    as many bytes as its ring would: a burst of 2,000 frames of 4 KB
    (8 MB) that comes before the reader wakes is not lost at a port whose
    ring holds 16 MiB (with a fixed 4 MiB buffer, about half was).  A port
    with a small ring keeps 4 MiB, and what it loses is counted as lost one
    by one."""
    path, a, b = veth_ns
    pool = Pool(4096, 8192)
    rx = Port(b, path, PortConfig(n_blocks=ring_blocks, ring_idle_ms=50))
    tx = Port(a, path)
    frames = [
        build_frame(Addr(), Header(psn=i, len_bytes=4000), bytes(4000), compact=True)
        for i in range(2000)
    ]
    backlog_before = _backlog_drops()
    _send_all(tx, pool, frames)  # nothing is read meanwhile
    got = _receive_for(rx, pool, 0.5)
    c = rx.counters()
    # before the port: a machine too busy to run the veth's softirq
    lost_before = _backlog_drops() - backlog_before
    assert c["rx_frames"] == len(got) and c["rx_one_by_one"] == len(got)
    assert c["rx_one_by_one_drops"] == c["rx_ring_drops"]  # all lost, if any, one by one
    assert len(got) + c["rx_ring_drops"] + lost_before >= len(frames), c
    psns = _psns(got)
    assert psns == sorted(set(psns)), "reordered or doubled"
    if expect_lost:
        assert c["rx_ring_drops"] > 0, c
    else:
        assert c["rx_ring_drops"] == 0, c
    assert pool.available == 4096


def test_small_frames_are_received_into_small_buffers(veth_ns):
    """A switch's full-size buffers can all be held by frames in its queues;
    a frame short enough still comes in, into one of the pool's small
    buffers, and only a frame that needs a full-size one is lost for want
    of a buffer (counted as such)."""
    path, a, b = veth_ns
    pool = Pool(16, 8192, small=(64, 1024))
    rx, tx = Port(b, path), Port(a, path)
    held, n_held = pool.get(16)  # every full-size buffer in use
    assert n_held == 16
    big = build_frame(Addr(), Header(psn=999, len_bytes=4000), bytes(4000), compact=True)
    assert tx.send(_numbered(0, 20) + [big] + _numbered(20, 20), Pool(64, 8192)) == 41
    got = _drain(rx, pool, 40)
    time.sleep(0.05)
    got += rx.recv(pool, 64)
    assert _psns(got) == list(range(40))
    c = rx.counters()
    assert c["rx_frames"] == 40 and c["rx_no_buf"] == 1, c
    assert pool.put(held, n_held) == 16 and pool.available == 80  # nothing leaked


def test_bursts_shorter_than_the_ring_window_come_one_by_one(veth_ns):
    """A burst of a few dozen frames (at a large k, a port's traffic comes in
    such bursts, seconds apart) does not set a ring up: it takes 64 frames
    within 8 ms.  With 8 within 1 ms, every burst of upn-512's all-to-all
    set a NIC's ring up: 4,368 set-ups in one job."""
    path, a, b = veth_ns
    pool = Pool(4096, 4096)
    rx = Port(b, path, PortConfig(n_blocks=64, ring_idle_ms=50))
    tx = Port(a, path)
    got, n = [], 0
    for _ in range(3):
        burst = _numbered(n, 40)
        assert tx.send(burst, pool) == len(burst)
        n += len(burst)
        got += _drain(rx, pool, n - len(got))
        got += _receive_for(rx, pool, 0.02)  # then nothing for 20 ms
    c = rx.counters()
    assert _psns(got) == list(range(n)), c
    assert c["ring_builds"] == 0 and c["rx_one_by_one"] == n and not rx.ring_up, c
    assert pool.available == 4096


@pytest.mark.parametrize(
    "gap_s,blocks",
    [(0.005, 64), (0.0006, 64), (0.0006, 4)],
    ids=["gap-5ms", "gap-0.6ms", "gap-0.6ms-ring-reused"],
)
def test_a_ring_that_traffic_has_thinned_out_on_is_taken_down(veth_ns, gap_s, blocks):
    """Not only silence parks the ring: a trickle whose frames each wait for
    a block timeout (about one frame a block) goes back to one by one.  At
    0.6 ms apart, frames keep coming while the ring is parked: the ones in its
    last, partly filled block must still be read before the newer ones, and
    (on a ring of 4 blocks, gone round many times) the blocks after it,
    still holding their last round's count, must not be read again."""
    path, a, b = veth_ns
    pool = Pool(4096, 4096)
    rx = Port(b, path, PortConfig(n_blocks=blocks, ring_idle_ms=50))
    tx = Port(a, path)
    # a run of traffic until the ring is up (a helper thread sets it up, in
    # 8-40 ms here; longer on a loaded machine, so no fixed count of frames)
    # (every frame built beforehand: building 3000 takes long enough on a
    # loaded machine for the ring to idle out meanwhile)
    frames, got = _numbered(0, 20_000), []
    n = _run_until_the_ring_is_up(tx, rx, pool, frames, 0, got)
    _send_paced(tx, rx, pool, frames[n : n + 3000], got)  # round a 4-block ring a few times
    n += 3000
    got += _drain(rx, pool, n - len(got))
    assert rx.counters()["ring_builds"] == 1 and rx.ring_up, f"{rx.counters()}"
    trickle = round(0.4 / gap_s)  # never 50 ms of silence
    for frame in frames[n : n + trickle]:
        tx.send([frame], pool)
        got += _receive_for(rx, pool, gap_s)
    got += _drain(rx, pool, n + trickle - len(got))
    c = rx.counters()
    assert _psns(got) == list(range(n + trickle)), c  # none lost, doubled or reordered
    assert c["ring_builds"] == 1 and c["ring_parks"] == 1 and not rx.ring_up
    assert c["ring_backoffs"] == 1  # taken down for a trickle
    assert pool.available == 4096


def _run_until_the_ring_is_up(tx, rx, pool, frames, n: int, got: list) -> int:
    """Send frames[n:] (paced) until rx's ring is up; returns the next n.
    (A helper thread sets a ring up, in 8-40 ms here, longer on a loaded
    machine: no fixed count of frames.)"""
    end = time.monotonic() + 10
    while not rx.ring_up and time.monotonic() < end and n < len(frames) - 4000:
        _send_paced(tx, rx, pool, frames[n : n + 64], got)
        n += 64
    return n


def test_a_ring_that_carried_a_burst_only_makes_the_next_set_up_wait(veth_ns):
    """A burst that sets a ring up and then stops (at a large k a port's
    traffic comes in bursts a round trip of seconds apart) left a ring that
    carried fewer frames than its set-up costs: not worth it, so the next
    waits, as after a trickle."""
    path, a, b = veth_ns
    pool = Pool(4096, 4096)
    # 8 MiB: worth it from 2304 frames (port.c's ETHP_RING_PAID_*)
    rx = Port(b, path, PortConfig(block_bytes=16384, n_blocks=512, ring_idle_ms=50))
    tx = Port(a, path)
    frames, got, n = _numbered(0, 20_000), [], 0
    end = time.monotonic() + 10
    while not rx.ring_up and time.monotonic() < end and n < 1500:  # bursts of 16
        _send_paced(tx, rx, pool, frames[n : n + 16], got)
        n += 16
        got += _receive_for(rx, pool, 0.002)
    assert rx.ring_up, rx.counters()
    _send_paced(tx, rx, pool, frames[n : n + 20], got)
    n += 20
    got += _drain(rx, pool, n - len(got))
    got += _receive_for(rx, pool, 0.3)  # idle
    c = rx.counters()
    assert c["ring_parks"] == 1 and c["ring_backoffs"] == 1 and not rx.ring_up, c
    assert _psns(got) == list(range(n)), c
    assert pool.available == 4096


def test_a_ring_taken_down_for_a_trickle_is_not_set_up_again_at_once(veth_ns):
    """Setting a ring up costs (the kernel zeroes all of it), so one taken
    down for a trickle is not set up again by the next burst: a run of
    traffic within 250 ms comes one by one; after that a run sets it up
    again.  Every frame arrives, in order, either way."""
    path, a, b = veth_ns
    pool = Pool(4096, 4096)
    rx = Port(b, path, PortConfig(n_blocks=64, ring_idle_ms=50))
    tx = Port(a, path)
    frames, got = _numbered(0, 80_000), []
    n = _run_until_the_ring_is_up(tx, rx, pool, frames, 0, got)
    assert rx.ring_up, rx.counters()
    while rx.ring_up and n < 20_000:  # a trickle until the ring is taken down
        tx.send(frames[n : n + 1], pool)
        n += 1
        got += _receive_for(rx, pool, 0.005)
    parked_at = time.monotonic()
    assert rx.counters()["ring_backoffs"] == 1, rx.counters()
    got += _drain(rx, pool, n - len(got))  # read dry: the parked ring is let go
    end = time.monotonic() + 5
    while rx.counters()["ring_parks"] == 0 and time.monotonic() < end:
        got += _receive_for(rx, pool, 0.002)
    assert rx.counters()["ring_parks"] == 1, rx.counters()
    while time.monotonic() - parked_at < 0.18 and n < 60_000:  # a run of traffic, at once
        _send_paced(tx, rx, pool, frames[n : n + 64], got)
        n += 64
    got += _drain(rx, pool, n - len(got))
    if time.monotonic() - parked_at < 0.22:  # (a machine that kept us off the CPU: not judged)
        assert rx.counters()["ring_builds"] == 1 and not rx.ring_up, rx.counters()
    time.sleep(max(0.0, parked_at + 0.3 - time.monotonic()))
    n = _run_until_the_ring_is_up(tx, rx, pool, frames, n, got)
    got += _drain(rx, pool, n - len(got))
    c = rx.counters()
    assert c["ring_builds"] == 2 and rx.ring_up, c
    assert _psns(got) == list(range(n)), c  # none lost, doubled or reordered
    assert pool.available == 4096


def _kernel_rx_ring_timeouts_ms(netns_path: str) -> list[int]:
    """What the kernel says of the RX rings of the packet sockets in a
    namespace (ss's packet diag): each ring's block retire timeout."""
    ss = subprocess.run(["nsenter", f"--net={netns_path}", "ss", "-0", "-a", "-e", "-m"],
                        capture_output=True, text=True, check=True).stdout  # fmt: skip
    return [int(x) for x in re.findall(r"ring_rx\([^)]*tmo:(\d+)", ss)]


def test_a_nic_port_ring_retires_its_blocks_after_the_timeout_asked_for(veth_ns):
    """The NIC's rx_ring_timeout_ms reaches the kernel's ring (its timer
    fires each timeout while the ring is up: upn-512's 512 rings at 1 ms
    swamped both cores); 0 keeps 1 ms."""
    path, _a, _b = veth_ns
    for asked, want in ((9, 9), (0, 1)):
        cfg, _bdp = nic.engine_cfg(0, 1, 10**9, 10**7, 1.0, {}, adaptive=False, seed=1,
                                   max_retries=3, drop_psn=None)  # fmt: skip
        cfg.rx_ring_timeout_ms, cfg.ring_idle_ms = asked, 0  # the ring from the start
        err = core.ffi.new("int *")
        n = core.lib.ethp_nic_new(cfg, path.encode(), 2, err)
        assert n != core.ffi.NULL, err[0]
        try:
            assert _kernel_rx_ring_timeouts_ms(path) == [want]
        finally:
            core.lib.ethp_nic_free(n)
