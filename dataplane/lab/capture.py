"""Frames crossing one link of a running lab, both directions: one line each,
or a pcap file that Wireshark and tcpdump read.

Each end of the link is read where the frames arrive (an AF_PACKET ring on
that end's interface, outgoing frames ignored), so every frame is seen once.
Timestamps are the kernel's, taken as each frame reached that end's
interface: a frame into a switch is stamped when its sender put it on the
link (the switch plays the link's delay after reading it), a frame out of a
switch after the link's emulated delay.  The capture's own rings take a
copy of every frame on those interfaces, which costs the switch's core a
little while it runs."""

from __future__ import annotations

import ipaddress
import select
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from dataplane.lab import core, labs, registry
from dataplane.model import routing

PCAP_MAGIC_NS = 0xA1B23C4D  # pcap with nanosecond timestamps
LINKTYPE_ETHERNET = 1
SNAPLEN_BYTES = 65535
HOLD_NS = 20_000_000  # a frame waits this long for older ones from the other end
OPCODES = {
    core.lib.ETHP_OP_DATA: "data",
    core.lib.ETHP_OP_ACK: "ack",
    core.lib.ETHP_OP_NACK: "nack",
    core.lib.ETHP_OP_RNR: "rnr",
    core.lib.ETHP_OP_CNP: "cnp",
    core.lib.ETHP_OP_AGG: "agg",
    core.lib.ETHP_OP_AGG_RESULT: "agg-result",
}
FLAGS = {bit: name.replace("_", "-") for name, bit in core.FLAGS.items()}
IP_PROTOS = {1: "ICMP", 6: "TCP", 17: "UDP"}


@dataclass
class Frame:
    t_ns: int  # wall clock (ns since the epoch)
    src: str  # the node that sent it onto the link
    dst: str
    data: bytes


class PcapWriter:
    """The classic pcap format, nanosecond timestamps, Ethernet frames."""

    def __init__(self, path: str):
        self.f = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.f.write(
            struct.pack("<IHHiIII", PCAP_MAGIC_NS, 2, 4, 0, 0, SNAPLEN_BYTES, LINKTYPE_ETHERNET)
        )

    def write(self, fr: Frame) -> None:
        sec, ns = divmod(fr.t_ns, 1_000_000_000)
        self.f.write(struct.pack("<IIII", sec, ns, len(fr.data), len(fr.data)) + fr.data)

    def close(self) -> None:
        self.f.close()


def read_pcap(path: str) -> list[tuple[int, bytes]]:
    """(t_ns, frame) of every record of a pcap file PcapWriter wrote."""
    with open(path, "rb") as f:
        data = f.read()
    magic, _, _, _, _, _, linktype = struct.unpack_from("<IHHiIII", data)
    if magic != PCAP_MAGIC_NS or linktype != LINKTYPE_ETHERNET:
        raise ValueError(f"{path}: not a nanosecond Ethernet pcap")
    out, off = [], 24
    while off < len(data):
        sec, ns, cap, _ = struct.unpack_from("<IIII", data, off)
        out.append((sec * 1_000_000_000 + ns, data[off + 16 : off + 16 + cap]))
        off += 16 + cap
    return out


def _int_hops(hops: list[dict[str, int]], switches: dict[int, str]) -> str:
    """INT records: the port each hop's switch sent the packet from, and the
    queue it left behind there."""
    return " int " + (
        ", ".join(
            f"{switches.get(h['port_id'] >> 10, h['port_id'] >> 10)}/{h['port_id'] & 1023}"
            f" q {h['qlen_64b'] * 64} B"
            for h in hops
        )
        or "(none yet)"
    )


