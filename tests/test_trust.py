"""Every frame from a lab node is untrusted: crafted lengths, forged
sources, pause storms.  A raw-socket program inside a node (what anyone with
`ethplus exec` can run) attacks a real transfer between two other nodes; the
transfer must finish byte-exact and every refused frame must be counted."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import RUN_ID, ethplus
from labtools import Capture, Lab, assert_missed_only_by_ring

from dataplane.lab import core, nic
from dataplane.lab.nic import Endpoint
from dataplane.report import stats

pytestmark = pytest.mark.root

MiB = 1 << 20
ROCE_PORT = 4791
ETH_BYTES, IP_UDP_BYTES = 14, 28
# ETH+ header fields, by offset in the header (docs/wire-format.md)
FLAGS_AT, LEN_AT = 1, 24
AGG_EP_BASE, AGG_NET = core.lib.ETHP_AGG_EP_BASE, core.lib.ETHP_AGG_NET


@pytest.fixture(scope="module")
def erack():
    name = f"{RUN_ID}-trust"
    ethplus("lab", "up", "erack-8x4", "--name", name, check=True)
    try:
        yield Lab(name)
    finally:
        ethplus("lab", "down", name)


def forge(
    lab: Lab,
    sender: str,
    *,
    to: str,
    opcode: int,
    src_ep: int,
    src_ip: int | None = None,
    plane: int = 0,
    compact: bool,
    udp_port: int = core.UDP_PORT,
    psn: int = 0,
    flags: int = 0,
    tag: int = 0,
    msg_id: int = 0,
    offset: int = 0,
    payload: bytes = b"",
    dst_ip: int | None = None,
    src_epoch: int = 0,
) -> bytes:
    """A frame as sender's port on plane puts it on the wire, claiming to
    come from src_ep (and src_ip), to node to's port on that plane."""
    me, them = lab.port(sender, plane=plane), lab.port(to, plane=plane)
    addr = core.Addr(
        dst_mac=me.gw_mac,
        src_mac=me.mac,
        src_ip=me.ip if src_ip is None else src_ip,
        dst_ip=them.ip if dst_ip is None else dst_ip,
        src_port=0xC000,
        dst_port=udp_port,
        tos=2,
    )
    hdr = core.Header(
        opcode=opcode,
        flags=flags,
        src_ep=src_ep,
        dst_ep=them.ep,
        msg_id=msg_id,
        psn=psn,
        offset_bytes=offset,
        tag=tag,
        len_bytes=len(payload),
        tos=2,
        src_epoch=src_epoch,
    )
    return core.build_frame(addr, hdr, payload, compact=compact)


def patch_header(frame: bytes, compact: bool, *, flags: int | None = None, length: int) -> bytes:
    """The same frame with its header's len (and flags) rewritten: a header
    that lies about the payload it carries."""
    at = ETH_BYTES + (0 if compact else IP_UDP_BYTES)
    b = bytearray(frame)
    if flags is not None:
        b[at + FLAGS_AT] = flags
    b[at + LEN_AT : at + LEN_AT + 2] = length.to_bytes(2, "big")
    return bytes(b)


def send_raw(lab: Lab, node: str, frames: list[bytes], plane: int = 0, gap_s: float = 0.0005):
    hp = lab.port(node, plane=plane)
    port, pool = core.Port(hp.ifname, hp.ns), core.Pool(256, 9300)
    try:
        for f in frames:
            while port.send([f], pool) != 1:
                time.sleep(0.001)
            time.sleep(gap_s)
    finally:
        port.close()


def rewrite_as_switch(lab: Lab, frame: bytes, to: str, plane: int = 0) -> bytes:
    """The frame as the switch hands it to node to (MACs rewritten)."""
    them = lab.port(to, plane=plane)
    return them.mac + them.gw_mac + frame[12:]


def send_from_switch(lab: Lab, to: str, frames: list[bytes], plane: int = 0) -> None:
    """Put frames on to's link from the switch's side: what the switch would
    deliver if it forwarded them (it drops a frame it cannot parse)."""
    sw = lab.nodes[_switch_of(lab, to, plane)]
    ifname = next(p["ifname"] for p in sw["ports"] if p["peer"] == to)
    port, pool = core.Port(ifname, lab.rec["namespaces"][sw["name"]]), core.Pool(256, 9300)
    try:
        for f in frames:
            while port.send([rewrite_as_switch(lab, f, to, plane)], pool) != 1:
                time.sleep(0.001)
            time.sleep(0.0005)
    finally:
        port.close()


def _switch_of(lab: Lab, node: str, plane: int) -> str:
    return next(p["peer"] for p in lab.nodes[node]["ports"] if p["plane"] == plane)


def _parsed(frame: bytes):
    """The frame parsed, if it is ETH+ (None otherwise)."""
    try:
        p = core.parse_frame(frame)
    except core.WireError:
        return None
    return p if p.header is not None else None


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def switch_drops(lab: Lab, reason: str) -> int:
    return stats.totals(lab.stats()).get(reason, 0)


