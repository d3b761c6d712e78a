"""The one transport interface collectives run on, and the registry of transports.

A transport moves tagged messages between the ranks of a lab: post a send or a
receive of a contiguous buffer, then wait for it.  A receive may be posted
before or after the matching send; messages between one pair of ranks are
matched by tag.  Collectives use nothing else, so they never special-case a
transport.

Implementations: ``ethplus`` (this project's C NIC, dataplane/nic.py) and
``tcp`` (stock kernel TCP through the same switches, dataplane/tcp.py).
"""

from __future__ import annotations

import ipaddress
from abc import ABC, abstractmethod
from dataclasses import dataclass

from dataplane.errors import EthplusError

LABELS = {
    "ethplus": "ETH+ (this project's NIC)",
    "tcp": "kernel TCP",
    "roce": "RoCEv2 (emulated)",
}


class TransportError(EthplusError, RuntimeError):
    """A transfer failed (peer unreachable, buffer too small, connection lost)."""


def _needs_ethplus(name: str) -> TransportError:
    return TransportError(f"in-network all-reduce needs the ethplus transport, not {name}")


@dataclass
class Options:
    """What a run may tune about its transport (all have defaults)."""

    tcp_streams: int | None = None  # None: one connection per plane
    adaptive: bool = False  # ethplus: adaptive rather than oblivious spraying
    seed: int = 1
    roce_qps: int | None = None  # roce: queue pairs per pair of ranks (None: the lab's)
    members: list[int] | None = None  # the lab ranks of this job (None: every accelerator)
    inc: dict | None = None  # ethplus: this job's in-network all-reduce (inc_plan)
    cc: str | None = None  # ethplus: congestion control (nic.CC_ALGOS; None: the lab file's)


class Transport(ABC):
    """Tagged, buffer-based point-to-point messages between ranks."""

    name: str = ""
    rank: int
    world: int
    # Facts a report must show next to this transport's numbers.
    notes: tuple[str, ...] = ()

    def isend(self, peer: int, tag: int, buf) -> object:
        """Start sending buf (a contiguous numpy array or buffer) to peer."""
        if _nbytes(buf) == 0:
            return _DONE
        return self._isend(peer, tag, memoryview(buf).cast("B"))

    def irecv(self, peer: int, tag: int, buf) -> object:
        """Start receiving the message tagged tag from peer into buf."""
        if _nbytes(buf) == 0:
            return _DONE
        return self._irecv(peer, tag, memoryview(buf).cast("B"))

    def wait(self, handle: object) -> None:
        if handle is not _DONE:
            self._wait(handle)

    def waitall(self, handles) -> None:
        for h in handles:
            self.wait(h)

    def all_reduce_in_network(self, buf, op: str, dtype: str) -> None:
        """All-reduce buf in place in the switches (in-network computing)."""
        raise _needs_ethplus(self.name)

    @abstractmethod
    def _isend(self, peer: int, tag: int, view: memoryview) -> object: ...

    @abstractmethod
    def _irecv(self, peer: int, tag: int, view: memoryview) -> object: ...

    @abstractmethod
    def _wait(self, handle: object) -> None: ...

    @abstractmethod
    def counters(self) -> dict[str, int]: ...

    def describe(self) -> dict:
        """Configuration worth recording with a result."""
        return {"transport": self.name, "notes": list(self.notes)}

    def close(self) -> None:  # noqa: B027 - optional for implementations
        pass

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_DONE = object()  # the handle of an empty message: nothing to move, nothing to wait for


def _nbytes(buf) -> int:
    return memoryview(buf).nbytes