def describe(data: bytes, switches: dict[int, str] | None = None) -> str:
    """One line on what a frame is: ETH+ fields, or IP addresses and ports.
    switches (INT switch id -> name) names the hops of INT records."""
    try:
        p = core.parse_frame(data)
    except core.WireError as exc:
        return f"malformed ({exc})"
    if p.header is not None:
        h = p.header
        flags = ",".join(n for bit, n in FLAGS.items() if h.flags & bit)
        where = (
            f"ep {h.src_ep} > {h.dst_ep}"
            if p.kind == "ethp-compact"
            else f"{ipaddress.IPv4Address(p.addr.src_ip)} > {ipaddress.IPv4Address(p.addr.dst_ip)}"
        )
        name = "RoCE" if p.kind == "roce-udp" else "ETH+"
        if h.opcode in (core.lib.ETHP_OP_AGG, core.lib.ETHP_OP_AGG_RESULT):
            where += f" member {h.tag & 0xFFFF}/{h.tag >> 16}"
        grant = name == "ETH+" and h.opcode in (core.lib.ETHP_OP_ACK, core.lib.ETHP_OP_NACK)
        return (
            f"{name} {OPCODES.get(h.opcode, h.opcode)} {where} psn {h.psn} msg {h.msg_id} "
            f"ev {h.entropy} len {h.len_bytes}" + (f" [{flags}]" if flags else "")
            + (f" grant {h.tag} B" if grant and h.tag else "")
            + (" CE" if p.ecn == 3 else "")
            + ("" if p.int_hops is None else _int_hops(p.int_hops, switches or {}))
        )  # fmt: skip
    if p.kind == "ipv4":
        a = p.addr
        proto = IP_PROTOS.get(p.ip_proto, f"proto {p.ip_proto}")
        ports = f":{a.src_port} > " if p.ip_proto in (6, 17) else " > "
        dst = f":{a.dst_port}" if p.ip_proto in (6, 17) else ""
        return (
            f"{proto} {ipaddress.IPv4Address(a.src_ip)}{ports}"
            f"{ipaddress.IPv4Address(a.dst_ip)}{dst}" + (" CE" if p.ecn == 3 else "")
        )
    if p.kind == "macctl":
        return "MAC control (PFC pause)"
    return f"ethertype 0x{p.ethertype:04x}"


class LinkCapture:
    """Both directions of one link of a running lab."""

    def __init__(self, lab_name: str, link: str):
        rec = labs.get(lab_name)
        self.lab_name = lab_name
        self.gone = False  # the lab went down during the capture
        links = {lk["name"]: lk for lk in rec["topology"]["links"]}
        if link not in links:
            raise labs.LabError(f"no link {link!r} in lab {lab_name} (see `ethplus lab show`)")
        lk = links[link]
        nodes = {n["name"]: n for n in rec["topology"]["nodes"]}
        # INT switch id -> name, for describe()
        self.switches = {i: s for s, i in routing.switch_ids(rec["topology"]).items()}
        self.ends: list[tuple[str, str, core.Port]] = []  # (receiver, sender, port)
        self.pool = core.Pool(4096, 9300)
        try:
            ends = ((lk["a"], lk["a_port"], lk["b"]), (lk["b"], lk["b_port"], lk["a"]))
            for me, my_port, peer in ends:
                ifname = nodes[me]["ports"][my_port]["ifname"]
                cfg = core.PortConfig(block_bytes=1 << 16, n_blocks=256, sndbuf_bytes=1 << 16)
                self.ends.append((me, peer, core.Port(ifname, rec["namespaces"][me], cfg)))
        except BaseException:
            self.close()
            raise

    def run(
        self,
        on_frame: Callable[[Frame], None],
        count: int = 0,
        seconds: float = 0.0,
    ) -> dict[str, int]:
        """Read until count frames (0: no limit), seconds (0: no limit) or
        the lab goes down (self.gone), and hand them to on_frame in the order
        they arrived.  Returns frames per direction ("a>b": n)."""
        seen = {f"{snd}>{rcv}": 0 for rcv, snd, _ in self.ends}
        deadline = time.monotonic() + seconds if seconds else float("inf")
        pending: list[Frame] = []

        def done() -> bool:
            return bool(count) and sum(seen.values()) >= count

        def emit(upto_ns: float) -> None:
            # the two ends' rings hand frames over a block at a time, each
            # on its own timer: a frame is passed on once nothing older can
            # still come from the other end
            pending.sort(key=lambda f: f.t_ns)
            while pending and pending[0].t_ns <= upto_ns and not done():
                fr = pending.pop(0)
                on_frame(fr)
                seen[f"{fr.src}>{fr.dst}"] += 1

        checked = time.monotonic()
        while time.monotonic() < deadline and not done():
            if time.monotonic() - checked > 1.0:  # a quiet link, or a lab that is gone?
                checked = time.monotonic()
                if registry.load_lab(self.lab_name) is None:
                    self.gone = True
                    break
            got = False
            for rcv, snd, port in self.ends:
                for t_ns, data in port.recv_stamped(self.pool, 256):
                    pending.append(Frame(t_ns, snd, rcv, data))
                    got = True
            if not got:
                select.select([port for _, _, port in self.ends], [], [], HOLD_NS / 1e9)
            emit(time.time_ns() - HOLD_NS)
        emit(float("inf"))
        return seen

    def drops(self) -> int:
        """Frames the capture's own rings lost (it read too slowly)."""
        return sum(port.counters()["rx_ring_drops"] for _, _, port in self.ends)

    def close(self) -> None:
        for _, _, port in self.ends:
            port.close()
        self.ends = []
