"""The one module that owns the compiled C core (``dataplane._ethp``).

It loads the extension and checks that it matches the header this Python
code was written against; nothing else imports ``dataplane._ethp``.  The
switch, ports, pools and wire format have their typed wrappers here; the
modules that wrap one C object each (nic.py the NIC engine, memfabric.py
the in-memory fabric, clock.py the fabric clock, capture.py and fuzz.py
raw frames) take ``ffi`` and ``lib`` from here, and only they do (the
model and the command line import no C: tests/test_layers.py).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field, fields

from dataplane.errors import EthplusError
from dataplane.scale import Scale

try:
    from dataplane._ethp import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "the ethplus C core is not built: run `pip install -e .` in the checkout"
    ) from exc

ABI_VERSION = 47

if lib.ethp_abi_version() != ABI_VERSION:  # pragma: no cover - stale build
    raise ImportError(
        f"ethplus C core ABI {lib.ethp_abi_version()} != expected {ABI_VERSION}: "
        "the extension is stale, rerun `pip install -e .`"
    )

# the nice value of the fabric's process and of every NIC engine thread
DATAPLANE_NICE = lib.ETHP_NIC_NICE
ETH_HDR_BYTES = lib.ETHP_ETH_HDR_BYTES
IPV4_HDR_BYTES = lib.ETHP_IPV4_HDR_BYTES
UDP_HDR_BYTES = lib.ETHP_UDP_HDR_BYTES
ETHP_HDR_BYTES = lib.ETHP_HDR_BYTES
MAX_FRAME_BYTES = lib.ETHP_MAX_FRAME_BYTES
UDP_PORT = lib.ETHP_UDP_PORT
ETHERTYPE_COMPACT = lib.ETHP_ETHERTYPE_COMPACT

OPCODES = {
    "data": lib.ETHP_OP_DATA,
    "ack": lib.ETHP_OP_ACK,
    "nack": lib.ETHP_OP_NACK,
    "rnr": lib.ETHP_OP_RNR,
}
FLAGS = {
    "trimmed": lib.ETHP_F_TRIMMED,
    "last": lib.ETHP_F_LAST,
    "ecn_echo": lib.ETHP_F_ECN_ECHO,
    "trimmable": lib.ETHP_F_TRIMMABLE,
    "retx": lib.ETHP_F_RETX,
    "int": lib.ETHP_F_INT,
    "busy": lib.ETHP_F_BUSY,
}
KINDS = {
    lib.ETHP_KIND_OTHER: "other",
    lib.ETHP_KIND_IPV4: "ipv4",
    lib.ETHP_KIND_ETHP_UDP: "ethp-udp",
    lib.ETHP_KIND_ETHP_COMPACT: "ethp-compact",
    lib.ETHP_KIND_MACCTL: "macctl",
    lib.ETHP_KIND_ROCE_UDP: "roce-udp",
}
PARSE_ERRORS = {
    lib.ETHP_ERR_TRUNCATED: "truncated",
    lib.ETHP_ERR_OVERSIZE: "oversize",
    lib.ETHP_ERR_CSUM: "bad IPv4 checksum",
    lib.ETHP_ERR_IPV4: "bad IPv4 header",
    lib.ETHP_ERR_VERSION: "unknown ETH+ version",
    lib.ETHP_ERR_NOSPACE: "buffer too small",
    lib.ETHP_ERR_ARG: "invalid argument",
}

PORT_COUNTERS: tuple[str, ...] = tuple(
    ffi.string(lib.ethp_port_counter_name(i)).decode() for i in range(lib.ethp_port_counter_count())
)
# A switch's receiving port, whole-switch (ethp_switch_ring_counters)
RING_COUNTERS = (
    "drop_ring", "drop_no_buf", "drop_foreign",
    "rx_one_by_one", "ring_builds", "ring_parks", "ring_failures", "ring_up", "ring_backoffs",
    "one_by_one_drops",  # of drop_ring: lost while frames came one by one
)  # fmt: skip


class WireError(EthplusError, ValueError):
    """A frame could not be built or parsed; .code is the C error."""

    def __init__(self, code: int):
        self.code = code
        super().__init__(PARSE_ERRORS.get(code, f"error {code}"))


def _oserror(rc: int, what: str) -> OSError:
    return OSError(-rc, f"{what}: {os.strerror(-rc)}")


def _check(rc: int, what: str) -> int:
    """A C call's result: a negative errno becomes an OSError saying what failed."""
    if rc < 0:
        raise _oserror(rc, what)
    return rc