def genuine_transfer(a: Endpoint, b: Endpoint, tag: int, size: int) -> tuple:
    src = np.random.default_rng(tag).integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    hr = b.post_recv(a.rank, tag, dst)
    hs = a.post_send(b.rank, tag, src)
    assert a.wait(hs, 60) == size
    assert b.wait(hr, 60) == size
    return src, dst


# ---------------------------------------------------------------- 1: lengths


@pytest.mark.parametrize("mode", ["roce", "ethplus"])
def test_a_payload_that_does_not_match_its_header_is_refused_not_read(erack, mode):
    """A trimmed RoCE frame claiming 65535 bytes (the old receive copied
    len_bytes from the header: up to 64 KiB past the frame), and frames whose
    header promises more or less than they carry, into a NIC with a receive
    posted for their tag: none is placed, each is counted as malformed, and
    the buffer then holds exactly the genuine message."""
    roce = mode == "roce"
    compact = not roce  # erack-8x4 runs ETH+ in the compact form; RoCE is always UDP
    a, b = Endpoint(erack.name, "h0", roce=roce), Endpoint(erack.name, "h1", roce=roce)
    try:
        tag, size = 4242, 256 * 1024
        dst = np.zeros(size, dtype=np.uint8)
        hr = b.post_recv(a.rank, tag, dst)
        port = ROCE_PORT if roce else core.UDP_PORT
        base = forge(
            erack, "h0", to="h1", opcode=core.lib.ETHP_OP_DATA, src_ep=a.rank, compact=compact,
            udp_port=port, flags=core.lib.ETHP_F_LAST, tag=tag, msg_id=0, payload=b"\xee" * 64,
            src_epoch=a.config["epoch"],  # h0's own: past the epoch check, to the payload's
        )  # fmt: skip
        trimmed = core.lib.ETHP_F_LAST | core.lib.ETHP_F_TRIMMED
        crafted = [
            patch_header(base, compact, length=65535),  # promises far more than it carries
            patch_header(base, compact, length=16),  # carries more than it promises
        ]
        if roce:  # RoCE has no trimming: a trimmed frame is never placed
            crafted.append(patch_header(base, compact, flags=trimmed, length=65535))
        before = b.counters()
        if roce:  # to a switch, any UDP datagram: it forwards them as h0 sent them
            send_raw(erack, "h0", crafted)
        else:  # a switch drops what it cannot parse: put them on h1's link behind it
            send_from_switch(erack, "h1", crafted)
        time.sleep(0.3)
        mid = delta(b.counters(), before)
        assert mid.get("rx_malformed", 0) == len(crafted), mid
        assert mid.get("rx_data_bytes", 0) == 0 and not dst.any(), "a crafted payload was placed"
        src = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8)
        assert a.wait(a.post_send(b.rank, tag, src), 60) == size
        assert b.wait(hr, 60) == size
        assert np.array_equal(src, dst), "the buffer holds bytes that were not sent"
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("mode", ["roce", "ethplus"])
def test_overlapping_packets_never_complete_a_receive_and_a_short_one_says_so(erack, mode):
    """A sender whose packets overlap (two PSNs on the first 4 KiB, then
    the last packet at 8 KiB: three packets' bytes, as many as the message
    holds, the old count completed it with 4 KiB never written) is refused
    packet by packet (rx_overlap) and the receive does not complete; a
    whole message shorter than its receive is reported with its length."""
    roce = mode == "roce"
    a, b = Endpoint(erack.name, "h0", roce=roce), Endpoint(erack.name, "h1", roce=roce)
    try:
        seg = nic.PAYLOAD_BYTES
        dst, small = np.zeros(3 * seg, np.uint8), np.zeros(1000, np.uint8)
        hr, hr_small = b.post_recv(a.rank, 31, dst), b.post_recv(a.rank, 32, small)
        last = core.lib.ETHP_F_LAST
        frames = [
            forge(erack, "h0", to="h1", opcode=core.lib.ETHP_OP_DATA, src_ep=a.rank,
                  compact=not roce, udp_port=ROCE_PORT if roce else core.UDP_PORT, psn=psn,
                  flags=flags, tag=tag, msg_id=msg_id, offset=off, payload=bytes([fill]) * n,
                  src_epoch=a.config["epoch"])
            for psn, off, flags, fill, n, tag, msg_id in (
                (0, 0, 0, 0x11, seg, 31, 5),
                (1, 0, 0, 0x22, seg, 31, 5),  # the first 4 KiB again, under another PSN
                (2, 2 * seg, last, 0x33, seg, 31, 5),
                (3, 0, last, 0x44, 100, 32, 6),  # a whole message of 100 bytes
            )
        ]  # fmt: skip
        before = b.counters()
        send_raw(erack, "h0", frames)
        assert b.wait(hr_small, 10) == 100  # the length that came (a transport's: ShortMessage)
        assert (small[:100] == 0x44).all() and not small[100:].any()
        assert b.wait(hr, 1.0) is None, "a receive completed with 4 KiB never written"
        got = delta(b.counters(), before)
        assert got.get("rx_overlap") == 1, got
        assert (dst[:seg] == 0x11).all() and not dst[seg : 2 * seg].any()
        assert (dst[2 * seg :] == 0x33).all()
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------- 2: sources