class NicTransport(Transport):
    """This project's NIC engine: ``ethplus`` (sprayed over every plane,
    out-of-order placement, selective retransmit) or ``roce`` (the emulated
    RoCEv2: go-back-N, one path per queue pair, DCQCN)."""

    def __init__(self, name: str, lab: str, node: str, rec: dict, opts: Options):
        from dataplane import nic

        self.name = name
        self._errors, self._unreachable = nic.NicError, nic.Unreachable
        inc = None
        if opts.inc is not None:
            if name != "ethplus":
                raise _needs_ethplus(name)
            inc = inc_group(opts.inc, node)
        try:
            self.ep = nic.Endpoint(
                lab, node, adaptive=opts.adaptive, seed=opts.seed, rec=rec,
                roce=name == "roce", qps=opts.roce_qps, inc=inc, cc=opts.cc,
            )  # fmt: skip
        except nic.NicError as e:
            raise TransportError(str(e)) from e
        self.rank, self.world = self.ep.rank, self.ep.world
        if name == "roce":
            lossless = rec["switch"].get("lossless")
            self.notes = (
                "RoCEv2 emulated in this project's NIC engine (this kernel has no RDMA):"
                f" go-back-N, {self.ep.config['qps']} QP(s) per pair of ranks, one path each,"
                f" DCQCN {'on' if self.ep.config['dcqcn'] else 'off'}",
                "fabric lossless (PFC)"
                if lossless
                else "fabric LOSSY (no PFC): go-back-N recovers",
            )
        elif self.ep.config["cc"] == "hpcc":
            self.notes = (
                "congestion control HPCC-like: every data packet carries an 84-byte INT block"
                " (4012 payload bytes, not 4096) that each switch hop fills",
            )

    def all_reduce_in_network(self, buf, op: str, dtype: str) -> None:
        if not self.ep.inc_window:
            raise TransportError(
                "in-network all-reduce: this endpoint joined no aggregation group"
                " (Options.inc; a job with algo in-network sets one)"
            )
        try:
            self.ep.wait(self.ep.all_reduce(memoryview(buf).cast("B"), dtype, op))
        except self._errors as e:
            why = (
                "an aggregator (switch) answered nothing within the retry budget"
                " (its plane or switch down?)"
                if isinstance(e, self._unreachable)
                else str(e)
            )
            raise TransportError(f"rank {self.rank}: in-network all-reduce: {why}") from e

    def _isend(self, peer: int, tag: int, view: memoryview) -> object:
        return self.ep.post_send(peer, tag, view)

    def _irecv(self, peer: int, tag: int, view: memoryview) -> object:
        return self.ep.post_recv(peer, tag, view)

    def _wait(self, handle: object) -> None:
        try:
            self.ep.wait(handle)
        except self._errors as e:
            raise TransportError(f"rank {self.rank}: {e}") from e

    def counters(self) -> dict[str, int]:
        return self.ep.counters()

    def describe(self) -> dict:
        return {**super().describe(), **self.ep.config}

    def close(self) -> None:
        self.ep.close()


class Group(Transport):
    """A job on some of a lab's accelerators: ranks 0..len(members)-1 of the
    group stand for the lab ranks in members."""

    def __init__(self, inner: Transport, members: list[int]):
        self.inner, self.members = inner, list(members)
        self.name, self.notes = inner.name, inner.notes
        self.rank, self.world = self.members.index(inner.rank), len(self.members)

    def all_reduce_in_network(self, buf, op: str, dtype: str) -> None:
        self.inner.all_reduce_in_network(buf, op, dtype)

    def _isend(self, peer: int, tag: int, view: memoryview) -> object:
        return self.inner._isend(self.members[peer], tag, view)

    def _irecv(self, peer: int, tag: int, view: memoryview) -> object:
        return self.inner._irecv(self.members[peer], tag, view)

    def _wait(self, handle: object) -> None:
        self.inner._wait(handle)

    def counters(self) -> dict[str, int]:
        return self.inner.counters()

    def describe(self) -> dict:
        return {**self.inner.describe(), "members": self.members}

    def close(self) -> None:
        self.inner.close()


def inc_problem(rec: dict) -> str | None:
    """Why this lab cannot run an in-network all-reduce, or None."""
    if not rec["switch"].get("inc"):
        return (
            f"lab {rec['name']!r} has no in-network computing"
            " (set inc = true under [switch] in its lab file)"
        )
    return None


