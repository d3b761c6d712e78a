"""The transport of this project's NIC engine: ``ethplus`` and ``roce``
(dataplane/lab/nic.py's Endpoint behind the one transport interface)."""

from __future__ import annotations

from dataplane.lab import nic
from dataplane.run.schedule import Schedule
from dataplane.run.transport import (
    Options,
    ShortMessage,
    Transport,
    TransportError,
    needs_ethplus,
)

# What an endpoint says of its in-network all-reduces when one fails.
INC_COUNTERS = ("inc_tx_pkts", "inc_retx_pkts", "inc_rx_results", "inc_dup_results",
                "inc_timeouts", "rx_malformed", "rx_spoofed")  # fmt: skip


def inc_group(plan: dict, me: str):
    """Accelerator me's part in a job's in-network all-reduce (nic.IncGroup)."""
    streams = tuple((st["group"], *st["hop"][me]) for st in plan["streams"])
    return nic.IncGroup(streams, plan["slots"], plan["share"])


class NicTransport(Transport):
    """This project's NIC engine: ``ethplus`` (sprayed over every plane,
    out-of-order placement, selective retransmit) or ``roce`` (the emulated
    RoCEv2: go-back-N, one path per queue pair, DCQCN)."""

    def __init__(self, name: str, lab: str, node: str, rec: dict, opts: Options):
        self.name = name
        self._errors, self._unreachable = nic.NicError, nic.Unreachable
        self._receiving: dict = {}  # handle -> (peer, posted bytes) of an open receive
        inc = None
        if opts.inc is not None:
            if name != "ethplus":
                raise needs_ethplus(name)
            inc = inc_group(opts.inc, node)
        try:
            self.ep = nic.Endpoint(
                lab, node, adaptive=opts.adaptive, seed=opts.seed, rec=rec,
                roce=name == "roce", qps=opts.roce_qps, inc=inc, cc=opts.cc,
                group=nic.process_group() if opts.shared_engine else None,
                rnr_timeout_s=opts.rnr_timeout_s,
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
            c = self.ep.counters()
            seen = ", ".join(f"{k.removeprefix('inc_')} {c[k]}" for k in INC_COUNTERS)
            raise TransportError(
                f"rank {self.rank}: in-network all-reduce: {why} (this endpoint: {seen})"
            ) from e

    def run(self, sched: Schedule) -> object | None:
        c = self.compile(sched)
        return None if c is None else self.run_compiled(c)

    def compile(self, sched: Schedule) -> object | None:
        if sched.reduces() and sched.dtype not in nic.REDUCE_DTYPES:
            return None
        return nic.compile_sched(sched)

    def run_compiled(self, compiled: object) -> object:
        try:
            return self.ep.post_compiled(compiled)
        except self._errors as e:
            raise self._failed(e) from e

    def _isend(self, peer: int, tag: int, view: memoryview) -> object:
        return self.ep.post_send(peer, tag, view)

    def _irecv(self, peer: int, tag: int, view: memoryview) -> object:
        h = self.ep.post_recv(peer, tag, view)
        self._receiving[h] = (peer, len(view))
        return h

    def _wait(self, handle: object) -> None:
        self._poll(handle, None)

    def _poll(self, handle: object, timeout_s: float | None) -> bool:
        try:
            got = self.ep.wait(handle, timeout_s)
        except self._errors as e:
            self._receiving.pop(handle, None)
            raise self._failed(e) from e
        if got is None:
            return False
        peer, posted = self._receiving.pop(handle, (None, got))
        if got < posted:  # the engine says how long it was; a collective's is exact
            raise ShortMessage(
                f"rank {self.rank}: rank {peer} sent a {got}-byte message where {posted} bytes"
                " were posted (the rest of the buffer was not written)", peer, got, posted,
            )  # fmt: skip
        return True

    def _failed(self, e: nic.NicError) -> TransportError:
        """The engine's error as this rank's transport error."""
        if isinstance(e, nic.ShortMessage):
            return ShortMessage(f"rank {self.rank}: {e}", e.peer, e.got_bytes, e.posted_bytes)
        return TransportError(f"rank {self.rank}: {e}")

    def counters(self) -> dict[str, int]:
        return self.ep.counters()

    def describe(self) -> dict:
        """What this rank's engine runs with: its summary, and its C struct
        as the engine holds it (real units: c_config), so that a result
        records the settings it was measured with."""
        return {**super().describe(), **self.ep.config, "c_config": self.ep.c_config()}

    def close(self) -> None:
        self.ep.close()