@pytest.mark.parametrize("mode", ["roce", "ethplus"])
def test_forged_control_frames_from_a_third_node_are_refused(erack, mode):
    """While h0 sends 16 MiB to h1, h3 forges acks that would acknowledge
    everything, NACKs, receiver-not-ready replies and in-network results at
    h0: claiming h1's (or an aggregator's) address, its own switch refuses
    them (drop_spoofed); from its own address but claiming to be h1, h0's
    NIC does (rx_spoofed).  The transfer completes byte-exact."""
    roce = mode == "roce"
    compact = not roce
    port = ROCE_PORT if roce else core.UDP_PORT
    a, b = Endpoint(erack.name, "h0", roce=roce), Endpoint(erack.name, "h1", roce=roce)
    try:
        h1 = erack.port("h1", plane=0)
        lib = core.lib
        ops = [lib.ETHP_OP_ACK, lib.ETHP_OP_NACK, lib.ETHP_OP_RNR]
        claimed, own = [], []
        for psn in range(0, 3000, 25):
            for op in ops:
                ack_body = b"\xff" * 8 if op == lib.ETHP_OP_ACK else b""
                claimed.append(
                    forge(erack, "h3", to="h0", opcode=op, src_ep=b.rank, src_ip=h1.ip,
                          compact=compact, udp_port=port, psn=psn, payload=ack_body)
                )  # fmt: skip
                if not compact:  # the compact form has no address of its own to keep
                    own.append(
                        forge(erack, "h3", to="h0", opcode=op, src_ep=b.rank, compact=compact,
                              udp_port=port, psn=psn, payload=ack_body)
                    )  # fmt: skip
            claimed.append(
                forge(erack, "h3", to="h0", opcode=lib.ETHP_OP_AGG_RESULT, src_ep=AGG_EP_BASE,
                      src_ip=AGG_NET, compact=compact, udp_port=port, psn=psn, payload=b"\0" * 64)
            )  # fmt: skip
        spoofed0 = switch_drops(erack, "drop_spoofed")
        c0 = a.counters()
        result: dict = {}

        def move():
            result["v"] = genuine_transfer(a, b, 777, 16 * MiB)

        t = threading.Thread(target=move)
        t.start()
        send_raw(erack, "h3", claimed + own, gap_s=0.0002)
        t.join(120)
        assert not t.is_alive(), "the transfer did not finish"
        src, dst = result["v"]
        assert np.array_equal(src, dst)
        time.sleep(0.2)
        d = delta(a.counters(), c0)
        assert switch_drops(erack, "drop_spoofed") - spoofed0 == len(claimed)
        unrefused = len(own) - d.get("rx_spoofed", 0)
        assert_missed_only_by_ring(unrefused, d.get("rx_ring_drops", 0), d)
    finally:
        a.close()
        b.close()


def test_frames_on_loopback_are_not_the_nic_s(erack):
    """A plain unprivileged UDP datagram to the RoCE port on a node's lo,
    dressed as h1's data for h0, never reaches h0's NIC engine as traffic:
    it is refused as not from one of its ports."""
    a = Endpoint(erack.name, "h0", roce=True)
    try:
        frame = forge(
            erack, "h1", to="h0", opcode=core.lib.ETHP_OP_ACK, src_ep=1, compact=False,
            udp_port=ROCE_PORT, payload=b"\0" * 8,
        )  # fmt: skip
        body = frame[ETH_BYTES + IP_UDP_BYTES :]
        before = a.counters()
        fd = core.netns_socket(erack.rec["namespaces"]["h0"], socket.AF_INET, socket.SOCK_DGRAM)
        with socket.socket(fileno=fd) as s:
            for _ in range(5):
                s.sendto(body, ("127.0.0.1", ROCE_PORT))
        time.sleep(0.3)
        d = delta(a.counters(), before)
        assert d.get("rx_spoofed", 0) == 5 and d.get("rx_acks", 0) == 0, d
    finally:
        a.close()


# ---------------------------------------------------------------- 7: pauses


def test_a_host_cannot_pause_its_switch_unless_the_lab_allows_it(erack):
    """Pause frames from an accelerator's port are ignored (counted as
    pause_ignored, never as pause_rx): h0 cannot stop its plane."""
    hp = erack.port("h0", plane=1)
    pause = core.build_pfc(hp.mac, 0xFF, 0xFFFF)
    before = stats.totals(erack.stats())
    send_raw(erack, "h0", [pause] * 20, plane=1)
    time.sleep(0.2)
    after = stats.totals(erack.stats())
    assert after.get("pause_ignored", 0) - before.get("pause_ignored", 0) == 20
    assert after.get("pause_rx", 0) == before.get("pause_rx", 0)