# ---------------------------------------------------------------- wire


@dataclass
class Addr:
    """Ethernet and IPv4/UDP addressing of a frame (host byte order)."""

    dst_mac: bytes = b"\x02\x00\x00\x00\x00\x02"
    src_mac: bytes = b"\x02\x00\x00\x00\x00\x01"
    src_ip: int = 0
    dst_ip: int = 0
    src_port: int = 0
    dst_port: int = UDP_PORT
    tos: int = 0
    ttl: int = 64
    ip_id: int = 0


@dataclass
class Header:
    """Fields of an ETH+ header (host byte order)."""

    opcode: int = lib.ETHP_OP_DATA
    flags: int = 0
    entropy: int = 0
    src_ep: int = 0
    dst_ep: int = 0
    msg_id: int = 0
    psn: int = 0
    offset_bytes: int = 0
    tag: int = 0
    len_bytes: int = 0
    tos: int = 0
    hops: int = 0
    ts_ns: int = 0
    src_epoch: int = 0
    dst_epoch: int = 0


@dataclass
class Parsed:
    kind: str
    ethertype: int
    addr: Addr
    ecn: int
    ip_proto: int
    payload: bytes
    header: Header | None = None
    offsets: dict[str, int] = field(default_factory=dict)
    # INT records (flag "int"): one per switch the packet left, in path order
    int_hops: list[dict[str, int]] | None = None


_ADDR_FIELDS = ("src_ip", "dst_ip", "src_port", "dst_port", "tos", "ttl", "ip_id")
_HDR_FIELDS = tuple(Header.__dataclass_fields__)
_INT_FIELDS = ("port_id", "qlen_64b", "ts_ns", "tx_bytes", "rate_kbps")


def _c_addr(a: Addr):
    c = ffi.new("struct ethp_l2l3 *")
    ffi.memmove(c.dst_mac, a.dst_mac, 6)
    ffi.memmove(c.src_mac, a.src_mac, 6)
    for name in _ADDR_FIELDS:
        setattr(c, name, getattr(a, name))
    return c


def _c_hdr(h: Header):
    c = ffi.new("struct ethp_hdr_fields *")
    for name in _HDR_FIELDS:
        setattr(c, name, getattr(h, name))
    return c


def build_frame(addr: Addr, hdr: Header, payload: bytes = b"", compact: bool = False) -> bytes:
    """Build one ETH+ frame (IPv4/UDP, or the compact EtherType form)."""
    out = ffi.new("uint8_t[]", MAX_FRAME_BYTES + 64)
    build = lib.ethp_build_compact if compact else lib.ethp_build_udp
    src = ffi.from_buffer(payload) if payload else ffi.NULL
    n = build(out, len(out), _c_addr(addr), _c_hdr(hdr), src, len(payload))
    if n < 0:
        raise WireError(n)
    return bytes(ffi.buffer(out, n))


def parse_frame(frame: bytes) -> Parsed:
    """Parse a frame; raises WireError for malformed ones."""
    p = ffi.new("struct ethp_parsed *")
    rc = lib.ethp_parse(ffi.from_buffer(frame), len(frame), p)
    if rc < 0:
        raise WireError(rc)
    a = p.addr
    addr = Addr(
        dst_mac=bytes(a.dst_mac),
        src_mac=bytes(a.src_mac),
        **{name: getattr(a, name) for name in _ADDR_FIELDS},
    )
    header = None
    if rc in (lib.ETHP_KIND_ETHP_UDP, lib.ETHP_KIND_ETHP_COMPACT, lib.ETHP_KIND_ROCE_UDP):
        header = Header(**{name: getattr(p.hdr, name) for name in _HDR_FIELDS})
    off = p.payload_off
    int_hops, offsets = None, {"l3": p.l3_off, "l4": p.l4_off, "hdr": p.hdr_off, "payload": off}
    if p.int_off:
        offsets["int"] = p.int_off
        hops = ffi.new("struct ethp_int_hop[]", lib.ETHP_INT_MAX_HOPS)
        n = lib.ethp_int_decode(ffi.from_buffer(frame), p.int_off, hops)
        int_hops = [{k: getattr(h, k) for k in _INT_FIELDS} for h in hops[0:n]]
    return Parsed(
        kind=KINDS[rc],
        ethertype=p.ethertype,
        addr=addr,
        ecn=p.ecn,
        ip_proto=p.ip_proto,
        payload=bytes(frame[off : off + p.payload_bytes]),
        header=header,
        offsets=offsets,
        int_hops=int_hops,
    )


