"""The ETH+ software NIC, from Python: one Endpoint per accelerator node.

Thin over the C engine (dataplane/csrc/nic.c): the engine's thread does all
packet work; Python posts buffers (zero copy, through the buffer protocol)
and waits for completions with the GIL released.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import threading
from dataclasses import dataclass

from dataplane.errors import EthplusError
from dataplane.lab import clock, registry
from dataplane.lab.core import ffi, lib
from dataplane.model.labfile import CC_NAMES, NIC_ETHP_FIELDS, NIC_ROCE_FIELDS, c_values
from dataplane.scale import Scale

NIC_COUNTERS: tuple[str, ...] = tuple(
    ffi.string(lib.ethp_nic_counter_name(i)).decode() for i in range(lib.ethp_nic_counter_count())
)
PAYLOAD_BYTES = 4096  # PROTOCOLS.md: 4096 B of payload per packet (RoCE convention)
EVS = 256  # entropy values per peer (UEC)
# The ETH+ transport's congestion control, by the names lab files and the
# command line use.
CC_ALGOS = dict(
    zip(CC_NAMES, (lib.ETHP_CCA_NSCC, lib.ETHP_CCA_HPCC, lib.ETHP_CCA_RCCC), strict=True)
)
# labfile's [nic] cc declaration fills the C enum by CC_NAMES' order
if list(CC_ALGOS.values()) != list(range(len(CC_NAMES))):
    raise ImportError(f"the C core's congestion-control enum is not in CC_NAMES' order: {CC_ALGOS}")
UNSCALED_RTT_NS = 2_000_000
# No retransmit timeout under this (real): the unscaled part of a real RTT
# (ring retire timers, scheduling) is a few ms on this machine.
RTO_FLOOR_NS = 20_000_000
# How long (real seconds) a peer may answer "receiver not ready" before a send
# to it fails NoReceive: the receiving program's own time (it may be busy
# computing), whatever the time scale.  A job waits this long on a tag
# mismatch; the torch backend uses the group's timeout instead.
RNR_TIMEOUT_S = 60.0
# A port's RX ring holds RX_RING_HOLD_NS of frames at the port's real rate
# (what it absorbs while the engine is off the CPU), from 1 MiB to 16 MiB.
# The ring is taken down after ring_idle_ms idle and built again when
# frames come, and the kernel zeroes all of it each time: at a large k,
# where a port's real traffic is a trickle, 16 MiB rings built over and
# over took 23% of all the CPU of a 64-rank all-reduce (perf, erack-64x8).
RX_RING_HOLD_NS = 200_000_000
RX_RING_BLOCK_BYTES = 64 * 1024  # nic.c's block
RX_RING_MIN_BLOCKS, RX_RING_MAX_BLOCKS = 16, 256


def rx_ring_blocks(rate_real_bps: int) -> int:
    """The RX ring of a port of this real rate, in blocks."""
    want = -(-rate_real_bps * RX_RING_HOLD_NS // (8 * 1_000_000_000 * RX_RING_BLOCK_BYTES))
    return min(RX_RING_MAX_BLOCKS, max(RX_RING_MIN_BLOCKS, want))


# A TPACKET_V3 ring hands its reader a block when the block is full or when
# its retire timer fires, and the kernel re-arms that timer every timeout
# for as long as the ring is up, frames or not.  At 1 ms, upn-512's 512 NIC
# rings (one a rank) fired over 100,000 times a second in an all-to-all over
# all ranks: the timer softirqs took most of both cores, the switches' rings
# overflowed, and the job ran 8 min 27 s (62 s at 8 ms).  A frame's
# wait for the timer is real time that k does not scale, so the timeout is
# at most RX_RING_TIMEOUT_SHARE of the real base RTT: 1 ms wherever that is
# under 100 ms (erack-8x4 at its floor k), up to RX_RING_TIMEOUT_MAX_MS.
RX_RING_TIMEOUT_SHARE = 0.01
RX_RING_TIMEOUT_MAX_MS = 16


def rx_ring_timeout_ms(scaled_rtt_ns: int) -> int:
    """A NIC ring's retire timeout (ms) where the real base RTT, its scaled
    part alone, is scaled_rtt_ns."""
    share_ms = int(scaled_rtt_ns * RX_RING_TIMEOUT_SHARE) // 1_000_000
    return min(RX_RING_TIMEOUT_MAX_MS, max(1, share_ms))


def rings_unscaled_rtt_ns(ring_timeout_ms: int) -> int:
    """What a round trip adds unscaled where the NICs' rings retire blocks
    after ring_timeout_ms (the switches' after 1 ms): UNSCALED_RTT_NS at
    1 ms, and each ms more adds one (a packet and its ack wait in a NIC ring
    each, about half of their timeouts on average)."""
    return UNSCALED_RTT_NS + (ring_timeout_ms - 1) * 1_000_000


# Where each frame an endpoint takes (rx_frames) ends: exactly one of these.
RX_FATES = (
    "rx_malformed", "rx_spoofed", "rx_stale_epoch", "rx_data_pkts", "rx_dup_pkts", "rx_overlap",
    "rx_unexpected_pkts", "rx_trimmed_pkts", "rx_oos_drops", "rx_beyond_window", "rx_acks",
    "rx_nacks", "rx_rnrs", "rx_cnps", "rx_hellos", "inc_rx_results", "inc_dup_results",
)  # fmt: skip


def conservation(counters: dict[str, int]) -> dict[str, int]:
    """An endpoint's receive side balances: every frame it took ended in one
    fate (RX_FATES).  The difference must be zero."""
    fates = sum(counters.get(k, 0) for k in RX_FATES)
    taken = counters.get("rx_frames", 0)
    return {"rx_frames": taken, "fates": fates, "difference": taken - fates}


class NicError(EthplusError, RuntimeError):
    """A transfer failed: the peer was unreachable, or a buffer was too small."""


class Unreachable(NicError):
    pass


class BufferTooSmall(NicError):
    pass


class ShortMessage(NicError):
    """A whole message shorter than the buffer posted for it: its length is
    said (got_bytes), and the tail of the buffer was not written."""

    def __init__(self, peer: int, got_bytes: int, posted_bytes: int):
        super().__init__(
            f"rank {peer} sent a {got_bytes}-byte message where {posted_bytes} bytes were"
            " posted (the rest of the buffer was not written)"
        )
        self.peer, self.got_bytes, self.posted_bytes = peer, got_bytes, posted_bytes


class NoReceive(NicError):
    """The peer never posted a receive for the tag (a tag mismatch, or a peer
    that stopped posting)."""


_ERRORS = {
    lib.ETHP_NIC_ERR_TOO_SMALL: (BufferTooSmall, "message longer than the posted buffer"),
    lib.ETHP_NIC_ERR_UNREACHABLE: (Unreachable, "peer unreachable after the retry budget"),
    lib.ETHP_NIC_ERR_NO_SUCH: (NicError, "no such handle or peer"),
    lib.ETHP_NIC_ERR_NO_GROUP: (NicError, "no aggregation group (in-network all-reduce)"),
    lib.ETHP_NIC_ERR_NO_RECEIVE: (
        NoReceive,
        "the peer posted no receive for this tag within the RNR timeout (tag mismatch?)",
    ),
}


# In-network all-reduce: element types (their code, their bytes) and
# operators the switches reduce.
INC_DTYPES = {"float32": (lib.ETHP_AGG_F32, 4), "int32": (lib.ETHP_AGG_I32, 4),
              "float16": (lib.ETHP_AGG_F16, 2), "bfloat16": (lib.ETHP_AGG_BF16, 2)}  # fmt: skip
SCHED_SEND = lib.ETHP_SCHED_SEND  # schedule.SEND: the one op whose buffer is only read
INC_OPS = {"sum": lib.ETHP_AGG_SUM, "max": lib.ETHP_AGG_MAX, "min": lib.ETHP_AGG_MIN}
# what the engine reduces in a schedule it runs (ethp_reduce_into), by element type
REDUCE_DTYPES = {**{k: v[0] for k, v in INC_DTYPES.items()}, "int64": lib.ETHP_AGG_I64}
INC_WINDOW_BDPS = 4  # chunks in flight per aggregator: this many BDPs of one plane
INC_MIN_WINDOW, INC_MAX_WINDOW = 32, 512


def reduce_into(dst, src, dtype: str, op: str) -> None:
    """dst = dst (op) src element-wise, as the engine reduces a ring's
    slices (ethp_reduce_into; numpy's arithmetic, reference.reduce_into)."""
    d, x = ffi.from_buffer(dst, require_writable=True), ffi.from_buffer(src)
    if len(d) != len(x):
        raise ValueError(f"reduce_into: {len(d)} bytes against {len(x)}")
    item = memoryview(dst).itemsize
    if lib.ethp_reduce_into(d, x, len(d) // item, REDUCE_DTYPES[dtype], INC_OPS[op]) < 0:
        raise ValueError(f"reduce_into: cannot reduce {dtype} with {op}")


@dataclass(frozen=True)
class IncGroup:
    """This endpoint's part in a job's in-network all-reduce."""

    # per stream: (group id, the aggregator it sends to, the plane it goes by,
    # the members there, this endpoint's index there); chunk c -> stream c mod n
    streams: tuple[tuple[int, int, int, int, int], ...]
    slots: int  # the switches' inc_slots
    share: int = 1  # streams of the job that meet at its busiest aggregator


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


@functools.lru_cache(maxsize=1 << 14)
def _ip(text: str) -> int:
    """(Cached: a rank host's ranks each list the same 511 peers' addresses.)"""
    return int(ipaddress.IPv4Address(text))


def engine_cfg(
    rank: int, planes: int, rate_real: int, base_rtt_real: int, k: float, nic: dict, *,
    adaptive: bool, seed: int, max_retries: int, drop_psn: int | None,
    rto_floor_ns: int = RTO_FLOOR_NS, unscaled_rtt_ns: int = UNSCALED_RTT_NS,
    rnr_timeout_s: float = RNR_TIMEOUT_S,
):  # fmt: skip
    """The engine's settings (real times and rates, at time scale k): the
    lab file's [nic] ETH+ keys as declared (labfile.NIC_ETHP_FIELDS; a
    missing one takes its default), then what the fabric gives; and the
    bandwidth-delay product of all its planes."""
    cc = nic.get("cc", NIC_ETHP_FIELDS["cc"].default)
    if cc not in CC_ALGOS:
        raise NicError(f"unknown congestion control {cc!r} (expected {', '.join(CC_ALGOS)})")
    bdp = planes * rate_real * base_rtt_real // 8 // 1_000_000_000
    cfg = ffi.new("struct ethp_nic_cfg *")
    for name, v in c_values(NIC_ETHP_FIELDS, nic, k).items():
        setattr(cfg, name, v)
    cfg.ep = rank
    cfg.payload_bytes = PAYLOAD_BYTES
    cfg.n_evs = EVS
    cfg.adaptive = adaptive
    cfg.max_retries = max_retries
    cfg.rate_bps = rate_real
    cfg.rx_ring_blocks = rx_ring_blocks(rate_real)
    cfg.base_rtt_ns = base_rtt_real
    # 4 base RTTs, but never under the floor (RTO_FLOOR_NS in a lab: the
    # unscaled part of a real RTT there is a few ms on this machine).
    cfg.rto_ns = max(4 * base_rtt_real, rto_floor_ns)
    cfg.max_cwnd_bytes = max(3 * bdp // 2, 8 * PAYLOAD_BYTES)
    cfg.seed = seed
    cfg.drop_psn_plus1 = 0 if drop_psn is None else drop_psn + 1
    cfg.time_scale = k
    cfg.unscaled_rtt_ns = unscaled_rtt_ns
    cfg.rto_floor_ns = rto_floor_ns
    if not rnr_timeout_s >= 0:
        raise NicError(f"rnr_timeout_s {rnr_timeout_s!r}: expected seconds >= 0 (0: for ever)")
    cfg.rnr_timeout_ns = min(int(rnr_timeout_s * 1e9), 1 << 63)  # a torch timedelta.max
    return cfg, bdp


def roce_cfg(cfg, nic: dict, k: float, planes: int, rate_real: int, qps, dcqcn, spray) -> None:
    """The RoCE mode's settings: the lab file's [nic] (nominal) into the
    engine's struct, real at time scale k (labfile.NIC_ROCE_FIELDS says
    where each goes and how); then what the command line or the engine's
    bounds override."""
    cfg.roce = 1
    for name, v in c_values(NIC_ROCE_FIELDS, nic, k).items():
        setattr(cfg, name, v)
    cfg.qps = qps or cfg.qps or planes
    if not 1 <= cfg.qps <= 16:
        raise NicError(f"qps must be between 1 and 16, not {cfg.qps}")
    cfg.roce_spray = bool(spray)
    if dcqcn is not None:
        cfg.dcqcn = bool(dcqcn)
    cfg.rto_ns = max(cfg.rto_ns, cfg.rto_floor_ns)
    cfg.dcqcn_min_rate_bps = min(rate_real, cfg.dcqcn_min_rate_bps)


class EngineGroup:
    """One thread that runs the loops of many NIC engines (the ranks of one
    process), instead of a thread each.  Engines join when started with
    group=; the group is closed once its last engine is."""

    def __init__(self):
        err = ffi.new("int *")
        g = lib.ethp_nic_group_new(err)
        if g == ffi.NULL:
            raise OSError(-err[0], "cannot start an engine group")
        self._g = g

    @property
    def members(self) -> int:
        return lib.ethp_nic_group_members(self._g)

    def close(self) -> None:
        if self._g is not None:
            rc = lib.ethp_nic_group_free(self._g)
            if rc < 0:
                raise NicError(f"an engine group still runs {self.members} engine(s)")
            self._g = None

    def __enter__(self) -> EngineGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_process_group: EngineGroup | None = None
_process_group_lock = threading.Lock()


def process_group() -> EngineGroup:
    """This process's engine group (started on first use; it lives as long
    as the process): the ranks of a rank host share its thread."""
    global _process_group
    with _process_group_lock:
        if _process_group is None:
            _process_group = EngineGroup()
        return _process_group


@dataclass(frozen=True)
class CompiledSched:
    """A schedule as the engine takes it (struct ethp_sched_op[] and the
    successor lists), with the buffers it points into kept alive."""

    ops: object
    n_ops: int
    succ: object
    n_succ: int
    dtype: int
    op: int
    keep: list


def compile_sched(sched) -> CompiledSched:
    """A run.schedule.Schedule as ethp_nic_post_sched takes it: the Python
    half of posting one (about 1.3 ms for upn-512's 1,023-op all-to-all),
    which a rank may do before it is timed."""
    n = len(sched)
    ops = ffi.new("struct ethp_sched_op[]", n)
    succ = ffi.new("uint32_t[]", [j for s in sched.succ for j in s] or [0])
    keep = [ops, succ]
    first = 0
    for i, o in enumerate(ops):
        o.kind, o.peer, o.tag, o.n_deps = (
            sched.kind[i],
            sched.peer[i],
            sched.tag[i],
            sched.n_deps[i],
        )
        c = ffi.from_buffer(sched.buf[i], require_writable=sched.kind[i] != SCHED_SEND)
        o.buf, o.len = c, len(c)
        keep.append(c)
        if sched.src[i] is not None:
            keep.append(ffi.from_buffer(sched.src[i]))
            o.src = keep[-1]
        o.succ_first, o.succ_count = first, len(sched.succ[i])
        first += o.succ_count
    dtype = REDUCE_DTYPES[sched.dtype] if sched.reduces() else 0
    return CompiledSched(ops, n, succ, first, dtype, INC_OPS[sched.op], keep)


class Endpoint:
    """The NIC of one accelerator (rank) of a running lab, on all its planes."""

    def __init__(
        self,
        lab: str,
        node: str,
        *,
        adaptive: bool = False,
        seed: int = 1,
        max_retries: int = 12,
        rnr_timeout_s: float | None = None,
        rec: dict | None = None,
        roce: bool = False,
        qps: int | None = None,
        dcqcn: bool | None = None,
        roce_spray: bool = False,
        drop_psn: int | None = None,
        inc: IncGroup | None = None,
        cc: str | None = None,
        group: EngineGroup | None = None,
    ):
        """roce=True runs the emulated RoCEv2 mode: go-back-N, one path per
        queue pair (qps, default one per plane), DCQCN (dcqcn, default the lab
        file's [nic] dcqcn); roce_spray sprays every packet (to show why RoCE
        does not).  drop_psn drops the first transmission of that PSN once
        (fault injection for tests).  inc joins an aggregation group, for
        all_reduce().  cc: the ETH+ congestion control, a CC_ALGOS name
        (default the lab file's [nic] cc); roce mode always runs DCQCN.
        group: run the engine's loop in that group's thread, not its own.
        rnr_timeout_s: how long a peer may have no receive posted for a
        send to it (real seconds; 0: for ever; None: RNR_TIMEOUT_S) before
        the send fails NoReceive."""
        rec = rec or registry.load_lab(lab)
        if rec is None:
            raise NicError(f"no lab named {lab!r}")
        nodes = {n["name"]: n for n in rec["topology"]["nodes"]}
        if node not in nodes or nodes[node]["role"] != "host":
            raise NicError(f"lab {lab!r} has no accelerator {node!r}")
        me = nodes[node]
        self.rank = me["index"]
        hosts = sorted((n for n in nodes.values() if n["role"] == "host"), key=lambda n: n["index"])
        self.world = len(hosts)
        # the lab's fabric clock, when its fabric runs: its k is the current
        # one (the record's may be older), and the engine follows its changes
        self._clock = clock.Clock.open(lab)
        k = self._clock.k if self._clock is not None else float(rec["time_scale"])
        ports = sorted(me["ports"], key=lambda p: p["plane"])
        link = {lk["name"]: lk for lk in rec["topology"]["links"]}[ports[0]["link"]]
        rate_real = Scale(k).real_bps(link["params"]["rate_bps"])
        # The real base RTT is the scaled nominal one plus what the emulator
        # adds unscaled: up to a ring's retire timeout (the switch's 1 ms, the
        # NIC's rx_ring_timeout_ms) per TPACKET_V3 ring a packet or its ack
        # waits in, each way: unscaled_rtt_ns, 2 ms at 1 ms rings.  (While
        # traffic is light the ports take frames one by one and add far less;
        # sizing the window for the busy case costs a light flow nothing.)
        scaled_rtt = Scale(k).real_ns(rec["topology"]["base_rtt_ns"])
        ring_timeout_ms = rx_ring_timeout_ms(scaled_rtt)
        unscaled_rtt = rings_unscaled_rtt_ns(ring_timeout_ms)
        base_rtt_real = scaled_rtt + unscaled_rtt
        nic_settings = {**rec["nic"], **({"cc": cc} if cc else {})}
        cfg, bdp = engine_cfg(
            self.rank, len(ports), rate_real, base_rtt_real, k, nic_settings, adaptive=adaptive,
            seed=seed, max_retries=max_retries, drop_psn=drop_psn,
            rnr_timeout_s=RNR_TIMEOUT_S if rnr_timeout_s is None else rnr_timeout_s,
            unscaled_rtt_ns=unscaled_rtt,
        )  # fmt: skip
        cfg.rx_ring_timeout_ms = ring_timeout_ms
        cc = CC_NAMES[cfg.cc]
        if roce:
            roce_cfg(cfg, rec["nic"], k, len(ports), rate_real, qps, dcqcn, roce_spray)
        err = ffi.new("int *")
        ns = rec["namespaces"][node]
        nic = lib.ethp_nic_new(cfg, ns.encode(), max(h["index"] for h in hosts) + 1, err)
        if nic == ffi.NULL:
            raise OSError(-err[0], f"cannot start the NIC of {node}")
        self._adopt(nic)
        for p in ports:
            sw = nodes[p["peer"]]
            gw = next(q for q in sw["ports"] if q["link"] == p["link"])
            rc = lib.ethp_nic_add_port(
                self._nic, p["ifname"].encode(), _mac(p["mac"]), _mac(gw["mac"]), _ip(p["ip"])
            )
            if rc < 0:
                raise OSError(-rc, f"cannot add port {p['ifname']}")
        for h in hosts:
            if h["index"] == self.rank:
                continue
            ips = [_ip(q["ip"]) for q in sorted(h["ports"], key=lambda q: q["plane"])]
            rc = lib.ethp_nic_add_peer(self._nic, h["index"], ffi.new("uint32_t[]", ips), len(ips))
            if rc < 0:
                raise OSError(-rc, f"cannot add peer {h['name']}")
        if inc is not None:
            self._inc_setup(inc, ports, rate_real, base_rtt_real, link["params"]["buffer_bytes"])
        if self._clock is not None and lib.ethp_nic_set_clock(self._nic, self._clock.ptr) < 0:
            raise NicError(f"cannot follow the clock of lab {lab!r}")
        self._start(cfg, bdp, cc, len(ports), group)
        if inc is not None:
            self.config.update(inc_groups=[x[0] for x in inc.streams],
                               inc_aggregators=sorted({x[1] for x in inc.streams}),
                               inc_window=self.inc_window)  # fmt: skip

    def _adopt(self, nic) -> None:
        self._nic = ffi.gc(nic, lib.ethp_nic_free)
        self.inc_window = 0
        self._keep: dict[int, object] = {}  # buffers must outlive their transfers

    def _start(self, cfg, bdp: int, cc: str, planes: int, group: EngineGroup | None) -> None:
        if group is None:
            rc = lib.ethp_nic_start(self._nic)
        else:
            rc = lib.ethp_nic_start_in(self._nic, group._g)
        if rc < 0:
            raise OSError(-rc, "cannot start the NIC engine")
        roce = bool(cfg.roce)
        self.config = {
            "rate_bps": cfg.rate_bps,
            "base_rtt_ns": cfg.base_rtt_ns,
            "rto_ns": cfg.rto_ns,
            "rx_ring_timeout_ms": cfg.rx_ring_timeout_ms,
            "unscaled_rtt_ns": cfg.unscaled_rtt_ns,
            "bdp_bytes": bdp,
            "max_cwnd_bytes": cfg.max_cwnd_bytes,
            "planes": planes,
            "mode": "roce" if roce else "ethplus",
            "cc": "dcqcn" if roce else cc,
            "epoch": lib.ethp_nic_epoch(self._nic),
            "engine_thread": "shared" if group is not None else "own",
        }
        if roce:
            self.config.update(qps=cfg.qps, dcqcn=bool(cfg.dcqcn), spray=bool(cfg.roce_spray))

    def _inc_setup(
        self, inc: IncGroup, ports: list, rate_real: int, base_rtt_real: int, buffer_bytes: int
    ) -> None:
        planes = [p["plane"] for p in ports]
        aggs = ffi.new("struct ethp_nic_agg[]", len(inc.streams))
        for a, (group, agg_id, plane, members, index) in zip(aggs, inc.streams, strict=True):
            a.group, a.id, a.plane = group, agg_id, planes.index(plane)
            a.members, a.index = members, index
        bdp_chunks = rate_real * base_rtt_real // 8 // 1_000_000_000 // PAYLOAD_BYTES
        window = min(INC_MAX_WINDOW, max(INC_MIN_WINDOW, INC_WINDOW_BDPS * bdp_chunks))
        # A straggler's chunk holds a window of results back, then lets them
        # go at once: they must fit the aggregator's port buffer towards us.
        window = min(window, int(0.9 * buffer_bytes) // (PAYLOAD_BYTES + 100))
        # Every group of a switch shares its slots: one job may take half,
        # over all its streams that meet there (a tree's inner node has all).
        window = max(1, min(window, inc.slots // (2 * inc.share)))
        rc = lib.ethp_nic_inc_setup(self._nic, aggs, len(inc.streams), window)
        if rc < 0:
            raise NicError(f"cannot join in-network all-reduce streams {inc.streams} (error {rc})")
        self.inc_window = window

    def all_reduce(self, buf, dtype: str, op: str) -> int:
        """Post an in-network all-reduce of buf (in place); wait() on the handle."""
        if dtype not in INC_DTYPES:
            raise NicError(
                f"the switches reduce {', '.join(INC_DTYPES)}, not {dtype} (use another --algo)"
            )
        c = ffi.from_buffer(buf, require_writable=True)
        code, item = INC_DTYPES[dtype]
        h = lib.ethp_nic_post_allreduce(self._nic, c, len(c) // item, code, INC_OPS[op])
        return self._posted(h, c)

    def close(self) -> None:
        if self._nic is not None:
            ffi.release(self._nic)
            self._nic = None
            self._keep.clear()
        if self._clock is not None:  # after the engine that reads it
            self._clock.close()
            self._clock = None

    @property
    def time_scale(self) -> float:
        """The k the engine runs at now (the clock's, once it has seen it)."""
        return lib.ethp_nic_time_scale(self._nic)

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def post_sched(self, sched) -> int:
        """Post a collective's schedule (a run.schedule.Schedule) for the
        engine to run by itself (ethp_nic_post_sched); wait() on the handle.
        The buffers must outlive it."""
        return self.post_compiled(compile_sched(sched))

    def post_compiled(self, c: CompiledSched) -> int:
        """Post a schedule compile_sched made (once: its handle spends it)."""
        h = lib.ethp_nic_post_sched(self._nic, c.ops, c.n_ops, c.succ, c.n_succ, c.dtype, c.op)
        return self._posted(h, c.keep)

    def post_send(self, peer: int, tag: int, buf) -> int:
        c = ffi.from_buffer(buf)
        h = lib.ethp_nic_post_send(self._nic, peer, tag, c, len(c))
        return self._posted(h, c)

    def post_recv(self, peer: int, tag: int, buf) -> int:
        c = ffi.from_buffer(buf, require_writable=True)
        h = lib.ethp_nic_post_recv(self._nic, peer, tag, c, len(c))
        return self._posted(h, c)

    def _posted(self, h: int, c) -> int:
        if h < 0:
            cls, msg = _ERRORS.get(h, (NicError, f"error {h}"))
            raise cls(msg)
        self._keep[h] = c
        return h

    def test(self, handle: int) -> bool:
        return self.wait(handle, timeout_s=0) is not None

    def wait(self, handle: int, timeout_s: float | None = None) -> int | None:
        """Wait for a transfer; returns its byte count, or None on timeout.
        The wait that sees it finish (done or failed) spends the handle: the
        engine frees its message, so a long job holds only its open
        transfers, and the handle is unknown (NicError) from then on."""
        ms = -1 if timeout_s is None else int(timeout_s * 1000)
        nbytes = ffi.new("uint64_t *")
        st = lib.ethp_nic_wait(self._nic, handle, ms, nbytes)
        if st == lib.ETHP_NIC_PENDING:
            return None
        short = None
        if st == lib.ETHP_NIC_ERR_SHORT:
            peer, posted = ffi.new("uint32_t *"), ffi.new("uint64_t *")
            lib.ethp_nic_short(self._nic, handle, peer, nbytes, posted)
            short = ShortMessage(peer[0], nbytes[0], posted[0])
        if st != lib.ETHP_NIC_ERR_NO_SUCH:
            lib.ethp_nic_release(self._nic, handle)
        self._keep.pop(handle, None)
        if short is not None:
            raise short
        if st != lib.ETHP_NIC_OK:
            cls, msg = _ERRORS.get(st, (NicError, f"error {st}"))
            raise cls(msg)
        return nbytes[0]

    def c_config(self) -> dict:
        """The engine's settings as its C struct holds them (real units, at
        the k it was made at)."""
        c = ffi.new("struct ethp_nic_cfg *")
        lib.ethp_nic_config(self._nic, c)
        return {name: getattr(c, name) for name, _ in ffi.typeof(c[0]).fields}

    @property
    def held(self) -> int:
        """Transfers the engine holds: posted and not yet spent by a wait."""
        return lib.ethp_nic_held(self._nic)

    def counters(self, peer: int | None = None) -> dict[str, int]:
        out = ffi.new("uint64_t[]", len(NIC_COUNTERS))
        lib.ethp_nic_counters(self._nic, -1 if peer is None else peer, out)
        return dict(zip(NIC_COUNTERS, out, strict=True))

    def set_plane(self, plane: int, up: bool) -> None:
        lib.ethp_nic_set_plane(self._nic, plane, 1 if up else 0)

    def __repr__(self) -> str:
        return f"Endpoint(rank={self.rank}, world={self.world}, {json.dumps(self.config)})"