def test_the_pfc_watchdog_releases_a_class_paused_too_long(tmp_path, lab_name):
    """A lab that lets hosts pause, with a 10 us (nominal) watchdog: h0 keeps
    its plane-0 port paused with a storm of full-length pauses; the watchdog
    releases the class (counted) and h1's message to h0 still arrives."""
    lab_file = tmp_path / "wd.toml"
    text = (Path(__file__).parents[1] / "netns-labs" / "erack-8x4.toml").read_text()
    text = text.replace("[switch]\n", "[switch]\nhosts_may_pause = true\npfc_watchdog_us = 10\n")
    lab_file.write_text(text)
    ethplus("lab", "up", str(lab_file), "--name", lab_name, check=True)
    lab = Lab(lab_name)
    hp = lab.port("h0", plane=0)
    stop = threading.Event()

    def storm():
        pause = core.build_pfc(hp.mac, 0xFF, 0xFFFF)
        port, pool = core.Port(hp.ifname, hp.ns), core.Pool(64, 2048)
        try:
            while not stop.is_set():
                port.send([pause], pool)
                time.sleep(0.002)
        finally:
            port.close()

    t = threading.Thread(target=storm)
    t.start()
    try:
        time.sleep(0.5)
        a, b = Endpoint(lab_name, "h1"), Endpoint(lab_name, "h0")
        try:
            src, dst = genuine_transfer(a, b, 99, 4 * MiB)
            assert np.array_equal(src, dst)
        finally:
            a.close()
            b.close()
    finally:
        stop.set()
        t.join()
    t1 = stats.totals(lab.stats())
    assert t1.get("pfc_watchdog", 0) > 0 and t1.get("pause_rx", 0) > 0


# ---------------------------------------------------------------- 3: aggregators


def test_a_spoofing_node_cannot_redirect_or_starve_another_job_s_all_reduce(erack):
    """h0..h2 run an in-network all-reduce.  h3, no member, knows the job's
    group ids and throws at the aggregators: contributions as member 0 from
    its own address (which used to make member 0's results go to h3),
    contributions as member 0 from member 0's address (its switch's source
    guard), and contributions to 1600 new group ids (which used to take every
    group entry and slot).  Only the control plane's member lists count:
    all three are refused and counted, h3 receives no result, and the job
    is byte-exact."""
    from dataplane.lab import registry
    from dataplane.model import routing
    from dataplane.run.job import Job, Plan

    plan = Plan(lab=erack.name, transport="ethplus", collective="all-reduce", sizes=[4 * MiB],
                algo="in-network", iters=2, warmup=1, nodes=["h0", "h1", "h2"])  # fmt: skip
    job = Job(plan, registry.load_lab(erack.name))
    streams = plan.inc["streams"]
    ids = {v: k for k, v in routing.switch_ids(erack.rec["topology"]).items()}
    lib = core.lib
    word = lib.ETHP_AGG_F32 << 24 | lib.ETHP_AGG_SUM << 16 | 64  # dtype, op, window
    frames: dict[int, list[bytes]] = {}
    for st in streams:
        plane = erack.nodes[ids[st["root"]]]["plane"]
        h3 = erack.port("h3", plane=plane)
        agg_ip = AGG_NET + st["root"]
        n = st["root_members"]
        out = frames.setdefault(plane, [])
        for psn in range(0, 400):
            # (erack-8x4 is compact: a sender is its endpoint; member 0 is h0)
            for src_ep, group in (
                (3, st["group"]),  # as member 0, from h3's own endpoint
                (0, st["group"]),  # as member 0, with member 0's endpoint
                (3, (st["group"] + 0x100000 * (psn + 1)) & 0xFFFFFFFF),  # new groups
            ):
                addr = core.Addr(dst_mac=h3.gw_mac, src_mac=h3.mac, src_ip=h3.ip, dst_ip=agg_ip,
                                 src_port=0xC000, dst_port=core.UDP_PORT, tos=2)  # fmt: skip
                hdr = core.Header(opcode=lib.ETHP_OP_AGG, src_ep=src_ep,
                                  dst_ep=AGG_EP_BASE + st["root"], msg_id=group, psn=psn,
                                  offset_bytes=psn * 1024, tag=n << 16 | 0, len_bytes=1024,
                                  tos=2, ts_ns=word)  # fmt: skip
                out.append(core.build_frame(addr, hdr, b"\x7f" * 1024, compact=True))
    before = stats.totals(erack.stats())
    # what reaches h3's ports, as its kernel hands it over: no result may
    caps = [Capture(erack.port("h3", plane=p)) for p in frames]
    try:
        attack = [
            threading.Thread(target=send_raw, args=(erack, "h3", fs), kwargs={"plane": p})
            for p, fs in frames.items()
        ]
        for t in attack:
            t.start()
        res = job.run()
        for t in attack:
            t.join()
        arrived = [f for c in caps for f in c.drain()]
    finally:
        for c in caps:
            c.close()
    results_at_h3 = [
        f for f in arrived
        if (p := _parsed(f)) is not None and p.header.opcode == lib.ETHP_OP_AGG_RESULT
    ]  # fmt: skip
    assert all(r["wrong"] == 0 for r in res["rows"]), res["rows"]
    after = stats.totals(erack.stats())
    sent = sum(len(fs) for fs in frames.values())
    foreign = after["drop_agg_foreign"] - before.get("drop_agg_foreign", 0)
    spoofed = after["drop_spoofed"] - before.get("drop_spoofed", 0)
    assert spoofed == sent // 3, (spoofed, sent)
    assert foreign == sent - sent // 3, (foreign, sent)
    assert results_at_h3 == [], f"{len(results_at_h3)} results reached h3"


