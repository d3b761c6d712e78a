"""torch.distributed backend ``ethplus``: PyTorch's collectives on this
project's transports, inside a lab started by ``ethplus run``.

Importing this module registers the backend (CPU tensors)::

    import dataplane.run.torch_backend  # noqa: F401
    torch.distributed.init_process_group("ethplus")

A rank learns its lab, its node and its transport from the environment
``ethplus run`` gives it (launcher.ENV_*): ``ethplus`` (default), ``roce``
and ``tcp`` run collectives.Comm over that transport on the tensors' own
memory; ``gloo`` hands every call to stock gloo (ProcessGroupGloo over kernel
TCP) untouched, timed the same way, as the baseline.

Every call goes to one thread per process group, in the order the program
makes them (so every rank runs its collectives in the same order); a call
returns a Work at once and its future completes when the transfer does
(async_op=True), the GIL released while the transport waits.  Each call's
duration is taken on the lab's fabric clock (nominal) around its transfer,
and written with the rank's counters to ``ETHPLUS_RUN_DIR/rank-N.json`` at
shutdown (destroy_process_group, or the process's exit), for ``ethplus run``'s
table.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import resource
import threading
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ReduceOp
from torch.futures import Future

from dataplane.errors import EthplusError
from dataplane.lab import registry
from dataplane.lab.nic import INC_DTYPES
from dataplane.run import launcher, reference, stacks
from dataplane.run.collectives import Comm
from dataplane.run.transport import Options

NAME = "ethplus"
DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
          torch.int32: "int32", torch.int64: "int64"}  # fmt: skip
OPS = {ReduceOp.SUM: "sum", ReduceOp.MAX: "max", ReduceOp.MIN: "min", ReduceOp.AVG: "avg"}
POLL_S = 0.001  # while point-to-point transfers are open: how long one look waits

if threading.current_thread() is threading.main_thread():
    stacks.on_signal()  # kill -USR1 a rank: its stacks, prefixed, in ethplus run's output


class BackendError(EthplusError, RuntimeError):
    """The backend cannot start here (not under ethplus run, a bad setting)."""


def array(t: torch.Tensor, what: str = "tensor") -> np.ndarray:
    """t's own memory as a flat numpy array (no copy); TypeError if t is not
    a contiguous CPU tensor of a supported type."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"ethplus backend: {what} is a {type(t).__name__}, not a tensor")
    if t.device.type != "cpu":
        raise TypeError(f"ethplus backend: {what} is on {t.device}; it takes CPU tensors")
    if t.dtype not in DTYPES:
        raise TypeError(
            f"ethplus backend: {what} has dtype {t.dtype}; supported:"
            f" {', '.join(str(d).removeprefix('torch.') for d in DTYPES)}"
        )
    if not t.is_contiguous():
        raise TypeError(f"ethplus backend: {what} is not contiguous (call .contiguous() first)")
    d = t.detach()
    if t.dtype == torch.bfloat16:
        return d.view(torch.int16).numpy().reshape(-1).view(np.uint16)
    return d.numpy().reshape(-1)


def dtype_of(t: torch.Tensor) -> str:
    return DTYPES[t.dtype]


def op_name(op, dtype: str) -> str:
    name = OPS.get(getattr(op, "op", op))  # ReduceOp (its RedOpType) or a RedOpType
    if name is None:
        raise ValueError(f"ethplus backend: reduce op {op} is not supported (SUM, MAX, MIN, AVG)")
    if name == "avg" and dtype.startswith("int"):
        raise ValueError(f"ethplus backend: AVG of {dtype} is not defined (use SUM)")
    return name


def _divide(a: np.ndarray, n: int, dtype: str) -> None:
    """a /= n in place, in the type's own arithmetic (bfloat16 through float32)."""
    if dtype == "bfloat16":
        a[:] = reference.f32_to_bf16(reference.bf16_to_f32(a) / np.float32(n))
    else:
        a /= a.dtype.type(n)