def inc_plan(rec: dict, members: list[int] | None, group: int, down=frozenset()) -> dict:
    """A job's in-network all-reduce on this lab, made once by the job and
    handed to every rank (JSON): its streams (routing.inc_plan; members are
    lab ranks, None: every accelerator; switches in down are left out), each
    with its group id (group, with the stream's number in the low 4 bits),
    its root and inner nodes by aggregator id, and each member's hop."""
    from dataplane import routing

    why = inc_problem(rec)
    if why:
        raise TransportError(why)
    hosts = {n["index"]: n["name"] for n in rec["topology"]["nodes"] if n["role"] == "host"}
    ranks = list(members) if members is not None else sorted(hosts)
    streams = routing.inc_plan(
        rec["topology"], [hosts[r] for r in ranks], bool(rec["switch"].get("inc_tree", True)), down
    )
    if not streams:
        raise TransportError(
            "no switch that is up reaches every member of the job"
            + (f" ({', '.join(sorted(down))} down)" if down else "")
        )
    ids = routing.switch_ids(rec["topology"])
    meets: dict[str, int] = {}  # aggregator -> streams of the job that use it
    for st in streams:
        for sw in {st.root, *st.inner}:
            meets[sw] = meets.get(sw, 0) + 1
    slots = int(rec["switch"].get("inc_slots", 1024))
    share = max(meets.values())
    # one job may take half of a switch's slots, over its streams that meet there
    quota = max(1, slots // (2 * share))
    nodes = {n["name"]: n for n in rec["topology"]["nodes"]}

    def host(m: str, plane: int) -> list[int]:
        port = next(p for p in nodes[m]["ports"] if p.get("plane", 0) == plane)
        return [nodes[m]["index"], int(ipaddress.IPv4Address(port["ip"]))]

    # [switch, group, members in index order, quota]: what the control plane vouches for
    register = []
    for i, st in enumerate(streams):
        g = (group & ~0xF) | i
        at: dict[str, dict[int, list[int]]] = {}
        for m, (sw, plane, _n, idx) in st.hop.items():
            at.setdefault(sw, {})[idx] = host(m, plane)
        for sw, idx in st.inner.items():
            at.setdefault(st.root, {})[idx] = [
                routing.AGG_EP_BASE + ids[sw],
                routing.AGG_NET + ids[sw],
            ]
        register += [[sw, g, [ms[k] for k in sorted(ms)], quota] for sw, ms in at.items()]
    return {
        "slots": slots,
        "share": share,
        "register": register,
        "streams": [
            {
                "group": (group & ~0xF) | i,
                "root": ids[st.root],
                "root_members": st.root_members,
                "inner": st.inner,  # switch -> its index at the root
                "hop": {m: [ids[h[0]], *h[1:]] for m, h in st.hop.items()},
            }
            for i, st in enumerate(streams)
        ],
    }


def inc_group(plan: dict, me: str):
    """Accelerator me's part in a job's in-network all-reduce (nic.IncGroup)."""
    from dataplane import nic

    streams = tuple((st["group"], *st["hop"][me]) for st in plan["streams"])
    return nic.IncGroup(streams, plan["slots"], plan["share"])


def inc_trees(plan: dict) -> list[list]:
    """The inner nodes of a job's trees, as the fabric's inc request wants
    them: [switch, group, root id, index at the root, the root's members]."""
    return [
        [sw, st["group"], st["root"], idx, st["root_members"]]
        for st in plan["streams"]
        for sw, idx in st["inner"].items()
    ]


def available() -> list[str]:
    """Transports this build can run, in report order."""
    return ["ethplus", "roce", "tcp"]


def open_transport(
    name: str, lab: str, node: str, rec: dict, opts: Options, barrier=None
) -> Transport:
    """The transport of one rank.  barrier(name) returns once every rank has
    called it: transports that must listen before their peers connect use it."""
    if name in ("ethplus", "roce"):
        t: Transport = NicTransport(name, lab, node, rec, opts)
    elif name == "tcp":
        from dataplane.tcp import TcpTransport

        t = TcpTransport(lab, node, rec, opts, barrier)
    else:
        raise TransportError(
            f"unknown transport {name!r} (expected one of {', '.join(available())})"
        )
    return Group(t, opts.members) if opts.members is not None else t