# ---------------------------------------------------------------- 7: kernel TCP


def _tcp_pair(impostor: bool = False, world: int = 2, **opts):
    """Two TcpTransports on loopback (ranks 0 and 1, 127.0.0.1 and .2; or
    world of them); rank 1 accepts.  With impostor, a socket from 127.0.0.3
    claiming to be rank 0 connects to rank 1 first."""
    from dataplane.run.transport import Options
    from dataplane.run.transports.tcp import _HELLO, PORT, TcpTransport

    def port(i: int) -> list:
        return [{"plane": 0, "ip": f"127.0.0.{i + 1}"}]

    nodes = [{"name": f"h{i}", "role": "host", "index": i, "ports": port(i)} for i in range(world)]
    rec = {"topology": {"nodes": nodes}}
    gate = threading.Barrier(world)
    out: dict = {}

    def barrier(node: str) -> None:
        gate.wait(20)
        if impostor and node == "h0":  # before rank 0 connects for real
            fake = socket.create_connection(("127.0.0.2", PORT), source_address=("127.0.0.3", 0))
            fake.sendall(_HELLO.pack(0, 0))
            out["fake"] = fake

    def make(node: str) -> None:
        out[node] = TcpTransport("lab", node, rec, Options(**opts), lambda _n: barrier(node))

    names = [f"h{i}" for i in reversed(range(world))]  # the accepting ranks first
    threads = [threading.Thread(target=make, args=(n,)) for n in names]
    for t in threads:
        t.start()
        time.sleep(0.05)  # rank 1 listens before rank 0 connects
    for t in threads:
        t.join(30)
    return out


def test_tcp_refuses_a_hello_from_the_wrong_address_and_bad_chunk_headers():
    """A connection that says it is rank 0 but comes from another address is
    closed and counted; the real rank 0 connects.  A chunk header whose bytes
    lie outside its message, or whose message length changes, or that
    announces more unposted data than the transport holds, or chunks that
    add up to more than their message, is an error naming the peer, never
    a write outside the posted buffer, a huge allocation or a receive that
    waits forever."""
    import struct

    from dataplane.run.transport import TransportError
    from dataplane.run.transports import tcp

    out = _tcp_pair(impostor=True)
    t0, t1 = out["h0"], out["h1"]
    try:
        src = np.arange(1000, dtype=np.uint8)
        dst = np.zeros(1000, dtype=np.uint8)
        h = t1.irecv(0, 5, dst)
        t0.wait(t0.isend(1, 5, src))
        t1.wait(h)
        assert np.array_equal(src, dst)  # the genuine connection works
        assert t1.counters()["refused_conns"] == 1
        sock = t0._conns[1][0].sock
        for i, (hdr, why) in enumerate((
            ((6, 100, 90, 50), "bytes 90..140 of a 100-byte message"),
            ((7, 1 << 40, 0, 1 << 39), "before a receive was posted"),
        )):  # fmt: skip
            sock.setblocking(True)
            sock.sendall(struct.pack("<IQQQ", *hdr))
            with pytest.raises(TransportError, match=f"rank 1: rank 0 sent a bad chunk.*{why}"):
                t1.wait(t1.irecv(0, 90 + i, np.zeros(10, np.uint8)))
            t1._conns[0][0].hdr_got = 0  # (the stream is broken now; reset it for the next case)
        assert tcp.EARLY_MAX_BYTES < 1 << 39
        # the same chunk twice: more bytes than the message has, an error
        # (it left the receive waiting forever), whether the receive was
        # posted before the chunks came or after
        chunk = struct.pack("<IQQQ", 8, 100, 0, 60) + bytes(60)
        h = t1.irecv(0, 8, np.zeros(100, np.uint8))
        sock.sendall(chunk * 2)
        with pytest.raises(
            TransportError, match="rank 1: rank 0 sent a bad chunk.*more than the 100"
        ):
            assert t1.poll(h, 10.0), "the receive still waits"
        sock.sendall((struct.pack("<IQQQ", 9, 100, 0, 60) + bytes(60)) * 2)
        for _ in range(10):  # until both are held for a receive to come
            if t1._early_bytes == 120:
                break
            t1._progress(1.0)
        with pytest.raises(
            TransportError, match="rank 1: rank 0 sent a bad chunk.*more than the 100"
        ):
            t1.irecv(0, 9, np.zeros(100, np.uint8))
    finally:
        t0.close()
        t1.close()
        if "fake" in out:
            out["fake"].close()


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:"))