def inet_csum(data: bytes) -> int:
    """RFC 1071 checksum, as the 16-bit value stored big-endian in a header."""
    v = lib.ethp_inet_csum(ffi.from_buffer(data), len(data))
    return int.from_bytes(v.to_bytes(2, "little"), "big")


def wire_bytes(frame_bytes: int) -> int:
    """Bytes a frame occupies on the wire (FCS, preamble, gap, minimum size)."""
    return lib.ethp_wire_bytes(frame_bytes)


# ---------------------------------------------------------------- pool


class Pool:
    """A fixed set of packet buffers, allocated once."""

    def __init__(self, n_pkts: int, buf_bytes: int = 2048, small: tuple[int, int] = (0, 0)):
        """small: (how many, bytes each) small buffers beside the full-size
        ones, for frames that fit (get_for, and a port's receive)."""
        self._p = lib.ethp_pool_new_sized(n_pkts, buf_bytes, *small)
        if self._p == ffi.NULL:
            raise MemoryError(
                f"cannot allocate a pool of {n_pkts} x {buf_bytes} bytes"
                + (f" and {small[0]} x {small[1]}" if small[0] else "")
            )
        self._p = ffi.gc(self._p, lib.ethp_pool_free)

    @property
    def available(self) -> int:
        return lib.ethp_pool_available(self._p)

    @property
    def size(self) -> int:
        return lib.ethp_pool_size(self._p)

    def get(self, n: int):
        """Take up to n packets; returns a cffi array of struct ethp_pkt *."""
        arr = ffi.new("struct ethp_pkt *[]", n)
        got = lib.ethp_pool_get(self._p, arr, n)
        return arr, got

    def get_for(self, len_bytes: int):
        """One packet for a frame of len_bytes (small if it fits), or None."""
        k = lib.ethp_pool_get_for(self._p, len_bytes)
        return None if k == ffi.NULL else k

    def put(self, pkts, n: int) -> int:
        return lib.ethp_pool_put(self._p, pkts, n)


# ---------------------------------------------------------------- port


@dataclass(frozen=True)
class PortConfig:
    block_bytes: int = 1 << 16
    n_blocks: int = 16
    block_timeout_ms: int = 1
    sndbuf_bytes: int = 4 << 20
    # 0: the RX ring is up for the port's life.  Otherwise frames come one by
    # one until a run of traffic sets the ring up; it is taken down again
    # after this many ms without a frame, or of a trickle of under 2 frames a
    # block (no ring, no timer: an idle port costs nothing).
    ring_idle_ms: int = 0


