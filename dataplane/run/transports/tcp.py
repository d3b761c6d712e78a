"""The stock kernel TCP transport: the baseline, through the same switches.

Each pair of ranks that talks holds ``streams`` TCP connections (opened
when a collective first uses the pair, or all at start with
``Options.tcp_connect_all``), stream s on plane
s mod planes (bound to that plane's address, so the kernel routes it out of
that port and the switches hash it onto one path).  A message is striped over
the streams as NCCL's socket transport stripes it: contiguous chunks of at
least ``MIN_CHUNK_BYTES``, each behind a small header (tag, message length,
offset, chunk length), so chunks may arrive in any order across streams.

One progress engine per rank: non-blocking sockets under one epoll selector,
driven by ``wait`` (as an MPI progress engine is).  Data for a receive not yet
posted is held aside and copied in when it is.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import os
import resource
import selectors
import socket
import struct
import time

from dataplane.lab import cgroup, kernel
from dataplane.run.schedule import RECV, Schedule
from dataplane.run.transport import Options, ShortMessage, Transport, TransportError

PORT = 4796
MIN_CHUNK_BYTES = 64 * 1024  # NCCL socket transport's minimum chunk per stream
_HDR = struct.Struct("<IQQQ")  # tag, message bytes, chunk offset, chunk bytes
_HELLO = struct.Struct("<II")  # rank, stream
_READ_BUDGET_BYTES = 8 << 20  # per connection per pass, so no stream starves the rest
# Chunks held for receives not yet posted, all peers together: a peer that
# announces more is refused (an error naming it), never a huge allocation.
EARLY_MAX_BYTES = 2 << 30
# What a held chunk and a held message cost beyond their payload (the
# chunk's bytearray, tuple and list slot; the message's _Early, its list,
# key and dict entry): charged against EARLY_MAX_BYTES, so that empty or
# 1-byte chunks cannot grow memory the payload count does not see.
EARLY_CHUNK_COST_BYTES = 192
EARLY_MSG_COST_BYTES = 512
# And counted per peer: what one peer may have held before the receives
# for them are posted (a collective call has at most 4,096 messages per
# peer, a chunk at least 64 KiB of a message larger than that).
EARLY_MAX_CHUNKS_PER_PEER = 1 << 16
EARLY_MAX_MSGS_PER_PEER = 1 << 14
# Source ports: a switch hashes a TCP flow's ports with its addresses onto
# one of its equal-cost paths, so the kernel's random ephemeral port would
# put the flows on different paths in every run (ecmp-collision's job time
# moved 1.36x between two runs with their flows on other spines).  A
# stream's port is drawn from the run's seed instead (source_port), below
# Linux's ephemeral range; the same seed, the same paths, on any machine.
SOURCE_PORT_BASE = 20000
SOURCE_PORTS = 10000
SOURCE_PORT_TRIES = 8  # the next ones, if a port is taken; then the kernel's
# Options.tcp_connect_all: how long (real seconds) set-up may go without
# any stream connecting before it is given up
CONNECT_QUIET_S = 30.0
# A stream's 4-tuple is used again by the next job of the same ranks: the
# side that closes first keeps it in TIME-WAIT, which refuses a connect from
# the same port but lets a new SYN in.  So the side that connected waits for
# its peer to close first, this long at most (real seconds).
CLOSE_WAIT_S = 5.0
# A handshake's tries, each way (TCP_SYNCNT: on a connecting socket its SYNs,
# on a listener the SYN-ACKs of the connections it is setting up).  The
# kernel's defaults (6 SYN retries after 4 at a fixed 1 s, 5 SYN-ACK retries:
# about 2 min and 1 min) run on real time, from a 1 s initial RTO: at a large
# k that is a handshake's round trip or less (upn-512 at k 409,600: 0.8 s real
# before any queue), and a storm of handshakes outlasted them, the server
# dropping a connection its client held set up (whose hello then met a
# reset).  Twelve give each way about 14 min of real time (the backoff stops
# at 120 s); 26 min where the lab's cgroup makes every wait 120 s (cgroup.py).
HANDSHAKE_TRIES = 12
# The peers a rank is connecting to at once (all of a peer's streams
# together, one per plane: each plane's switch meets one SYN a peer); the
# rest wait their turn.  At a large k a round trip is near the kernel's 1 s
# initial RTO, so every SYN waiting in a queue is sent again, and again:
# upn-512's 130,816 handshakes at once (an all-to-all's) were sent again
# 1,149,353 times (SYNs and SYN-ACKs), 711,672 times with 64 at once and
# 269,760 with 16, which also took the job from 22 to 17 min of real time
# (performance.md, session 55).
PEERS_AT_ONCE = 16


def source_port(seed: int, rank: int, peer: int, stream: int, attempt: int = 0) -> int:
    """The source port of rank's stream to peer for a run seeded seed."""
    h = hashlib.blake2b(f"{seed}/{rank}/{peer}/{stream}".encode(), digest_size=8)
    return SOURCE_PORT_BASE + (int.from_bytes(h.digest(), "little") + attempt) % SOURCE_PORTS