@pytest.mark.parametrize(
    "flood, why",
    [
        ("empty", "more than 65536 chunks before their receives were posted"),
        ("fresh_tags", "more than 16384 messages before their receives were posted"),
    ],
)
def test_tcp_early_data_is_bounded_in_memory_not_only_in_payload(flood, why):
    """A peer floods chunk headers for receives not posted yet: a million
    empty chunks of one message, or 1-byte messages under 200,000 fresh
    tags (no payload cap sees either).  The receiver fails with an error
    naming the peer, and its memory grows by less than 64 MiB (held
    unbounded, the flood took several hundred)."""
    import struct

    from dataplane.run.transport import TransportError

    out = _tcp_pair()
    t0, t1 = out["h0"], out["h1"]
    try:
        h = t1.irecv(0, 5, np.zeros(8, np.uint8))
        t0.wait(t0.isend(1, 5, np.ones(8, np.uint8)))
        t1.wait(h)
        sock = t0._conns[1][0].sock
        if flood == "empty":
            data = struct.pack("<IQQQ", 77, 100, 0, 0) * 1_000_000
        else:
            data = b"".join(struct.pack("<IQQQ", 1000 + i, 1, 0, 1) + b"x" for i in range(200_000))

        def pour():
            sock.settimeout(30)
            with contextlib.suppress(OSError):
                sock.sendall(data)

        rss0 = _rss_bytes()
        sender = threading.Thread(target=pour)
        sender.start()
        with pytest.raises(TransportError, match=f"rank 1: rank 0 sent a bad chunk.*{why}"):
            t1.poll(t1.irecv(0, 6, np.zeros(8, np.uint8)), 20.0)
            pytest.fail(f"no error; the receiver grew by {(_rss_bytes() - rss0) >> 20} MiB")
        grown = _rss_bytes() - rss0
        assert grown < 64 << 20, f"the receiver grew by {grown >> 20} MiB"
    finally:
        t1.close()
        t0.close()


def test_tcp_a_message_shorter_than_its_receive_is_an_error_with_its_length():
    from dataplane.run.transport import ShortMessage

    out = _tcp_pair()
    t0, t1 = out["h0"], out["h1"]
    try:
        dst = np.full(1000, 7, np.uint8)
        h = t1.irecv(0, 3, dst)
        t0.wait(t0.isend(1, 3, np.ones(400, np.uint8)))
        with pytest.raises(ShortMessage, match="rank 1: rank 0 sent a 400-byte message.*1000") as e:
            t1.wait(h)
        assert (e.value.peer, e.value.got_bytes) == (0, 400)
        assert (dst[:400] == 1).all() and (dst[400:] == 7).all()
    finally:
        t1.close()
        t0.close()


def test_tcp_connections_that_never_say_hello_do_not_pile_up():
    """A rank listens for the job's whole life (its peers connect when they
    first use the pair).  Connections that never send a hello, from an
    address no peer has or from the peer's own, are closed and counted: the
    rank keeps at most as many waiting as its peers have streams, and the
    genuine peer still connects."""
    from dataplane.run.transports.tcp import PORT

    out = _tcp_pair()
    t0, t1 = out["h0"], out["h1"]
    flood = []
    try:
        for src in ("127.0.0.3", "127.0.0.1"):  # a stranger's address; rank 0's own
            for _ in range(50):
                flood.append(socket.create_connection(("127.0.0.2", PORT), source_address=(src, 0)))
        src_buf = np.arange(1000, dtype=np.uint8)
        dst = np.zeros(1000, dtype=np.uint8)
        h = t1.irecv(0, 5, dst)
        t0.wait(t0.isend(1, 5, src_buf))
        t1.wait(h)
        assert np.array_equal(src_buf, dst)
        assert t1.counters()["refused_conns"] == 100
        assert t1.counters()["tcp_peers"] == 1
    finally:
        for f in flood:
            f.close()
        t0.close()
        t1.close()


def test_tcp_connect_all_has_every_stream_up_before_any_message():
    """Under `ethplus run` (tcp_connect_all, as gloo does) a rank's streams
    are all up when its transport is: a program's first call times no
    handshake.  Without it, none is until a message."""
    for connect_all, peers in ((True, 1), (False, 0)):
        out = _tcp_pair(tcp_connect_all=connect_all)
        try:
            assert [out[n].counters()["tcp_peers"] for n in ("h0", "h1")] == [peers] * 2
        finally:
            out["h0"].close()
            out["h1"].close()