class Port:
    """An AF_PACKET port (TPACKET_V3 RX ring, TPACKET_V2 TX ring) on one interface."""

    def __init__(self, ifname: str, netns_path: str | None = None, cfg: PortConfig = PortConfig()):
        c = ffi.new("struct ethp_port_cfg *")
        c.block_bytes, c.n_blocks = cfg.block_bytes, cfg.n_blocks
        c.block_timeout_ms, c.sndbuf_bytes = cfg.block_timeout_ms, cfg.sndbuf_bytes
        c.ring_idle_ms = cfg.ring_idle_ms
        err = ffi.new("int *")
        ns = netns_path.encode() if netns_path else ffi.NULL
        p = lib.ethp_port_open(ns, ifname.encode(), c, err)
        if p == ffi.NULL:
            raise _oserror(err[0], f"cannot open AF_PACKET port on {ifname}")
        self._p = ffi.gc(p, lib.ethp_port_close)
        self.ifname = ifname

    def close(self) -> None:
        if self._p is not None:
            ffi.release(self._p)  # runs ethp_port_close now, not at garbage collection
            self._p = None

    def fileno(self) -> int:
        """The receive socket, for select/poll over several ports."""
        return lib.ethp_port_fd(self._p)

    def wait(self, timeout_ms: int) -> bool:
        return _check(lib.ethp_port_wait(self._p, timeout_ms), f"poll on {self.ifname}") > 0

    def send(self, frames: list[bytes], pool: Pool, ifindex: int = 0) -> int:
        """Copy frames into pool buffers and send them in one burst, out of
        this port's interface or (ifindex) another of its namespace's, as a
        switch's one port sends out of each of its interfaces."""
        pkts, got = pool.get(len(frames))
        try:
            if got < len(frames):
                raise MemoryError("packet pool exhausted")
            for i, f in enumerate(frames):
                if len(f) > pkts[i].cap:
                    raise WireError(lib.ETHP_ERR_OVERSIZE)
                ffi.memmove(pkts[i].data, f, len(f))
                pkts[i].len = len(f)
            return lib.ethp_port_tx_burst_to(self._p, pkts, got, ifindex)
        finally:
            pool.put(pkts, got)

    def recv(self, pool: Pool, n: int = 64) -> list[bytes]:
        """Receive up to n frames that are ready now."""
        return [f for _, f in self.recv_stamped(pool, n)]

    def recv_stamped(self, pool: Pool, n: int = 64) -> list[tuple[int, bytes]]:
        """Receive up to n frames that are ready now, each with the time the
        kernel stamped on its arrival (ns since the epoch)."""
        pkts = ffi.new("struct ethp_pkt *[]", n)
        wall = ffi.new("uint64_t[]", n)
        got = lib.ethp_port_rx_burst_stamped(self._p, pool._p, pkts, wall, n)
        frames = [(wall[i], bytes(ffi.buffer(pkts[i].data, pkts[i].len))) for i in range(got)]
        pool.put(pkts, got)
        return frames

    def blast(
        self,
        frame: bytes,
        n_frames: int,
        vary_off: int = 0,
        timeout_ms: int = 60_000,
        rate_pps: int = 0,
    ) -> int:
        """Send n_frames copies of frame from C (a traffic generator; rate_pps
        paces it, 0 is as fast as possible); the GIL is released."""
        return lib.ethp_port_blast(
            self._p, frame, len(frame), n_frames, vary_off, timeout_ms, rate_pps
        )

    def relay(self, out: Port, duration_ms: int) -> int:
        """Forward every frame received here out of `out`, unchanged, for
        duration_ms (a bare forwarder: the switch's I/O without its
        pipeline); the GIL is released.  Returns the frames handed on."""
        return lib.ethp_port_relay(self._p, out._p, duration_ms)

    def counters(self) -> dict[str, int]:
        out = ffi.new("uint64_t[]", len(PORT_COUNTERS))
        lib.ethp_port_counters(self._p, out)
        return dict(zip(PORT_COUNTERS, out, strict=True))

    @property
    def ring_up(self) -> bool:
        """Whether frames go to the RX ring now (always, without ring_idle_ms)."""
        return bool(lib.ethp_port_ring_up(self._p))


# ---------------------------------------------------------------- netns


def netns_rundir_init(rundir: str) -> None:
    _check(lib.ethp_netns_rundir_init(rundir.encode()), f"cannot prepare {rundir}")


def netns_create(path: str) -> None:
    _check(lib.ethp_netns_create(path.encode()), f"cannot create network namespace {path}")


def netns_delete(path: str) -> None:
    rc = lib.ethp_netns_delete(path.encode())
    if rc < 0 and rc != -errno.ENOENT:
        raise _oserror(rc, f"cannot delete network namespace {path}")