class _Msg:
    """A posted send or receive: the handle collectives wait on."""

    __slots__ = ("peer", "tag", "view", "total", "done_bytes", "pending", "error")

    def __init__(self, peer: int, tag: int, view: memoryview | None):
        self.peer, self.tag, self.view = peer, tag, view
        self.total = -1  # receives learn it from the first chunk header
        self.done_bytes = 0
        self.pending = 0  # chunks of a send not yet handed to the kernel
        self.error: str | None = None

    @property
    def done(self) -> bool:
        return self.total >= 0 and self.done_bytes == self.total


class _Early:
    """Complete chunks of a message that arrived before its receive was posted."""

    __slots__ = ("total", "chunks", "msg")

    def __init__(self, total: int):
        self.total = total
        self.chunks: list[tuple[int, bytearray]] = []
        self.msg: _Msg | None = None  # the receive that adopted it, once posted


class _Opening:
    """A stream being set up: a connect of this rank's (peer, stream), or an
    accepted one whose hello (peer -1) is still being read."""

    __slots__ = ("peer", "stream", "src_ip", "hello")

    def __init__(self, peer: int, stream: int, src_ip: str = ""):
        self.peer, self.stream, self.src_ip = peer, stream, src_ip
        self.hello = b""


_LISTENER = object()  # a selector key's data: one of the rank's listening sockets


class _Conn:
    __slots__ = ("sock", "peer", "stream", "sendq", "hdr", "hdr_got", "body", "body_got",
                 "sink", "off", "writing")  # fmt: skip

    def __init__(self, sock: socket.socket, peer: int, stream: int):
        self.sock, self.peer, self.stream = sock, peer, stream
        self.sendq: collections.deque = collections.deque()  # [views, msg]
        self.hdr = bytearray(_HDR.size)
        self.hdr_got = 0
        self.body: memoryview | None = None
        self.body_got = 0
        self.sink: _Msg | _Early | None = None
        self.off = 0
        self.writing = False


