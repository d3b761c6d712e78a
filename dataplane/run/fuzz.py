"""A protocol-aware frame fuzzer: frames that are valid up to one field.

Each base frame is what a node would send: every opcode of ETH+ (and of the
emulated RoCE, on UDP port 4791), in the UDP and the compact form, from the
sending node's own address to a target node (or, for in-network frames, to
an aggregator).  Then exactly one thing is wrong with it: a header field set
to a boundary value (0, all ones, PSNs at the receive window's edges, SACK
bases far away, lengths past the payload, aggregation members, indices,
windows, types and operators out of range, epochs of nobody), the flags in
every combination of trimmed, last and the rest, an INT block claiming more
hops than it has room for, an unknown version, a cut-short or overlong
frame.  The fields not under test are drawn at random each round, so the
stream never repeats exactly.

Used by ``tests/test_fuzz.py`` and ``scripts/fuzz_frames.py``.
"""

from __future__ import annotations

import ipaddress
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dataplane.lab import core, nic, registry
from dataplane.report import stats
from dataplane.run import job
from dataplane.run.job import Job, Plan

lib = core.lib
ROCE_UDP_PORT = lib.ETHP_ROCE_UDP_PORT
NIC_WINDOW = 16384  # nic.c's NIC_WIN and NIC_RWIN
# offset and size of each ETH+ header field (docs/wire-format.md)
FIELDS = {
    "ver_op": (0, 1), "flags": (1, 1), "entropy": (2, 2), "src_ep": (4, 2), "dst_ep": (6, 2),
    "msg_id": (8, 4), "psn": (12, 4), "offset": (16, 4), "tag": (20, 4), "len": (24, 2),
    "tos": (26, 1), "hops": (27, 1), "ts_ns": (28, 4), "src_epoch": (32, 4),
    "dst_epoch": (36, 4),
}  # fmt: skip
OPCODES = (
    lib.ETHP_OP_DATA, lib.ETHP_OP_ACK, lib.ETHP_OP_NACK, lib.ETHP_OP_RNR, lib.ETHP_OP_CNP,
    lib.ETHP_OP_AGG, lib.ETHP_OP_AGG_RESULT, lib.ETHP_OP_HELLO,
)  # fmt: skip
_FLAG_BITS = (
    lib.ETHP_F_TRIMMED, lib.ETHP_F_LAST, lib.ETHP_F_ECN_ECHO, lib.ETHP_F_TRIMMABLE,
    lib.ETHP_F_RETX, lib.ETHP_F_INT,
)  # fmt: skip


@dataclass(frozen=True)
class Node:
    """One end, as the sender sees it on one plane."""

    mac: bytes  # the sender's port (or, for the target, its port)
    gw_mac: bytes  # the switch's port facing it
    ip: int
    ep: int


def _agg_word(dtype: int, op: int, window: int) -> int:
    return dtype << 24 | op << 16 | window


def _boundaries(agg_ep: int) -> dict[str, list[int]]:
    """The values each field is set to in turn."""
    top = (1 << 32) - 1
    return {
        "ver_op": [0x00 | 1, 0x10 | 1, 0x30 | 1, 0xF0 | 1, 0x20 | 0, 0x20 | 9, 0x20 | 15],
        "flags": [sum(b for i, b in enumerate(_FLAG_BITS) if m >> i & 1) for m in range(64)]
        + [0xC0, 0xFF],
        "entropy": [0, 0xFFFF],
        "src_ep": [0, 0xEFFF, agg_ep, 0xFFFF],
        "dst_ep": [0, 0xEFFF, agg_ep, 0xFFFF],
        "msg_id": [0, top],
        "psn": [0, 1, NIC_WINDOW - 1, NIC_WINDOW, NIC_WINDOW + 1, (1 << 31) - 1, 1 << 31, top],
        "offset": [0, (1 << 31), top - 63, top],  # acks: SACK bases far away
        "tag": [0, top, 2 << 16 | 5, 4097 << 16, 0xFFFF],  # agg: index past members, too many
        "len": [0, 1, 63, 65, 4096, 65535],  # the payload carries 64 (data) or 8 (ack)
        "tos": [0, 3, 0xFF],
        "hops": [0xFF],
        "ts_ns": [
            _agg_word(9, 0, 16),
            _agg_word(0, 7, 16),
            _agg_word(0, 0, 0),
            _agg_word(0, 0, 0xFFFF),
            top,
        ],  # fmt: skip
        "src_epoch": [0, 1, top],
        "dst_epoch": [1, top],
    }