class Calls:
    """This rank's record: each collective call's name, bytes (nccl-tests'
    size) and its start and end on the fabric clock (nominal seconds, one
    clock for the lab: ethplus run takes each call from the last rank's start
    to the last rank's end, so a rank that came early and waited for a peer
    still computing, in real time, does not count its wait), in call order;
    point-to-point calls summed."""

    def __init__(self, lab: str | None, k: float):
        from dataplane.run.worker import Timer

        self.timer = Timer(lab, k)
        self.calls: list[list] = []
        self.p2p = {"send": [0, 0, 0.0], "recv": [0, 0, 0.0]}  # calls, bytes, nominal s
        self.lock = threading.Lock()  # gloo's point-to-point calls end in threads of their own

    def now_s(self) -> float:
        return self.timer.now()[1]

    def add(self, name: str, nbytes: int, n0: float) -> None:
        n1 = self.now_s()
        with self.lock:
            if name in self.p2p:
                c = self.p2p[name]
                c[0], c[1], c[2] = c[0] + 1, c[1] + nbytes, c[2] + n1 - n0
            else:
                self.calls.append([name, nbytes, n0, n1])


class Work(dist.Work):
    """A call's work: done when its future is; wait() raises the call's error
    (torch's work made from a future returns True even when the future
    failed, which would hide a failed transfer)."""

    def __init__(self, fut: Future):
        super().__init__()
        self.fut = fut

    def wait(self, timeout=None) -> bool:
        self.fut.wait()
        return True

    def is_completed(self) -> bool:
        return self.fut.done()

    def is_success(self) -> bool:
        if not self.fut.done():
            return False
        try:
            self.fut.value()
        except Exception:  # noqa: BLE001 - the call's error
            return False
        return True

    def get_future(self) -> Future:
        return self.fut

    def result(self):
        return self.fut.wait()


class _Engine:
    """The group's one thread: runs calls in order, keeps point-to-point
    transfers open (posted, not waited on) while later calls run, and
    completes each call's future."""

    def __init__(self, comm: Comm | None, calls: Calls):
        self.comm, self.calls = comm, calls
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.open: list[tuple] = []  # (handle, future, name, nbytes, n0, keep)
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="ethplus-backend", daemon=True)
        self.thread.start()

    def submit(self, name: str, nbytes: int, fn, result) -> dist.Work:
        """fn() does the call (a collective: returns when done; a point to
        point one: returns its handle); the work's value is result."""
        fut: Future = Future()
        self.q.put((name, nbytes, fn, result, fut))
        return Work(fut)

    def _main(self) -> None:
        while True:
            try:
                item = self.q.get(timeout=POLL_S) if self.open else self.q.get()
            except queue.Empty:
                self._poll_open(POLL_S)
                continue
            if item is None:
                return
            name, nbytes, fn, result, fut = item
            if self.failed is not None:
                fut.set_exception(self.failed)
                continue
            n0 = self.calls.now_s()
            try:
                h = fn()
            except (TypeError, ValueError) as e:  # refused before anything moved
                fut.set_exception(e)
                continue
            except BaseException as e:  # noqa: BLE001 - to the caller's work
                self._fail(e, fut)
                continue
            if isinstance(h, _GlooOpen):  # gloo moves it only inside wait(): a thread waits
                threading.Thread(target=self._gloo_wait, args=(h, fut, name, nbytes, n0, result),
                                 daemon=True).start()  # fmt: skip
            elif name in self.calls.p2p:
                self.open.append((h, fut, name, nbytes, n0, result))
                self._poll_open(0.0)
            else:
                if name is not None:
                    self.calls.add(name, nbytes, n0)
                fut.set_result(result)

    def _gloo_wait(self, h: _GlooOpen, fut: Future, name: str, nbytes: int, n0: float,
                   result) -> None:  # fmt: skip
        try:
            h.work.wait()
        except BaseException as e:  # noqa: BLE001 - to the caller's work
            fut.set_exception(e)
            return
        self.calls.add(name, nbytes, n0)
        fut.set_result(result)

    def _poll_open(self, timeout_s: float) -> None:
        still = []
        for i, (h, fut, name, nbytes, n0, result) in enumerate(self.open):
            try:
                done = self.comm.t.poll(h, timeout_s if i == 0 else 0.0)
            except BaseException as e:  # noqa: BLE001 - to the caller's work
                self._fail(e, fut)  # (and every other open transfer's)
                return
            if done:
                self.calls.add(name, nbytes, n0)
                fut.set_result(result)
            else:
                still.append((h, fut, name, nbytes, n0, result))
        self.open = still

    def _fail(self, e: BaseException, fut: Future) -> None:
        """A failed transfer leaves the transport's matching unknown: every
        later call fails with the same error."""
        self.failed = e
        for f in (fut, *(x[1] for x in self.open)):
            if not f.done():
                f.set_exception(e)
        self.open = []

    def drain(self) -> None:
        """Every call submitted so far done (or failed)."""
        done = threading.Event()
        self.q.put((None, 0, lambda: None, None, _Flag(done)))
        done.wait()

    def stop(self) -> None:
        self.drain()
        self.q.put(None)
        self.thread.join()