class TcpTransport(Transport):
    name = "tcp"

    def __init__(self, lab: str, node: str, rec: dict, opts: Options, barrier=None):
        nodes = {n["name"]: n for n in rec["topology"]["nodes"]}
        hosts = sorted((n for n in nodes.values() if n["role"] == "host"), key=lambda n: n["index"])
        me = nodes[node]
        self.rank, self.world = me["index"], len(hosts)
        ips = {
            h["index"]: [p["ip"] for p in sorted(h["ports"], key=lambda p: p["plane"])]
            for h in hosts
        }
        planes = len(ips[self.rank])
        self._ips, self._planes = ips, planes
        self.streams = opts.tcp_streams or planes
        self._seed = opts.seed
        if self.streams < 1:
            raise TransportError("--tcp-streams must be at least 1")
        self.notes = (
            f"{self.streams} TCP connection(s) per pair of ranks, a message striped over them",
            f"kernel TCP's handshake tries {HANDSHAKE_TRIES} times each way (SYN, SYN-ACK;"
            " Linux's defaults 6 and 5): its retries run on real time, "
            + (
                "120 s each (the lab's cgroup), 26 min in all"
                if rec.get("tcp_syn_rto") == cgroup.SYN_RTO_MAX
                else "about 14 min in all from Linux's 1 s initial RTO, where a large k's round"
                " trip alone can near 1 s"
            ),
            *kernel.tcp_timer_notes(rec),
        )
        self._sel = selectors.DefaultSelector()
        members = set(opts.members) if opts.members is not None else set(ips)
        self._conns: dict[int, list[_Conn]] = {
            p: [] for p in ips if p != self.rank and p in members
        }
        self._posted: dict[tuple[int, int], _Msg] = {}
        self._early: dict[tuple[int, int], _Early] = {}
        self._rr: dict[int, int] = dict.fromkeys(self._conns, 0)
        self._bytes = {
            "tx_bytes": 0,
            "rx_bytes": 0,
            "early_bytes": 0,
            "msgs_sent": 0,
            "msgs_received": 0,
            "refused_conns": 0,
            "unseeded_ports": 0,
        }
        self._early_bytes = 0  # payload held now
        self._early_charged = 0  # held now, with each chunk's and message's cost (EARLY_MAX_BYTES)
        self._early_counts: dict[int, list[int]] = {}  # peer -> [messages, chunks] held
        # Streams open on a rank's first message to or from a peer (the lower
        # rank of a pair connects, the higher accepts): a rank holds sockets
        # for the peers its collectives use (2 in a ring, log2(world) in
        # halving-doubling), not for every member, so 512 ranks in two
        # processes stay within the open files a process may have.
        self._opening: set[int] = set()  # peers whose streams are not all up
        self._to_connect: collections.deque[int] = collections.deque()  # peers, in turn
        self._connecting = 0  # peers ranked above whose streams are being set up (PEERS_AT_ONCE)
        self._held: dict[int, list[_Msg]] = {}  # sends waiting for their streams
        self._setup_counts: dict[str, int] = {}  # the handshakes' (counters())
        self._listeners: list[socket.socket] = []
        # Accepted streams whose hello has not come yet, oldest first: only
        # from the addresses of the peers ranked below, and no more than
        # their streams (a lab node that opens connections and says nothing
        # holds no more sockets of this rank than that)
        self._greeting: dict[socket.socket, None] = {}
        below = [p for p in self._conns if p < self.rank]
        self._below_ips = {ip for p in below for ip in ips[p]}
        self._greeting_max = max(1, self.streams * len(below))
        try:
            for ip in ips[self.rank]:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self._listeners.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_SYNCNT, HANDSHAKE_TRIES)
                s.bind((ip, PORT))
                s.listen(1024)
                s.setblocking(False)
                self._sel.register(s, selectors.EVENT_READ, _LISTENER)
        except OSError as e:
            self.close()
            raise TransportError(f"rank {self.rank}: cannot listen for TCP streams: {e}") from e
        if barrier:
            barrier("tcp-listen")  # every rank listens before any connects
        if opts.tcp_connect_all:
            try:
                self._connect_all()
            except BaseException:
                self.close()
                raise
        # the namespace's own counters (kernel.netns_tcp_counts) from here
        # (none for a transport outside a lab: on loopback, in tests)
        self._netns = rec.get("namespaces", {}).get(node)
        self._netns_counts0 = kernel.netns_tcp_counts(self._netns) if self._netns else {}

    def _link(self, peer: int) -> list[_Conn]:
        """peer's streams, opening them on first use: connects to a peer
        ranked above start now (all its streams at once: one round trip,
        not one per stream, and at a large k a round trip is seconds of
        real time), or once fewer than PEERS_AT_ONCE peers are being
        connected to; a peer ranked below connects here when it first uses
        the pair.  Until every stream is up a send waits (_held)."""
        conns = self._conns.get(peer)
        if conns is None:
            raise TransportError(f"rank {self.rank}: rank {peer} is not a rank of this job")
        if len(conns) == self.streams or peer in self._opening:
            return conns
        self._opening.add(peer)
        if peer > self.rank:
            self._to_connect.append(peer)
            self._connect_more()
        return conns

    def _connect_more(self) -> None:
        """Start connecting to the waiting peers that PEERS_AT_ONCE lets in."""
        while self._to_connect and self._connecting < PEERS_AT_ONCE:
            peer = self._to_connect.popleft()
            self._connecting += 1
            for st in range(self.streams):
                try:
                    s = self._connect_one(peer, st, st % self._planes)
                except OSError as e:
                    raise self._cannot(f"connect to rank {peer}", e) from e
                self._sel.register(s, selectors.EVENT_WRITE, _Opening(peer, st))

    def _connect_all(self) -> None:
        """Open every member's streams now (PEERS_AT_ONCE peers at a time:
        one round trip for up to that many), and return when they are up."""
        for p in self._conns:
            self._link(p)
        while self._opening:
            if not self._progress(CONNECT_QUIET_S):
                raise TransportError(
                    f"rank {self.rank}: streams to {len(self._opening)} peer(s) not connected"
                    f" after {CONNECT_QUIET_S:g} s without a word from any"
                )

    def _connect_one(self, peer: int, st: int, plane: int) -> socket.socket:
        """Start stream st's connect to peer, from its seeded source port
        (source_port; the next ones if taken, then the kernel's choice,
        counted in `unseeded_ports`)."""
        src, dst = self._ips[self.rank][plane], (self._ips[peer][plane], PORT)
        for attempt in range(SOURCE_PORT_TRIES + 1):
            port = (
                source_port(self._seed, self.rank, peer, st, attempt)
                if attempt < SOURCE_PORT_TRIES
                else 0
            )
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_SYNCNT, HANDSHAKE_TRIES)
                s.bind((src, port))
                s.setblocking(False)
                rc = s.connect_ex(dst)
            except OSError as e:
                s.close()
                if e.errno == errno.EADDRINUSE and port:
                    continue
                raise
            if rc in (errno.EADDRNOTAVAIL, errno.EADDRINUSE) and port:
                s.close()  # its 4-tuple is still in TIME-WAIT here
                continue
            if rc not in (0, errno.EINPROGRESS):
                s.close()
                raise OSError(rc, f"rank {peer}, stream {st}: {os.strerror(rc)}")
            self._bytes["unseeded_ports"] += port == 0
            return s
        raise AssertionError("unreachable: the last try takes the kernel's port")

    def _cannot(self, what: str, e: OSError) -> TransportError:
        """An error opening a stream, with what to do when the process is
        out of open files (a socket each stream, and a rank host's ranks
        share one process's limit)."""
        text = f"rank {self.rank}: cannot {what}: {e.strerror or e}"
        if e.errno in (errno.EMFILE, errno.ENFILE):
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            text += (
                f" (the process may open {limit} files, and its ranks' streams share them:"
                " fewer --tcp-streams, more processes with a smaller --ranks-per-host, or a"
                " collective that talks to fewer peers)"
            )
        return TransportError(text)

    def _accept(self, listener: socket.socket) -> None:
        """A stream from a peer ranked below: its hello (rank, stream)
        follows the handshake's last ack, and is read when it comes."""
        try:
            s, addr = listener.accept()
        except BlockingIOError:
            return
        except OSError as e:
            raise self._cannot("accept a stream", e) from e
        if addr[0] not in self._below_ips:
            s.close()  # no peer that connects here has that address: refused, counted
            self._bytes["refused_conns"] += 1
            return
        if len(self._greeting) >= self._greeting_max:
            self._refuse(next(iter(self._greeting)))  # the oldest: still silent
        s.setblocking(False)
        self._greeting[s] = None
        self._sel.register(s, selectors.EVENT_READ, _Opening(-1, -1, addr[0]))

    def _refuse(self, s: socket.socket) -> None:
        self._greeting.pop(s, None)
        self._sel.unregister(s)
        s.close()
        self._bytes["refused_conns"] += 1

    def _hello(self, s: socket.socket, o: _Opening) -> None:
        """Read an accepted stream's hello; a stream that is not one the job
        expects (another rank, address or stream; cut short) is closed and
        counted."""
        try:
            part = s.recv(_HELLO.size - len(o.hello))
        except BlockingIOError:
            return
        except OSError:
            part = b""
        o.hello += part
        if part and len(o.hello) < _HELLO.size:
            return
        peer, st = _HELLO.unpack(o.hello) if len(o.hello) == _HELLO.size else (-1, -1)
        if not self._expected(peer, st, o.src_ip):
            self._refuse(s)  # not a peer that should connect here: refused, counted
            return
        self._greeting.pop(s)
        self._sel.unregister(s)
        self._opening.add(peer)
        self._add(s, peer, st)

    def _connected(self, s: socket.socket, o: _Opening) -> None:
        """One of this rank's connects has completed: say who it is."""
        self._sel.unregister(s)
        if rc := s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            s.close()
            raise TransportError(
                f"rank {self.rank}: cannot connect stream {o.stream} to rank {o.peer}:"
                f" {os.strerror(rc)}"
            )
        s.setblocking(True)
        s.sendall(_HELLO.pack(self.rank, o.stream))
        self._add(s, o.peer, o.stream)

    def _expected(self, peer: int, stream: int, src_ip: str) -> bool:
        """Is this hello one the job expects: a peer ranked below us (it
        connects, we accept), a stream it has not opened yet, and from that
        peer's address on the stream's plane?"""
        return (
            peer in self._conns
            and peer < self.rank
            and 0 <= stream < self.streams
            and all(c.stream != stream for c in self._conns[peer])
            and src_ip == self._ips[peer][stream % self._planes]
        )

    def _add(self, s: socket.socket, peer: int, stream: int) -> None:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        # what the kernel counted for the handshake, before any message
        # (counters() tells set-up from traffic)
        for name, v in kernel.tcp_info(s).items():
            self._setup_counts[name] = self._setup_counts.get(name, 0) + v
        c = _Conn(s, peer, stream)
        conns = self._conns[peer]
        conns.append(c)
        self._sel.register(s, selectors.EVENT_READ, c)
        if len(conns) == self.streams:
            conns.sort(key=lambda x: x.stream)
            self._opening.discard(peer)
            if peer > self.rank:  # one of ours: the next peer's turn
                self._connecting -= 1
                self._connect_more()
            for m in self._held.pop(peer, ()):
                self._stripe(m)

    # -- posting
    def run(self, sched: Schedule) -> None:
        """No engine here: the caller runs sched step by step (run_with).
        Its peers' streams are opened first, all at once: one round trip
        for a tree's or halving-doubling's set-up, not one for each step
        that meets a new peer."""
        for p in {p for k, p in zip(sched.kind, sched.peer, strict=True) if k <= RECV}:
            self._link(p)
        return None

    def _isend(self, peer: int, tag: int, view: memoryview) -> object:
        m = _Msg(peer, tag, view)
        m.total = len(view)
        if len(self._link(peer)) < self.streams:
            self._held.setdefault(peer, []).append(m)
        else:
            self._stripe(m)
        return m

    def _stripe(self, m: _Msg) -> None:
        """Queue a send's chunks on its peer's streams, round robin."""
        conns, view, n = self._conns[m.peer], m.view, m.total
        nch = max(1, min(len(conns), n // MIN_CHUNK_BYTES))
        m.pending = nch
        first = self._rr[m.peer]
        self._rr[m.peer] = (first + nch) % len(conns)
        for i in range(nch):
            lo, hi = n * i // nch, n * (i + 1) // nch
            c = conns[(first + i) % len(conns)]
            c.sendq.append([[memoryview(_HDR.pack(m.tag, n, lo, hi - lo)), view[lo:hi]], m])
            self._write(c)

    def _irecv(self, peer: int, tag: int, view: memoryview) -> object:
        self._link(peer)  # (a rank ranked below its peer connects on a receive too)
        key = (peer, tag)
        if key in self._posted:
            raise TransportError(
                f"rank {self.rank}: a receive for tag {tag} from rank {peer} is already posted"
            )
        m = _Msg(peer, tag, view)
        early = self._early.pop(key, None)
        if early is not None:
            self._release_early(peer, early)
            m.total = self._check_fits(m, early.total)
            for off, data in early.chunks:
                view[off : off + len(data)] = data
                self._count_in(m, len(data))
            early.msg = m  # a chunk still being read lands through it
        if not m.done:
            self._posted[key] = m
        else:
            self._bytes["msgs_received"] += 1
        return m

    def _hold_early(self, c: _Conn, key: tuple[int, int], total: int, clen: int) -> _Early:
        """The held message a chunk with no receive posted goes to, once it
        is within what c's peer may have held (an error naming it if not)."""
        counts = self._early_counts.setdefault(c.peer, [0, 0])
        early = self._early.get(key)
        charge = clen + EARLY_CHUNK_COST_BYTES + (EARLY_MSG_COST_BYTES if early is None else 0)
        if early is not None and total != early.total:
            raise self._bad_chunk(c, f"tag {key[1]} was {early.total} bytes long, now {total}")
        if early is None and counts[0] >= EARLY_MAX_MSGS_PER_PEER:
            raise self._bad_chunk(c, f"more than {EARLY_MAX_MSGS_PER_PEER} messages before"
                                     " their receives were posted")  # fmt: skip
        if counts[1] >= EARLY_MAX_CHUNKS_PER_PEER:
            raise self._bad_chunk(c, f"more than {EARLY_MAX_CHUNKS_PER_PEER} chunks before"
                                     " their receives were posted")  # fmt: skip
        if self._early_charged + charge > EARLY_MAX_BYTES:
            raise self._bad_chunk(c, f"{clen} more bytes before a receive was posted"
                                     f" (at most {EARLY_MAX_BYTES}, each chunk counted"
                                     f" {EARLY_CHUNK_COST_BYTES} bytes more)")  # fmt: skip
        if early is None:
            early = self._early[key] = _Early(total)
            counts[0] += 1
        counts[1] += 1
        self._early_charged += charge
        self._early_bytes += clen
        self._bytes["early_bytes"] += clen
        return early

    def _release_early(self, peer: int, early: _Early, chunk_bytes: int | None = None) -> None:
        """A held message adopted by its receive (chunk_bytes None: all its
        chunks and itself), or one of its chunks that landed once adopted."""
        counts = self._early_counts[peer]
        if chunk_bytes is not None:
            n, chunks, msgs = chunk_bytes, 1, 0
        else:
            n, chunks, msgs = sum(len(d) for _, d in early.chunks), len(early.chunks), 1
        counts[0] -= msgs
        counts[1] -= chunks
        self._early_bytes -= n
        self._early_charged -= n + chunks * EARLY_CHUNK_COST_BYTES + msgs * EARLY_MSG_COST_BYTES

    def _count_in(self, m: _Msg, n: int, c: _Conn | None = None) -> None:
        """n more bytes of m placed.  Its chunks must add up to its length:
        a chunk sent twice (or overlapping another) would otherwise leave
        the receive waiting forever for a count it has passed."""
        if m.done_bytes + n > m.total:
            what = f"its chunks add up to more than the {m.total} bytes of tag {m.tag}"
            raise self._bad_chunk(c, what, m.peer)
        m.done_bytes += n

    def _check_fits(self, m: _Msg, total: int) -> int:
        if total > len(m.view):
            raise TransportError(
                f"rank {self.rank}: a {total}-byte message from rank {m.peer} (tag {m.tag}) "
                f"does not fit the {len(m.view)}-byte buffer posted for it"
            )
        return total

    def _wait(self, handle: object) -> None:
        while not self._poll(handle, 1.0):
            pass

    def _poll(self, handle: object, timeout_s: float) -> bool:
        m: _Msg = handle  # type: ignore[assignment]
        end = time.monotonic() + timeout_s
        moved = False  # one look at the sockets, even with no time to wait
        while not (m.done and m.pending == 0):
            if m.error:
                raise TransportError(m.error)
            left = end - time.monotonic()
            if left <= 0 and moved:
                return False
            self._progress(max(left, 0.0))
            moved = True
        if m.view is not None and m.total < len(m.view):  # a receive, whole but short
            raise ShortMessage(
                f"rank {self.rank}: rank {m.peer} sent a {m.total}-byte message (tag {m.tag})"
                f" where {len(m.view)} bytes were posted (the rest of the buffer was not written)",
                m.peer, m.total, len(m.view),
            )  # fmt: skip
        return True

    # -- progress
    def _progress(self, timeout_s: float) -> bool:
        """Move every socket on, waiting up to timeout_s for one to be
        ready; whether any was."""
        events = self._sel.select(timeout_s)
        for key, ev in events:
            c = key.data
            if c is _LISTENER:
                self._accept(key.fileobj)
            elif isinstance(c, _Opening):
                (self._hello if c.peer < 0 else self._connected)(key.fileobj, c)
            else:
                if ev & selectors.EVENT_WRITE:
                    self._write(c)
                if ev & selectors.EVENT_READ:
                    self._read(c)
        return bool(events)

    def _write(self, c: _Conn) -> None:
        while c.sendq:
            entry = c.sendq[0]
            views, m = entry
            try:
                n = c.sock.sendmsg(views)
            except BlockingIOError:
                break
            except OSError as e:
                self._lost(c, e)
                return
            self._bytes["tx_bytes"] += n
            while n:
                head = views[0]
                if n >= len(head):
                    n -= len(head)
                    views.pop(0)
                else:
                    views[0] = head[n:]
                    n = 0
            if not views:
                c.sendq.popleft()
                m.pending -= 1
                if m.pending == 0:
                    self._bytes["msgs_sent"] += 1
                    m.done_bytes = m.total
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.sendq else 0)
        if bool(c.sendq) != c.writing:
            c.writing = bool(c.sendq)
            self._sel.modify(c.sock, want, c)

    def _read(self, c: _Conn) -> None:
        budget = _READ_BUDGET_BYTES
        while budget > 0:
            try:
                if c.body is None:
                    n = c.sock.recv_into(memoryview(c.hdr)[c.hdr_got :])
                else:
                    n = c.sock.recv_into(c.body[c.body_got :])
            except BlockingIOError:
                return
            except OSError as e:
                self._lost(c, e)
                return
            if n == 0:
                self._closed(c)
                return
            budget -= n
            if c.body is None:
                c.hdr_got += n
                if c.hdr_got == _HDR.size:
                    self._header(c)
            else:
                c.body_got += n
                self._bytes["rx_bytes"] += n
                if c.body_got == len(c.body):
                    self._chunk_done(c)

    def _bad_chunk(self, c: _Conn | None, what: str, peer: int = -1) -> TransportError:
        """A chunk that breaks its message's bounds, from c's peer (or, for
        chunks held before their receive was posted, peer's: their stream
        is not kept)."""
        peer, on = (c.peer, f" on TCP stream {c.stream}") if c else (peer, "")
        return TransportError(f"rank {self.rank}: rank {peer} sent a bad chunk{on}: {what}")

    def _header(self, c: _Conn) -> None:
        """A chunk header: bounded by the message it belongs to (the same
        length in every chunk, the chunk inside it) and by the buffer posted
        for it, before a byte of the body is read."""
        tag, total, off, clen = _HDR.unpack(c.hdr)
        c.hdr_got = 0
        key = (c.peer, tag)
        m = self._posted.get(key)
        c.off = off
        if off + clen > total:
            raise self._bad_chunk(c, f"bytes {off}..{off + clen} of a {total}-byte message")
        if m is not None:
            if m.total < 0:
                try:
                    m.total = self._check_fits(m, total)
                except TransportError as e:
                    m.error = str(e)
                    raise
            elif total != m.total:
                raise self._bad_chunk(c, f"tag {tag} was {m.total} bytes long, now {total}")
            c.sink, c.body = m, m.view[off : off + clen]
        else:
            early = self._hold_early(c, key, total, clen)
            c.sink, c.body = early, memoryview(bytearray(clen))
        c.body_got = 0
        if clen == 0:
            self._chunk_done(c)

    def _chunk_done(self, c: _Conn) -> None:
        sink, n = c.sink, len(c.body)
        if isinstance(sink, _Early):
            if sink.msg is None:
                sink.chunks.append((c.off, c.body.obj))  # complete chunks only
                c.body, c.sink = None, None
                return
            m = sink.msg  # adopted while this chunk was in flight: copy it in
            m.view[c.off : c.off + n] = c.body
            self._release_early(c.peer, sink, n)
        else:
            m = sink
        c.body, c.sink = None, None
        self._count_in(m, n, c)
        if m.done:
            self._posted.pop((m.peer, m.tag), None)
            self._bytes["msgs_received"] += 1

    def _closed(self, c: _Conn) -> None:
        """The peer closed this stream: fine between messages, if nothing
        more is expected from it; lost otherwise."""
        self._sel.unregister(c.sock)
        c.writing = False
        if c.body is not None or c.hdr_got or c.sendq or any(p == c.peer for p, _ in self._posted):
            self._lost(c, None)

    def _lost(self, c: _Conn, err: OSError | None) -> None:
        why = f": {err.strerror}" if err else ""
        raise TransportError(
            f"rank {self.rank}: TCP connection {c.stream} to rank {c.peer} lost{why}"
            f" (did rank {c.peer} die?)"
        )

    def counters(self) -> dict[str, int]:
        """Bytes and messages, and the kernel's retransmissions and
        retransmit timeouts over this rank's connections (kernel.tcp_info),
        its namespace's zero-window and tail-loss probes and delayed acks
        since the connections were up (kernel.netns_tcp_counts), the
        connections' set-up's also apart (tcp_setup_*: a SYN
        times out on Linux's 1 s initial RTO, real time, wherever a
        handshake's round trip at the lab's k is longer, unless the lab's
        cgroup gives it the kernel's largest: cgroup.py)."""
        setup = {
            f"tcp_setup_{name[4:]}": self._setup_counts.get(name, 0)
            for name in ("tcp_retx_segs", "tcp_rtos", "tcp_rto_time_ms")
        }
        now = kernel.netns_tcp_counts(self._netns) if self._netns else {}
        netns = {name: v - self._netns_counts0.get(name, 0) for name, v in now.items()}
        return {**self._bytes, **self._kernel_counts(), **setup, **netns, **self._held_streams()}

    def _held_streams(self) -> dict[str, int]:
        """The streams the kernel holds connected for this rank, and the
        ranks at their far ends (by the kernel's peer address): the peers
        its collectives used."""
        rank_of = {ip: p for p, conns in self._conns.items() if conns for ip in self._ips[p]}
        peers, streams = set(), 0
        for conns in self._conns.values():
            for c in conns:
                if not kernel.tcp_connected(c.sock):
                    continue
                try:
                    far = c.sock.getpeername()[0]
                except OSError:
                    continue
                streams += 1
                peers.add(rank_of.get(far, -1))
        return {"tcp_peers": len(peers - {-1}), "tcp_streams": streams}

    def _kernel_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for conns in self._conns.values():
            for c in conns:
                for name, v in kernel.tcp_info(c.sock).items():
                    out[name] = out.get(name, 0) + v
        return out

    def describe(self) -> dict:
        return {**super().describe(), "streams": self.streams, "pid": os.getpid()}

    def close(self) -> None:
        """Close every stream: those the peers opened at once, then those
        this rank opened once their peers have closed them (CLOSE_WAIT_S at
        most), so that TIME-WAIT stays on the accepting side and the next
        job's connect from the same seeded port is let in."""
        self._to_connect.clear()
        for key in list(self._sel.get_map().values()):
            if isinstance(key.data, _Opening):  # streams still being set up
                self._sel.unregister(key.fileobj)
                key.fileobj.close()
        for s in self._listeners:
            s.close()
        mine: list[socket.socket] = []
        for peer, conns in self._conns.items():
            for c in conns:
                try:
                    self._sel.unregister(c.sock)
                except (KeyError, ValueError):
                    pass
                if peer > self.rank:
                    mine.append(c.sock)
                else:
                    c.sock.close()
            conns.clear()
        self._sel.close()
        _close_after_peer(mine, CLOSE_WAIT_S)


def _close_after_peer(socks: list[socket.socket], wait_s: float) -> None:
    """Close socks, each once its peer has closed it (read to its end), or
    all after wait_s."""
    if not socks:
        return
    deadline = time.monotonic() + wait_s
    sel = selectors.DefaultSelector()
    try:
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(timeout=left):
                try:
                    ended = not key.fileobj.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    ended = True
                if ended:
                    sel.unregister(key.fileobj)
    finally:
        sel.close()
        for s in socks:
            s.close()