def netns_socket(path: str, domain: int, type_: int, proto: int = 0) -> int:
    """A socket created inside the namespace at path (fd; caller closes)."""
    return _check(
        lib.ethp_netns_socket(path.encode(), domain, type_, proto),
        f"cannot open a socket in {path}",
    )


def if_offloads_off(sock_fd: int, ifname: str) -> None:
    _check(
        lib.ethp_if_offloads_off(sock_fd, ifname.encode()),
        f"cannot switch offloads off on {ifname}",
    )


def netns_sysctl(path: str, key: str, value: str) -> None:
    _check(
        lib.ethp_netns_sysctl(path.encode(), key.encode(), value.encode()),
        f"cannot set {key} in {path}",
    )


def netns_proc_net(path: str, name: str, cap_bytes: int = 1 << 16) -> str:
    """/proc/net/<name> as seen inside the namespace at path (the calling
    thread enters it and returns)."""
    buf = ffi.new("char[]", cap_bytes)
    n = _check(
        lib.ethp_netns_proc_net(path.encode(), name.encode(), buf, cap_bytes),
        f"cannot read /proc/net/{name} in {path}",
    )
    return ffi.unpack(buf, n).decode()


def netns_join(path: str) -> None:
    """Move this (single-threaded, about to exec) process into a namespace."""
    _check(lib.ethp_netns_join(path.encode()), f"cannot enter {path}")


def netns_enter_thread(path: str) -> None:
    """Move the calling thread alone into the network namespace at path:
    the sockets it opens from then on are there."""
    _check(lib.ethp_netns_move_thread(path.encode()), f"cannot enter {path}")


# ---------------------------------------------------------------- sockops


def sockops_syn_rto_max(cgroup_dir: str) -> int:
    """Attach csrc/sockops.c's program to a cgroup (cgroup.py): 0 or an errno."""
    return -lib.ethp_sockops_syn_rto_max(cgroup_dir.encode())


def sockops_is_ours(cgroup_dir: str) -> bool:
    """Is that program attached to the cgroup (one ethplus made)?"""
    return lib.ethp_sockops_is_ours(cgroup_dir.encode()) == 1


# ---------------------------------------------------------------- switch

SW_COUNTERS: tuple[str, ...] = tuple(
    ffi.string(lib.ethp_sw_counter_name(i)).decode() for i in range(lib.ethp_sw_counter_count())
)
SW_CLASS_COUNTERS: tuple[str, ...] = tuple(
    ffi.string(lib.ethp_sw_class_counter_name(i)).decode()
    for i in range(lib.ethp_sw_class_counter_count())
)
N_CLASSES = lib.ETHP_NCLASSES
CLASS_NAMES = ("high", "data")
FWD_MODES = {
    "ecmp": lib.ETHP_FWD_ECMP,
    "spray": lib.ETHP_FWD_SPRAY,
    "adaptive": lib.ETHP_FWD_ADAPTIVE,
}


@dataclass
class Link:
    """A link's parameters and faults, in nominal units or real ones (the
    fabric keeps the nominal ones; scaled() gives the real ones)."""

    rate_bps: int
    delay_ns: int
    buffer_bytes: int
    loss: float = 0.0
    corrupt: float = 0.0
    up: bool = True
    llr: bool = False  # link-level retry
    jitter_ns: int = 0

    def scaled(self, k: float) -> dict:
        """These parameters at time scale k: real = nominal rate / k,
        nominal times x k (the one place a link's units are converted)."""
        s = Scale(k)
        return {**{f.name: getattr(self, f.name) for f in fields(Link)},
                "rate_bps": s.real_bps(self.rate_bps), "delay_ns": s.real_ns(self.delay_ns),
                "jitter_ns": s.real_ns(self.jitter_ns)}  # fmt: skip


@dataclass
class LinkState(Link):
    """A switch port's link in real (time-scaled) units, and its two ends."""

    mac: str = ""
    peer_mac: str = ""
    peer_is_host: bool = False

    def to_c(self):
        c = ffi.new("struct ethp_link_state *")
        c.rate_bps, c.delay_ns, c.buffer_bytes = self.rate_bps, self.delay_ns, self.buffer_bytes
        c.jitter_ns = self.jitter_ns
        c.loss, c.corrupt, c.up, c.peer_is_host, c.llr = (
            self.loss,
            self.corrupt,
            self.up,
            self.peer_is_host,
            self.llr,
        )
        ffi.memmove(c.mac, bytes.fromhex(self.mac.replace(":", "")), 6)
        ffi.memmove(c.peer_mac, bytes.fromhex(self.peer_mac.replace(":", "")), 6)
        return c