def _cases(agg_ep: int) -> list[tuple[str, str, object]]:
    """(field or 'shape', value) pairs, in a fixed order."""
    out: list[tuple[str, str, object]] = []
    for name, values in _boundaries(agg_ep).items():
        out += [("field", name, v) for v in values]
    out += [("shape", "int_hops", v) for v in (6, 0xFF)]  # INT: more records than room
    out += [("shape", "cut", v) for v in (1, 8, 39, 41)]  # bytes cut off the end
    out += [("shape", "extra", v) for v in (1, 100)]  # bytes past what len says
    return out


class Fuzzer:
    """An endless stream of (case name, frame) from src to dst (and to the
    aggregator agg_id for the in-network opcodes)."""

    def __init__(self, src: Node, dst: Node, agg_id: int, seed: int = 1):
        self.src, self.dst, self.agg_id = src, dst, agg_id
        self.agg_ep = lib.ETHP_AGG_EP_BASE + agg_id
        self.rng = random.Random(seed)
        self.cases = _cases(self.agg_ep)

    def _base(self, form: str, opcode: int) -> tuple[bytes, int]:
        """A frame the sender could send, and its ETH+ header's offset."""
        rng, src, dst = self.rng, self.src, self.dst
        to_agg = opcode in (lib.ETHP_OP_AGG, lib.ETHP_OP_AGG_RESULT)
        payload = {
            lib.ETHP_OP_DATA: 64, lib.ETHP_OP_ACK: 8, lib.ETHP_OP_AGG: 64,
            lib.ETHP_OP_AGG_RESULT: 64,
        }.get(opcode, 0)  # fmt: skip
        ev = rng.randrange(1 << 12) << 4
        addr = core.Addr(
            dst_mac=src.gw_mac,
            src_mac=src.mac,
            src_ip=src.ip,
            dst_ip=lib.ETHP_AGG_NET + self.agg_id if to_agg else dst.ip,
            src_port=0xC000 | (ev & 0x3FFF),
            dst_port=ROCE_UDP_PORT if form == "roce" else core.UDP_PORT,
            tos=2,
        )
        hdr = core.Header(
            opcode=opcode,
            flags=lib.ETHP_F_LAST if opcode == lib.ETHP_OP_DATA else 0,
            entropy=ev,
            src_ep=src.ep,
            dst_ep=self.agg_ep if to_agg else dst.ep,
            msg_id=rng.randrange(1 << 32),
            psn=rng.randrange(1 << 32),
            offset_bytes=rng.randrange(1 << 20),
            tag=(4 << 16 | 1) if to_agg else rng.randrange(1 << 32),
            len_bytes=payload,
            tos=2,
            ts_ns=_agg_word(0, 0, 16) if to_agg else rng.randrange(1 << 32),
            src_epoch=rng.randrange(1, 1 << 32),
            dst_epoch=rng.choice((0, rng.randrange(1, 1 << 32))),
        )
        body = rng.randbytes(payload)
        frame = core.build_frame(addr, hdr, body, compact=form == "compact")
        hdr_off = core.ETH_HDR_BYTES + (
            0 if form == "compact" else core.IPV4_HDR_BYTES + core.UDP_HDR_BYTES
        )
        return frame, hdr_off

    def _mutate(self, frame: bytes, hdr_off: int, case: tuple[str, str, object]) -> bytes:
        kind, name, value = case
        b = bytearray(frame)
        if kind == "field":
            off, size = FIELDS[name]
            b[hdr_off + off : hdr_off + off + size] = int(value).to_bytes(size, "big")
        elif name == "int_hops":  # an INT block (flag set) whose count exceeds its room
            b[hdr_off + 1] |= lib.ETHP_F_INT
            at = hdr_off + core.ETHP_HDR_BYTES
            block = bytes([int(value), lib.ETHP_INT_MAX_HOPS, 0, 0]) + bytes(lib.ETHP_INT_BYTES - 4)
            b[at:at] = block
            self._fix_lengths(b, hdr_off)
        elif name == "cut":
            del b[-int(value) :]
        else:  # "extra": more payload than len says
            b += bytes(int(value))
            self._fix_lengths(b, hdr_off)
        return bytes(b)

    @staticmethod
    def _fix_lengths(b: bytearray, hdr_off: int) -> None:
        """IPv4 and UDP lengths (and the IPv4 checksum) of the frame as it is
        now, so that only the ETH+ layer is wrong."""
        if hdr_off == core.ETH_HDR_BYTES:
            return  # compact: no IP layer
        ip = core.ETH_HDR_BYTES
        total = len(b) - ip
        b[ip + 2 : ip + 4] = total.to_bytes(2, "big")
        b[ip + 10 : ip + 12] = b"\0\0"
        b[ip + 10 : ip + 12] = core.inet_csum(bytes(b[ip : ip + 20])).to_bytes(2, "big")
        udp = ip + core.IPV4_HDR_BYTES
        b[udp + 4 : udp + 6] = (total - core.IPV4_HDR_BYTES).to_bytes(2, "big")

    def frames(self) -> Iterator[tuple[str, bytes]]:
        """(case, frame) for ever: every form x opcode x case, round after round."""
        while True:
            for form in ("udp", "compact", "roce"):
                for opcode in OPCODES:
                    for case in self.cases:
                        frame, hdr_off = self._base(form, opcode)
                        name = f"{form}/op{opcode}/{case[1]}={case[2]}"
                        yield name, self._mutate(frame, hdr_off, case)


