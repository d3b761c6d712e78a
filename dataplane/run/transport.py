"""The one transport interface collectives run on, and the transports' names.

A transport moves tagged messages between the ranks of a lab: post a send or a
receive of a contiguous buffer, then wait for it.  A receive may be posted
before or after the matching send; messages between one pair of ranks are
matched by tag.  Collectives use nothing else, so they never special-case a
transport.

Implementations: ``ethplus`` and ``roce`` (this project's C NIC,
dataplane/run/transports/nic.py) and ``tcp`` (stock kernel TCP through the same
switches, dataplane/run/transports/tcp.py); a rank opens its own (worker.open_transport).
Nothing here imports them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dataplane.errors import EthplusError

if TYPE_CHECKING:
    from dataplane.run.schedule import Schedule


class TransportError(EthplusError, RuntimeError):
    """A transfer failed (peer unreachable, buffer too small, connection lost)."""


class ShortMessage(TransportError):
    """A peer's whole message was shorter than the buffer posted for it (the
    buffer's tail unwritten): a collective or the torch backend stops on
    it.  got_bytes is the message's length."""

    def __init__(self, what: str, peer: int, got_bytes: int, posted_bytes: int):
        super().__init__(what)
        self.peer, self.got_bytes, self.posted_bytes = peer, got_bytes, posted_bytes


def needs_ethplus(name: str) -> TransportError:
    return TransportError(f"in-network all-reduce needs the ethplus transport, not {name}")


@dataclass
class Options:
    """What a run may tune about its transport (all have defaults)."""

    tcp_streams: int | None = None  # None: one connection per plane
    # tcp: every member's streams opened at start, as gloo does (a program
    # under `ethplus run` then times no set-up in its first calls); False:
    # each pair's when a collective first uses it
    tcp_connect_all: bool = False
    adaptive: bool = False  # ethplus: adaptive rather than oblivious spraying
    seed: int = 1  # the run's: TCP's source ports, the NICs' entropy values (their paths)
    roce_qps: int | None = None  # roce: queue pairs per pair of ranks (None: the lab's)
    members: list[int] | None = None  # the lab ranks of this job (None: every accelerator)
    inc: dict | None = None  # ethplus: this job's in-network all-reduce (inc_plan)
    cc: str | None = None  # ethplus: congestion control (nic.CC_ALGOS; None: the lab file's)
    shared_engine: bool = False  # ethplus, roce: the NIC engine runs in the process's group
    # ethplus, roce: how long (real s) a send waits for its peer's receive
    # (None: nic.RNR_TIMEOUT_S; the torch backend gives its group's timeout)
    rnr_timeout_s: float | None = None


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

    def poll(self, handle: object, timeout_s: float = 0.0) -> bool:
        """Whether handle's transfer is complete, waiting up to timeout_s for
        it (and moving the transport's other transfers on meanwhile); raises
        the transfer's error as wait does."""
        return handle is _DONE or self._poll(handle, timeout_s)

    def run(self, sched: Schedule) -> object | None:
        """Run a collective's whole schedule in the transport's engine,
        returning a handle to wait on; None: this transport cannot, the
        caller runs it step by step (Schedule.run_with)."""
        return None

    def compile(self, sched: Schedule) -> object | None:
        """Work out now what run(sched) would first (the engine's form of
        the schedule), for run_compiled to start it later at once; None:
        nothing to do ahead, run(sched) it then."""
        return None

    def run_compiled(self, compiled: object) -> object:
        """Start a schedule compile() made; the handle to wait on."""
        raise TypeError(f"{self.name}: compiles no schedules")

    def all_reduce_in_network(self, buf, op: str, dtype: str) -> None:
        """All-reduce buf in place in the switches (in-network computing)."""
        raise needs_ethplus(self.name)

    @abstractmethod
    def _isend(self, peer: int, tag: int, view: memoryview) -> object: ...

    @abstractmethod
    def _irecv(self, peer: int, tag: int, view: memoryview) -> object: ...

    @abstractmethod
    def _wait(self, handle: object) -> None: ...

    @abstractmethod
    def _poll(self, handle: object, timeout_s: float) -> bool: ...

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


class Group(Transport):
    """A job on some of a lab's accelerators: ranks 0..len(members)-1 of the
    group stand for the lab ranks in members."""

    def __init__(self, inner: Transport, members: list[int]):
        self.inner, self.members = inner, list(members)
        self.name, self.notes = inner.name, inner.notes
        self.rank, self.world = self.members.index(inner.rank), len(self.members)

    def all_reduce_in_network(self, buf, op: str, dtype: str) -> None:
        self.inner.all_reduce_in_network(buf, op, dtype)

    def run(self, sched: Schedule) -> object | None:
        return self.inner.run(sched.with_peers(self.members))

    def compile(self, sched: Schedule) -> object | None:
        return self.inner.compile(sched.with_peers(self.members))

    def run_compiled(self, compiled: object) -> object:
        return self.inner.run_compiled(compiled)

    def _isend(self, peer: int, tag: int, view: memoryview) -> object:
        return self.inner._isend(self.members[peer], tag, view)

    def _irecv(self, peer: int, tag: int, view: memoryview) -> object:
        return self.inner._irecv(self.members[peer], tag, view)

    def _wait(self, handle: object) -> None:
        self.inner._wait(handle)

    def _poll(self, handle: object, timeout_s: float) -> bool:
        return self.inner._poll(handle, timeout_s)

    def counters(self) -> dict[str, int]:
        return self.inner.counters()

    def describe(self) -> dict:
        return {**self.inner.describe(), "members": self.members}

    def close(self) -> None:
        self.inner.close()