def test_tcp_handshakes_may_outlast_the_kernels_real_time_defaults(monkeypatch):
    """A handshake's retries run on real time from a 1 s initial RTO, which
    at a large k is about a round trip: a rank's connecting sockets and its
    listeners carry more tries than Linux's defaults (the kernel reads the
    listener's for the SYN-ACKs of connections it sets up), and the run's
    notes say so."""
    from dataplane.run.transports.tcp import HANDSHAKE_TRIES, TcpTransport

    assert HANDSHAKE_TRIES > 6  # Linux's tcp_syn_retries (tcp_synack_retries: 5)
    tries: list[int] = []
    connect = TcpTransport._connect_one

    def spy(self, peer, st, plane):
        s = connect(self, peer, st, plane)
        tries.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_SYNCNT))
        return s

    monkeypatch.setattr(TcpTransport, "_connect_one", spy)
    out = _tcp_pair(tcp_connect_all=True)
    try:
        assert tries == [HANDSHAKE_TRIES]  # rank 0's one connect
        for node in ("h0", "h1"):
            t = out[node]
            assert [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_SYNCNT) for s in t._listeners] == [
                HANDSHAKE_TRIES
            ]
            assert any(f"tries {HANDSHAKE_TRIES} times each way" in n for n in t.notes)
    finally:
        out["h0"].close()
        out["h1"].close()


def test_tcp_a_rank_connects_to_a_bounded_number_of_peers_at_once(monkeypatch):
    """At a large k a handshake's round trip nears the kernel's 1 s initial
    RTO, and every SYN that waits in a queue is sent again: a rank with
    many peers to connect to starts on PEERS_AT_ONCE of them (each peer's
    streams together) and on the next as one is up, and every stream still
    comes up."""
    from dataplane.run.transports import tcp

    peers_before: list[int] = []
    started: dict[int, list[int]] = {}  # rank: the peers it began connecting to
    connect = tcp.TcpTransport._connect_one

    def spy(self, peer, st, plane):
        if st == 0:  # a new peer: how many of this rank's are not all up (its stream table)
            mine = started.setdefault(self.rank, [])
            peers_before.append(sum(len(self._conns[p]) < self.streams for p in mine))
            mine.append(peer)
        return connect(self, peer, st, plane)

    monkeypatch.setattr(tcp, "PEERS_AT_ONCE", 2)
    monkeypatch.setattr(tcp.TcpTransport, "_connect_one", spy)
    out = _tcp_pair(world=5, tcp_connect_all=True, tcp_streams=2)
    try:
        assert len(peers_before) == 4 + 3 + 2 + 1  # each rank connects to those ranked above
        assert max(peers_before) == 1  # so never more than 2 peers at once
        for i in range(5):
            c = out[f"h{i}"].counters()
            assert (c["tcp_peers"], c["tcp_streams"]) == (4, 8)
    finally:
        # together: a rank closes the streams it opened once their peers have
        closing = [threading.Thread(target=t.close) for t in out.values()]
        for c in closing:
            c.start()
        for c in closing:
            c.join()


def test_tcp_out_of_open_files_says_so_and_what_to_change():
    """Kernel TCP takes a socket per stream, and a rank host's ranks share
    one process's open files: a rank that cannot open one more says which
    peer, that the process ran out, and what to change; not a bare OSError."""
    import resource

    from dataplane.run.transport import TransportError

    out = _tcp_pair()
    t0, t1 = out["h0"], out["h1"]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
        with pytest.raises(TransportError) as e:
            t0.isend(1, 5, np.zeros(10, np.uint8))  # rank 0 connects on first use
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        t0.close()
        t1.close()
    text = str(e.value)
    assert text.startswith("rank 0: cannot connect to rank 1: Too many open files"), text
    assert "--ranks-per-host" in text and f"may open {lowest_free} files" in text, text


def test_a_worker_may_open_as_many_files_as_the_kernel_allows():
    """A rank host's kernel TCP ranks hold a socket per stream in one
    process: a worker with CAP_SYS_RESOURCE raises its open-files limit to
    the kernel's most (fs.nr_open), past a hard limit such as 20,000;
    without it (here: a container's root), its soft limit to its hard one."""
    import resource

    code = (
        "import resource; from dataplane.run import worker;"
        "n = resource.RLIMIT_NOFILE; resource.setrlimit(n, (1024, resource.getrlimit(n)[1]));"
        "worker._open_files_as_many_as_allowed(); print(*resource.getrlimit(n))"
    )
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    with open("/proc/sys/fs/nr_open") as f:
        most = int(f.read())
    with open("/proc/self/status") as f:
        caps = int(next(ln for ln in f if ln.startswith("CapEff:")).split()[1], 16)
    if not caps >> 24 & 1:  # no CAP_SYS_RESOURCE (a container may withhold it, as here)
        most = hard
    plain = [sys.executable, "-c", code]
    r = subprocess.run(
        plain, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1]
    )
    assert r.stdout.split() == [str(most)] * 2, r.stdout + r.stderr
    if shutil.which("setpriv"):
        unprivileged = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", *plain]
        r = subprocess.run(
            unprivileged, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1]
        )
        assert r.stdout.split() == [str(hard)] * 2, r.stdout + r.stderr