# ---------------------------------------------------------------- a campaign


def node(rec: dict, name: str, plane: int = 0) -> Node:
    """A lab node's port on plane, as a Node."""
    nodes = {n["name"]: n for n in rec["topology"]["nodes"]}
    p = next(q for q in nodes[name]["ports"] if q.get("plane", 0) == plane)
    sw = nodes[p["peer"]]
    gw = next(q for q in sw["ports"] if q["link"] == p["link"])
    return Node(
        mac=bytes.fromhex(p["mac"].replace(":", "")),
        gw_mac=bytes.fromhex(gw["mac"].replace(":", "")),
        ip=int(ipaddress.IPv4Address(p["ip"])),
        ep=nodes[name]["index"],
    )


def _link_end(rec: dict, name: str, switch_side: bool, plane: int = 0) -> tuple[str, str]:
    """(interface, namespace) of name's link on plane: its own end, or the
    switch's."""
    nodes = {n["name"]: n for n in rec["topology"]["nodes"]}
    p = next(q for q in nodes[name]["ports"] if q.get("plane", 0) == plane)
    if not switch_side:
        return p["ifname"], rec["namespaces"][name]
    sw = nodes[p["peer"]]
    return next(q["ifname"] for q in sw["ports"] if q["link"] == p["link"]), rec["namespaces"][
        sw["name"]
    ]


def send(rec: dict, attacker: str, target: str, n_frames: int, rate_fps: float, seed: int = 1,
         stop=None) -> dict:  # fmt: skip
    """n_frames fuzzed frames, half from attacker's plane-0 port (through its
    switch: the switch's parser, source guard and aggregator see them), half
    put on target's plane-0 link from the switch's side, as the switch would
    deliver them (the target's NIC sees even what a switch would drop).
    Paced at rate_fps.  Returns what was sent: frames, seconds, by route."""
    src, dst = node(rec, attacker), node(rec, target)
    ids = {n["name"]: i for i, n in enumerate(
        x for x in rec["topology"]["nodes"] if x["role"] == "switch")}  # fmt: skip
    nodes = {n["name"]: n for n in rec["topology"]["nodes"]}
    plane0_switch = next(q["peer"] for q in nodes[attacker]["ports"] if q.get("plane", 0) == 0)
    fz = Fuzzer(src, dst, ids[plane0_switch], seed)
    pool = core.Pool(1024, 9300)
    via_switch = core.Port(*_link_end(rec, attacker, switch_side=False))
    direct = core.Port(*_link_end(rec, target, switch_side=True))
    rewrite = dst.mac + dst.gw_mac
    sent = {"via_switch": 0, "direct": 0}
    t0 = time.monotonic()
    burst: dict[str, list[bytes]] = {"via_switch": [], "direct": []}
    ports = {"via_switch": via_switch, "direct": direct}
    try:
        for i, (_case, frame) in enumerate(fz.frames()):
            if i >= n_frames or (stop is not None and stop.is_set()):
                break
            route = "direct" if i % 2 else "via_switch"
            burst[route].append(rewrite + frame[12:] if route == "direct" else frame)
            if len(burst[route]) == 32:
                _flush(ports[route], pool, burst[route])
                sent[route] += 32
                burst[route] = []
                ahead = sum(sent.values()) / rate_fps - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        for route, frames in burst.items():
            _flush(ports[route], pool, frames)
            sent[route] += len(frames)
    finally:
        via_switch.close()
        direct.close()
    seconds = time.monotonic() - t0
    total = sum(sent.values())
    return {"frames": total, "seconds": seconds, "fps": total / max(seconds, 1e-9), **sent}