@dataclass(frozen=True)
class SwitchConfig:
    forwarding: str = "spray"
    ecn: bool = True
    ecn_kmin_bytes: int = 20_000
    ecn_kmax_bytes: int = 80_000
    ecn_pmax: float = 0.2
    trimming: bool = True
    trim_threshold_bytes: int = 100_000
    lossless: bool = False
    pfc_xoff_bytes: int = 200_000
    pfc_xon_bytes: int = 100_000
    pfc_headroom_bytes: int = 0  # 0: from each port's link (switch.c)
    lookahead_ns: int = 50_000
    catchup_ns: int = 2_000_000
    seed: int = 1
    pool_pkts: int = 8192
    buf_bytes: int = 9300
    # small buffers for received frames that fit (acks, handshakes, short
    # messages): a burst of them does not empty the full-size ones
    pool_small_pkts: int = 0
    small_buf_bytes: int = 0
    shared_buffer_bytes: int = 0  # 0: each port has its link's buffer alone
    dt_alpha: float = 1.0
    agg_id: int = 0  # this switch's aggregator number (routing.switch_ids)
    agg_slots: int = 0  # in-network aggregation: chunks held at once; 0: none
    int_id: int = 0  # this switch's number in INT records (HPCC)
    # the switch's receiving port: frames one by one while idle, the RX ring
    # from a run of traffic until this long without a frame (PortConfig)
    ring_idle_ms: int = 100
    hosts_may_pause: bool = False  # PFC frames from accelerator ports: ignored unless True
    pfc_watchdog_ns: int = 0  # real ns; a class paused longer without a break is released