def test_a_pause_frame_cut_short_is_not_read_past_its_end(erack):
    """A MAC control frame of 20 bytes (enable vector, no room for the data
    class's quanta) on h0's link: h0's NIC honours no pause from it (it used
    to read the two bytes after the frame as the quanta)."""
    a = Endpoint(erack.name, "h0")
    try:
        hp = erack.port("h0", plane=2)
        short = (hp.mac + hp.gw_mac + b"\x88\x08\x01\x01\x00\xff\xff\xff")[:20]
        before = a.counters()["pauses_rx"]
        send_from_switch(erack, "h0", [short] * 10, plane=2)
        whole = core.build_pfc(hp.gw_mac, 0x02, 0)  # a genuine resume: honoured
        send_from_switch(erack, "h0", [whole], plane=2)
        time.sleep(0.2)
        assert a.counters()["pauses_rx"] - before == 1
    finally:
        a.close()


def test_a_run_directory_root_does_not_own_alone_is_refused(tmp_path):
    import os

    from dataplane.lab import registry

    d = tmp_path / "run"
    (d / "labs").mkdir(parents=True)
    os.chmod(d, 0o755)
    registry.check_run_dir(d)  # root's, 0755: fine
    os.chmod(d / "labs", 0o777)
    with pytest.raises(registry.RegistryError, match="writable by root only"):
        registry.check_run_dir(d)
    os.chmod(d / "labs", 0o755)
    os.chown(d, 65534, 65534)
    with pytest.raises(registry.RegistryError, match="owner uid 65534"):
        registry.check_run_dir(d)


def test_a_closed_switch_raises_instead_of_passing_null_into_c():
    sw = core.Switch(core.SwitchConfig(), 4)
    sw.close()
    with pytest.raises(OSError, match="closed"):
        sw.set_up(False)
    with pytest.raises(OSError, match="closed"):
        sw.counters(0)


# ---------------------------------------------------------------- 9: processes


@pytest.fixture
def bare_netns():
    """A network namespace of this test's own (ethp-RUNID-...), as a lab node's."""
    name = f"ethp-{RUN_ID}-pn{os.getpid() % 1000}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name, f"/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _spawn_as_pid(pid: int, argv: list[str]) -> subprocess.Popen | None:
    """argv started in a session of its own with pid pid (the kernel's next
    pid set just before), or None if another process took it meanwhile."""
    for _ in range(100):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        p = subprocess.Popen(argv, start_new_session=True)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


@pytest.mark.root
def test_a_finished_ranks_session_is_never_signalled_through_a_recycled_pid(bare_netns):
    """ethplus run signals a rank's whole session when it stops the run.
    Once the rank's leader is reaped its pid is free: a new process given
    that pid, leading a session of its own outside the lab, is left alone;
    what is left of the rank's own session in its lab namespace is not."""
    from types import SimpleNamespace

    from dataplane.run import launcher

    name, path = bare_netns
    rank = subprocess.Popen(["ip", "netns", "exec", name, "sh", "-c", "sleep 60 & exit 0"],
                            start_new_session=True)  # fmt: skip
    rank.wait()  # the leader is gone (reaped); its sleep keeps the session, in the namespace
    left = launcher.session_members(rank.pid, path)
    assert len(left) == 1
    launcher._signal(SimpleNamespace(pid=rank.pid, returncode=0, ethp_netns=path), signal.SIGKILL)
    time.sleep(0.2)
    assert launcher.session_members(rank.pid, path) == [], "the rank's leftover still runs"

    first = subprocess.Popen(["true"], start_new_session=True)
    first.wait()
    other = _spawn_as_pid(first.pid, ["sleep", "60"])
    if other is None:
        pytest.skip("the machine took every pid we tried for itself")
    try:
        gone = SimpleNamespace(pid=first.pid, returncode=0, ethp_netns=path)
        launcher._signal(gone, signal.SIGKILL)
        time.sleep(0.2)
        assert other.poll() is None, "a recycled pid's session was killed"
    finally:
        other.kill()
        other.wait()


@pytest.mark.root
def test_a_rank_whose_launcher_is_gone_never_runs_under_a_subreaper(bare_netns):
    """A rank's start checks that its parent is still the ethplus run that
    started it (told in its environment), not merely that it is not init:
    a subreaper adopts orphans."""
    _name, path = bare_netns
    cmd = [sys.executable, "-I", "-m", "dataplane.run.launcher", "nolab", path, "--", "echo", "ran"]
    for told, ran in ((1, False), (os.getpid() + 1, False), (os.getpid(), True)):
        env = {**os.environ, "ETHPLUS_PARENT_PID": str(told)}
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd="/")
        assert (r.returncode == 0 and r.stdout == "ran\n") == ran, (told, r.returncode, r.stderr)