class _Flag:
    """A stand-in future for drain: set when the engine reaches it."""

    def __init__(self, ev: threading.Event):
        self.ev = ev

    def set_result(self, _value) -> None:
        self.ev.set()

    set_exception = set_result


def _store_barrier(store, world: int, name: str) -> None:
    """Every rank of the group has called this (over the job's store)."""
    key = f"ethplus/barrier/{name}"
    if store.add(key, 1) == world:
        store.set(key + "/go", "1")
    store.wait([key + "/go"])


class EthplusGroup(dist.ProcessGroup):
    """A torch ProcessGroup on an ethplus transport (or on timed gloo)."""

    def __init__(self, store, rank: int, world: int, timeout: timedelta):
        super().__init__(rank, world)
        env = launcher.rank_env()
        if env.world != world:
            raise BackendError(
                f"ethplus backend: the job has {env.world} ranks ({launcher.ENV_NODES}),"
                f" torch asked for {world}"
            )
        self._rank, self._world, self.store = rank, world, store
        self.transport_name = env.transport
        rec = registry.load_lab(env.lab)
        if rec is None:
            raise BackendError(f"ethplus backend: lab {env.lab!r} is not running")
        self.calls = Calls(env.lab, float(rec["time_scale"]))
        self.report_path = os.path.join(env.run_dir, f"rank-{rank}.json") if env.run_dir else None
        self.gloo = None
        self.transport = None
        self.inc = None
        self.algo = env.algo
        if env.transport == "gloo":
            self.gloo = dist.ProcessGroupGloo(store, rank, world, timeout)
            comm = None
        else:
            from dataplane.run.worker import open_transport

            self.inc = launcher.in_network_plan(env)
            # a send waits for a late receive as long as torch's group
            # timeout lets any call wait (gloo's does the same)
            # (kernel TCP's streams all opened here, as gloo opens its own:
            # the program's first calls time no set-up)
            opts = Options(members=env.members(rec), inc=self.inc,
                           rnr_timeout_s=timeout.total_seconds(),
                           tcp_connect_all=True)  # fmt: skip
            n = iter(range(1 << 30))
            self.transport = open_transport(
                env.transport, env.lab, env.nodes[rank], rec, opts,
                lambda name: _store_barrier(store, world, f"{name}-{next(n)}"),
            )  # fmt: skip
            comm = Comm(self.transport)
        self.comm = comm
        self.engine = _Engine(comm, self.calls)
        self._closed = False
        atexit.register(self.shutdown)

    # -- torch's interface
    def getBackendName(self) -> str:
        return NAME

    def size(self) -> int:
        return self._world

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        return f"EthplusGroup({self.transport_name}, rank {self._rank} of {self._world})"

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        if self.gloo is not None:
            avg = op.op == ReduceOp.AVG
            return self._gloo("all-reduce", _nbytes(tensors), tensors, lambda: self.gloo.allreduce(
                tensors, _gloo_opts(opts)), avg=avg)  # fmt: skip
        arrays = [array(t, "allreduce's tensor") for t in tensors]
        names = [op_name(op, dtype_of(t)) for t in tensors]
        nbytes = sum(a.nbytes for a in arrays)

        def run() -> None:
            for t, a, name in zip(tensors, arrays, names, strict=True):
                self.comm.dtype = dtype_of(t)
                self.comm.all_reduce(a, "sum" if name == "avg" else name, self._algo(t))
                if name == "avg":
                    _divide(a, self._world, self.comm.dtype)

        return self.engine.submit("all-reduce", nbytes, run, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        if self.gloo is not None:
            return self._gloo("broadcast", _nbytes(tensors), tensors,
                              lambda: self.gloo.broadcast(tensors, opts))  # fmt: skip
        arrays = [array(t, "broadcast's tensor") for t in tensors]
        nbytes = sum(a.nbytes for a in arrays)

        def run() -> None:
            for a in arrays:  # the chain on a few ranks, the two trees on more
                self.comm.broadcast(a, root, "auto")

        return self.engine.submit("broadcast", nbytes, run, tensors)

    def _allgather_base(self, output, input, opts=None):
        if self.gloo is not None:
            return self._gloo("all-gather", _nbytes([output]), [output],
                              lambda: self.gloo._allgather_base(output, input))  # fmt: skip
        out, inp = array(output, "all_gather's output"), array(input, "all_gather's input")
        _same_type(output, input)
        _need(out.size == inp.size * self._world, "all_gather's output must hold world x input")
        return self.engine.submit(
            "all-gather", out.nbytes, lambda: self._comm_of(output).all_gather(inp, out), [output]
        )

    all_gather_single = _allgather_base

    def allgather(self, output_lists, inputs, opts=None):
        if self.gloo is not None:
            return self._gloo("all-gather", _nbytes(output_lists[0]), output_lists,
                              lambda: self.gloo.allgather(output_lists, inputs))  # fmt: skip
        outs, inp = output_lists[0], inputs[0]
        src = array(inp, "all_gather's input")
        for o in outs:
            _same_type(o, inp)
            _need(array(o, "all_gather's output").size == src.size, "outputs must match input")
        flat = torch.empty(inp.numel() * self._world, dtype=inp.dtype)
        work = self._allgather_base(flat, inp)

        def unpack(_f):
            for o, part in zip(outs, flat.chunk(self._world), strict=True):
                o.view(-1).copy_(part)
            return output_lists

        return _then(work, unpack)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        if self.gloo is not None:
            return self._gloo("reduce-scatter", _nbytes([input]), [output], lambda: (
                self.gloo._reduce_scatter_base(output, input, _gloo_opts(opts))),
                avg=op.op == ReduceOp.AVG)  # fmt: skip
        out, inp = array(output, "reduce_scatter's output"), array(input, "reduce_scatter's input")
        _same_type(output, input)
        _need(inp.size == out.size * self._world, "reduce_scatter's input must hold world x output")
        name = op_name(op, dtype_of(output))

        def run() -> None:
            comm = self._comm_of(output)
            comm.reduce_scatter(inp, out, "sum" if name == "avg" else name)
            if name == "avg":
                _divide(out, self._world, comm.dtype)

        return self.engine.submit("reduce-scatter", inp.nbytes, run, [output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter(self, outputs, input_lists, opts=None):
        out, ins = outputs[0], input_lists[0]
        for t in ins:
            _same_type(t, out)
            _need(t.numel() == out.numel(), "reduce_scatter's inputs must match its output")
        flat = torch.cat([t.reshape(-1) for t in ins])
        return self._reduce_scatter_base(out, flat, opts)

    def alltoall_base(self, output, input, output_splits, input_splits, opts=None):
        if self.gloo is not None:
            return self._gloo("all-to-all", _nbytes([input]), [output], lambda: (
                self.gloo.alltoall_base(output, input, output_splits, input_splits, opts)
            ))  # fmt: skip
        out, inp = array(output, "all_to_all's output"), array(input, "all_to_all's input")
        _same_type(output, input)
        send = _counts(input, input_splits, self._world, "input_split_sizes")
        recv = _counts(output, output_splits, self._world, "output_split_sizes")
        return self.engine.submit(
            "all-to-all", inp.nbytes,
            lambda: self._comm_of(output).all_to_all(inp, send, out, recv), [output],
        )  # fmt: skip

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts=None):
        if self.gloo is not None:
            return self._gloo("all-to-all", _nbytes(inputs), outputs,
                              lambda: self.gloo.alltoall(outputs, inputs))  # fmt: skip
        for t in (*outputs, *inputs):
            _same_type(t, inputs[0])
            array(t, "all_to_all's tensor")
        flat_in = torch.cat([t.reshape(-1) for t in inputs])
        flat_out = torch.empty(sum(t.numel() for t in outputs), dtype=inputs[0].dtype)
        work = self.alltoall_base(
            flat_out, flat_in, [t.numel() for t in outputs], [t.numel() for t in inputs], opts
        )

        def unpack(_f):
            parts = flat_out.split([t.numel() for t in outputs])
            for o, part in zip(outputs, parts, strict=True):
                o.view(-1).copy_(part)
            return outputs

        return _then(work, unpack)

    def barrier(self, opts=None):
        one = torch.ones(1, dtype=torch.int32)
        if self.gloo is not None:
            return self._gloo("barrier", 0, [one], lambda: self.gloo.barrier())

        def run() -> None:
            self.comm.dtype = "int32"
            self.comm.all_reduce(array(one), "sum", "ring")

        return self.engine.submit("barrier", 0, run, [one])

    def send(self, tensors, dst: int, tag: int):
        if self.gloo is not None:
            return self._gloo_p2p("send", tensors, lambda: self.gloo.send(tensors, dst, tag))
        a = array(tensors[0], "send's tensor")
        return self.engine.submit("send", a.nbytes, lambda: self.comm.isend(a, dst, tag), tensors)

    def recv(self, tensors, src: int, tag: int):
        if self.gloo is not None:
            return self._gloo_p2p("recv", tensors, lambda: self.gloo.recv(tensors, src, tag))
        a = array(tensors[0], "recv's tensor")
        return self.engine.submit("recv", a.nbytes, lambda: self.comm.irecv(a, src, tag), tensors)

    # -- the rest
    def _algo(self, t: torch.Tensor) -> str:
        """The all-reduce algorithm for t: the switches' when the job has an
        aggregation plan and they reduce t's type, else ethplus run's --algo
        (auto when that was in-network)."""
        if self.inc is not None and dtype_of(t) in INC_DTYPES:
            return "in-network"
        return "auto" if self.algo == "in-network" else self.algo

    def _comm_of(self, t: torch.Tensor) -> Comm:
        self.comm.dtype = dtype_of(t)
        return self.comm

    def _gloo(self, name: str, nbytes: int, tensors, call, avg: bool = False):
        """Stock gloo's call, made and waited on by the engine's thread, timed
        as ours are (AVG: gloo's SUM, then / world, as ours)."""

        def run() -> None:
            call().wait()
            if avg:
                for t in tensors:
                    t.div_(self._world)

        return self.engine.submit(name, nbytes, run, tensors)

    def _gloo_p2p(self, name: str, tensors, call):
        """gloo's send or receive, posted by the engine's thread (gloo's own
        threads move it) and kept open as ours are."""
        return self.engine.submit(name, _nbytes(tensors), lambda: _GlooOpen(call()), tensors)

    def report(self) -> dict:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        t = self.transport
        return {
            "rank": self._rank,
            "transport": t.describe() if t else {"transport": "gloo", "notes": []},
            "counters": t.counters() if t else {},
            "calls": self.calls.calls,
            "p2p": self.calls.p2p,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "pid": os.getpid(),
            "peak_rss_bytes": usage.ru_maxrss * 1024,
        }

    def shutdown(self) -> None:
        """Every call done, this rank's record written, and the transport
        closed once every rank is through (a rank that closed early would
        leave its peers' last acks or bytes unanswered)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        self.engine.stop()
        if self.report_path:
            tmp = self.report_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.report(), f)
            os.replace(tmp, self.report_path)
        try:
            _store_barrier(self.store, self._world, "close")
        finally:
            if self.transport is not None:
                self.transport.close()


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class _GlooOpen:
    """A gloo work as the engine's open transfers are polled."""

    def __init__(self, work):
        self.work = work


def _gloo_opts(opts):
    """gloo has no AVG: ask for SUM (the caller divides)."""
    if opts is not None and opts.reduceOp.op == ReduceOp.AVG:
        o = type(opts)()
        o.reduceOp = ReduceOp.SUM
        return o
    return opts


def _same_type(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:
        raise TypeError(
            f"ethplus backend: tensors of one call differ in dtype ({a.dtype}, {b.dtype})"
        )


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"ethplus backend: {what}")


def _counts(t: torch.Tensor, splits, world: int, what: str) -> list[int]:
    """Elements per rank of an all_to_all_single buffer: splits are rows of
    dim 0 (none: even)."""
    n = t.numel()
    if not splits:
        _need(n % world == 0, f"{what} empty, so the tensor must divide by {world} ranks")
        return [n // world] * world
    _need(len(splits) == world, f"{what} must have {world} entries")
    _need(all(s >= 0 for s in splits), f"{what} must not be negative (got {list(splits)})")
    row = n // t.shape[0] if t.dim() and t.shape[0] else 0
    _need(sum(splits) == (t.shape[0] if t.dim() else 0), f"{what} must sum to dim 0")
    return [s * row for s in splits]


def _then(work: Work, fn) -> Work:
    """A work that completes with fn(value) once work does (its error, if
    it fails)."""
    return Work(work.get_future().then(lambda f: fn(f.value())))


def _create(store, rank: int, world: int, timeout: timedelta) -> EthplusGroup:
    return EthplusGroup(store, rank, world, timeout)


if NAME not in dist.Backend.backend_list:
    dist.Backend.register_backend(NAME, _create, devices=["cpu"])