class Switch:
    """One software switch: a C thread forwarding between AF_PACKET ports."""

    def __init__(self, cfg: SwitchConfig, max_ports: int):
        c = ffi.new("struct ethp_switch_cfg *")
        for name, _ in ffi.typeof(c[0]).fields:  # the C struct's fields, all of them
            v = getattr(cfg, name)
            setattr(c, name, FWD_MODES[v] if name == "forwarding" else v)
        sw = lib.ethp_switch_new(c, max_ports)
        if sw == ffi.NULL:
            raise MemoryError("cannot allocate a switch")
        self._sw = sw

    def add_port(self, netns_path: str, ifname: str, link: LinkState) -> int:
        return _check(
            lib.ethp_switch_add_port(
                self._live(), netns_path.encode(), ifname.encode(), link.to_c()
            ),
            f"cannot add switch port {ifname}",
        )

    def add_route(self, kind: str, key: int, ports: list[int]) -> None:
        k = lib.ETHP_ROUTE_IPV4 if kind == "ipv4" else lib.ETHP_ROUTE_EP
        arr = ffi.new("uint16_t[]", ports)
        _check(
            lib.ethp_switch_add_route(self._live(), k, key, arr, len(ports)),
            f"cannot add route {kind} {key} -> {ports}",
        )

    def agg_join(self, group: int, parent_id: int, parent_index: int, parent_members: int) -> None:
        """This switch reduces its members' part of group and sends the
        partial to aggregator parent_id (an inner node of the group's tree)."""
        _check(
            lib.ethp_switch_agg_join(self._live(), group, parent_id, parent_index, parent_members),
            f"cannot join aggregation group {group:#x} under aggregator {parent_id}",
        )

    def agg_leave(self, group: int) -> None:
        lib.ethp_switch_agg_leave(self._live(), group)

    def agg_register(self, group: int, members: list[tuple[int, int]], quota_slots: int) -> None:
        """Aggregate group here: member i sends as (endpoint, IPv4 address)
        members[i]; the group holds at most quota_slots slots at once."""
        eps = ffi.new("uint32_t[]", [ep for ep, _ in members])
        ips = ffi.new("uint32_t[]", [ip for _, ip in members])
        _check(
            lib.ethp_switch_agg_register(self._live(), group, ips, eps, len(members), quota_slots),
            f"cannot register aggregation group {group:#x} ({len(members)} members)",
        )

    def agg_unregister(self, group: int) -> None:
        lib.ethp_switch_agg_unregister(self._live(), group)

    def config(self) -> dict:
        """The switch's settings as its C struct holds them (real units)."""
        c = ffi.new("struct ethp_switch_cfg *")
        lib.ethp_switch_config(self._live(), c)
        out = {name: getattr(c, name) for name, _ in ffi.typeof(c[0]).fields}
        out["forwarding"] = {v: k for k, v in FWD_MODES.items()}[out["forwarding"]]
        return out

    def start(self) -> None:
        _check(lib.ethp_switch_start(self._live()), "cannot start the switch thread")

    def close(self) -> None:
        if self._sw is not None:
            lib.ethp_switch_free(self._sw)
            self._sw = None

    def _live(self):
        """The C switch; a closed one raises (never a NULL into C)."""
        if self._sw is None:
            raise OSError(errno.EBADF, "the switch is closed")
        return self._sw

    def set_link(self, port: int, link: LinkState) -> None:
        _check(
            lib.ethp_switch_set_link(self._live(), port, link.to_c()), f"cannot change port {port}"
        )

    def set_up(self, up: bool) -> None:
        lib.ethp_switch_set_up(self._live(), 1 if up else 0)

    def receive_counters(self) -> tuple[dict[str, int], dict[str, int]]:
        """The switch's one receiving port: frames lost before any port saw
        them, and how it receives (frames one by one while idle, the RX ring
        while busy) and how often that changed."""
        out = ffi.new("uint64_t[]", len(RING_COUNTERS))
        lib.ethp_switch_ring_counters(self._live(), out)
        c = dict(zip(RING_COUNTERS, out, strict=True))
        drops = {k: v for k, v in c.items() if k.startswith("drop_")}
        return drops, {k: v for k, v in c.items() if k not in drops}

    @property
    def wakeups(self) -> int:
        return lib.ethp_switch_wakeups(self._live())

    def buffer(self) -> dict[str, int]:
        """Bytes in all the switch's egress queues now, and the most ever."""
        used, hwm = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        lib.ethp_switch_buffer(self._live(), used, hwm)
        return {"used_bytes": used[0], "hwm_bytes": hwm[0]}

    def counter_rows(self, names: tuple[str, ...], n_ports: int) -> list[list[int]]:
        """Counters names of every port (all n_ports of them added), one row
        per port in port order, read in one call."""
        which = ffi.new("uint32_t[]", [SW_COUNTERS.index(x) for x in names])
        k = len(names)
        out = ffi.new("uint64_t[]", n_ports * k)
        _check(
            lib.ethp_switch_counters_of_all(self._live(), which, k, out, n_ports),
            f"cannot read the counters of {n_ports} ports",
        )
        flat = ffi.unpack(out, n_ports * k)
        return [flat[i : i + k] for i in range(0, n_ports * k, k)]

    def counters(self, port: int) -> dict:
        out = ffi.new("uint64_t[]", len(SW_COUNTERS))
        cls = ffi.new("uint64_t[]", N_CLASSES * len(SW_CLASS_COUNTERS))
        lib.ethp_switch_counters(self._live(), port, out, cls)
        d = dict(zip(SW_COUNTERS, out, strict=True))
        n = len(SW_CLASS_COUNTERS)
        d["classes"] = {
            CLASS_NAMES[c]: dict(zip(SW_CLASS_COUNTERS, cls[c * n : (c + 1) * n], strict=True))
            for c in range(N_CLASSES)
        }
        return d


def build_pfc(src_mac: bytes, class_mask: int, quanta: int) -> bytes:
    out = ffi.new("uint8_t[]", 64)
    n = lib.ethp_build_pfc(out, 64, src_mac, class_mask, quanta)
    if n < 0:
        raise WireError(n)
    return bytes(ffi.buffer(out, n))