def _flush(port, pool, frames: list[bytes]) -> None:
    done = 0
    while done < len(frames):
        k = port.send(frames[done:], pool)
        done += k
        if done < len(frames):
            time.sleep(0.0005)


def campaign(lab: str, n_frames: int, *, attacker: str = "h3", target: str = "h0",
             transport: str = "ethplus", rate_fps: float = 20000, size_bytes: int = 4 << 20,
             seed: int = 1) -> dict:  # fmt: skip
    """Fuzz lab's target from attacker while the other accelerators run
    all-reduces over transport, one job after another until the frames are
    sent (every run of every job checked against numpy).  Returns what was
    sent, each job's rows, the switches' drops by reason and their
    conservation check, and the endpoints' receive fates and theirs."""
    rec = registry.load_lab(lab)
    hosts = [n["name"] for n in rec["topology"]["nodes"] if n["role"] == "host"]
    members = [h for h in hosts if h != attacker]
    before_st = job.fabric_stats(lab)
    before = stats.totals(before_st)
    done = threading.Event()
    result: dict = {"jobs": [], "errors": []}

    def run_jobs() -> None:
        while not done.is_set():
            plan = Plan(lab=lab, transport=transport, collective="all-reduce",
                        sizes=[size_bytes], iters=3, warmup=1, check_all=True,
                        nodes=members, stall_s=120)  # fmt: skip
            try:
                res = Job(plan, rec).run()
            except job.JobError as e:
                result["errors"].append(str(e))
                return
            result["jobs"].append(res)

    t = threading.Thread(target=run_jobs)
    t.start()
    try:
        sent = send(rec, attacker, target, n_frames, rate_fps, seed)
    finally:
        done.set()
        t.join()
    after_st = _quiet(lab)
    after = stats.totals(after_st)
    switch = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    facing = [name for name, sw in after_st["switches"].items()
              if any(p["peer"] == attacker for p in sw["ports"].values())]  # fmt: skip

    def rx_from_attacker(st: dict) -> int:
        ports = (p for name in facing for p in st["switches"][name]["ports"].values())
        return sum(p["rx_frames"] for p in ports if p["peer"] == attacker)

    def ring_drops(st: dict) -> int:  # a switch's RX ring is shared by its ports
        return sum(st["switches"][name]["ring"]["drop_ring"] for name in facing)

    ranks = [r for res in result["jobs"] for r in res["ranks"]]
    nic_totals = {
        k: sum(r["counters"].get(k, 0) for r in ranks) for k in ("rx_frames", *nic.RX_FATES)
    }
    return {
        "sent": sent,
        "switch_rx_from_attacker": rx_from_attacker(after_st) - rx_from_attacker(before_st),
        # what the kernel dropped on the way into the attacker's switches (an
        # RX ring full: a busy host), anyone's frames: at most this many of its
        "switch_ring_drops_near_attacker": ring_drops(after_st) - ring_drops(before_st),
        "rows": [row for res in result["jobs"] for row in res["rows"]],
        "errors": result["errors"],
        "switch_reasons": {k: switch.get(k, 0) for k in stats.DROP_REASONS if switch.get(k)},
        "switch_conservation": stats.conservation(after),
        "nic_fates": {k: v for k, v in nic_totals.items() if v},
        "nic_conservation": [nic.conservation(r["counters"]) for r in ranks],
    }


def _quiet(lab: str, timeout_s: float = 20.0) -> dict:
    """The fabric's counters once nothing is queued or on a wire in it."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = job.fabric_stats(lab)
        t = stats.totals(st)
        if t.get("q_frames", 0) + t.get("wire_frames", 0) == 0 or time.monotonic() > deadline:
            return st
        time.sleep(0.05)
