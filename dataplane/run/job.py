"""A job: one worker process per accelerator of a running lab, run to the end.

The control side of a collective run.  It listens on a Unix socket in the
lab's directory, starts ``python -m dataplane.run.worker`` for every accelerator
(each joins its own namespace), hands each its plan, runs the barriers,
gathers one result per size from every rank, and samples the fabric's
counters while the ranks run (for the plots and the fidelity report).

Supervision: a worker that exits early, reports an error or closes its socket
fails the job at once with its rank, node and error; the others get SIGTERM,
then SIGKILL after a grace period.  Workers die with the job (PDEATHSIG), so
nothing outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import uvloop

from dataplane.errors import EthplusError, Interrupted
from dataplane.lab import cpu, fabric_client, registry
from dataplane.lab.labs import module_environ, python_module
from dataplane.model.catalog import canonical
from dataplane.report import fidelity
from dataplane.run import inc, parent, transport

# a job (and `ethplus run`) stops on these, cleaning up: SIGHUP is a closed terminal
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals():
    """The signals a run's loop takes (add_signal_handler) while it runs,
    where it runs in the main thread (none elsewhere); whatever handled them
    before does again after.  (A Python handler's exception would only be
    logged by a callback: the loop's own handlers must take them.)"""
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in STOP_SIGNALS} if main else {}
    try:
        yield list(saved)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)

GRACE_S = 2.0
_serial = 0  # jobs started by this process: each gets its own socket
# uvloop refuses two loops (concurrent jobs, one per thread) spawning at once
_spawn_lock = threading.Lock()


class JobError(EthplusError, RuntimeError):
    """The job failed: a rank died or reported an error, or the job stalled."""


@dataclass
class Workload:
    """What a job measures: one collective over a range of sizes, and how."""

    collective: str
    transport: str
    sizes: list[int]
    dtype: str = "float32"
    op: str = "sum"
    algo: str = "ring"
    iters: int = 5
    warmup: int = 2
    root: int = 0
    uneven: bool = False
    tcp_streams: int | None = None
    qps: int | None = None
    adaptive: bool = False
    cc: str | None = None  # ethplus: congestion control (nic.CC_ALGOS; None: the lab file's)
    check: bool = True  # check the first run of each size against numpy
    check_all: bool = False  # check every run, warm-up and timed (--check all)
    seed: int = 1
    # ranks per worker process (a rank host); None: the ranks spread over as
    # many processes as CPUs (ranks_per_host)
    ranks_per_host: int | None = None
    # a rank host's NIC engines: all in one thread (True, default), or a
    # thread each (False)
    shared_engine: bool = True


@dataclass(kw_only=True)
class Plan(Workload):
    """What every rank of a job is told: the workload, the lab, and where
    the job runs."""

    lab: str
    nodes: list[str] | None = None  # a job on these accelerators only, in rank order
    members: list[int] | None = None  # their lab ranks (filled in by Job)
    sample: bool = True  # sample the fabric's counters (one job of several is enough)
    inc: dict | None = None  # algo in-network: the job's aggregation plan (filled in by Job)
    # no message from any rank and no frame moved by the fabric for this long
    # (real seconds) fails the job: at a large k one collective alone can take
    # longer, but its frames keep moving
    stall_s: float = 300.0


# how often a job that does not sample the fabric looks whether its frames move
FRAMES_WATCH_S = 5.0


@dataclass
class Rank:
    rank: int
    node: str
    writer: asyncio.StreamWriter | None = None
    ready: dict = field(default_factory=dict)
    ready_cpu_s: float = 0.0  # its process's CPU (all its threads) when it was ready
    done: dict | None = None
    error: str | None = None


@dataclass
class Host:
    """A worker process and the ranks it runs (a thread each when several)."""

    ranks: list[Rank]
    log: str = ""
    proc: asyncio.subprocess.Process | None = None

    def names(self) -> str:
        """'rank 3 (h3)', or 'ranks 0-7 (h0..h7)' for a host of several."""
        a, b = self.ranks[0], self.ranks[-1]
        if a is b:
            return f"rank {a.rank} ({a.node})"
        return f"ranks {a.rank}-{b.rank} ({a.node}..{b.node})"


def ranks_per_host(world: int, wanted: int | None) -> int:
    """How many ranks each worker process runs: by default the ranks spread
    over as many processes as CPUs (a process per rank when there are no more
    ranks than CPUs).  Rank hosts measured better at 8 ranks too (erack-8x4,
    ethplus, roce and tcp, 1 and 16 MiB: the same busbw and k, 1.2-3.1x less
    CPU per nominal GB, 0.3-0.7x the memory), and issue 22's bench and
    scenario figures held with them (docs/performance.md, session 43)."""
    if wanted is not None:
        if wanted < 1:
            raise JobError(f"ranks per host must be 1 or more, not {wanted}")
        return min(wanted, world)
    return -(-world // (os.cpu_count() or 1))


def fabric_stats(lab: str) -> dict:
    """The fabric's counters now (raises OSError or ValueError if it is gone)."""
    resp = fabric_client.request(lab, {"op": "stats"})
    if not resp.get("ok"):
        raise ValueError(resp.get("error", "stats failed"))
    return resp["stats"]


def plan_in_network(rec: dict, members: list[int] | None) -> dict:
    """A job's in-network aggregation plan on this lab now (inc.inc_plan:
    switches that are down left out), with a group id of its own; JobError
    saying why not."""
    why = inc.inc_problem(rec)
    if why:
        raise JobError(f"--algo in-network: {why}")
    try:
        st = fabric_stats(rec["name"])
    except (OSError, ValueError) as e:
        raise JobError(f"--algo in-network: no answer from the fabric: {e}") from None
    down = {name for name, sw in st["switches"].items() if not sw["up"]}
    # the group is unique per job: switches key their slots on it
    try:
        return inc.inc_plan(rec, members, secrets.randbits(32), down)
    except transport.TransportError as e:
        raise JobError(f"--algo in-network: {e}") from None


def join_in_network(lab: str, plan_inc: dict) -> None:
    """Register a job's groups and join its trees in the lab's switches,
    leased to this process: the fabric undoes them once it is gone, however
    it ended (leave_in_network is the usual way)."""
    owner = [os.getpid(), registry.process_start(os.getpid())]
    _fabric_inc(lab, {"register": plan_inc["register"], "join": inc.inc_trees(plan_inc),
                      "owner": owner})  # fmt: skip


def leave_in_network(lab: str, plan_inc: dict) -> None:
    """Undo join_in_network (the switches give the groups' slots back)."""
    leave = {
        "leave": [t[:2] for t in inc.inc_trees(plan_inc)],
        "unregister": [r[:2] for r in plan_inc["register"]],
    }
    with contextlib.suppress(JobError):
        _fabric_inc(lab, leave)


def _fabric_inc(lab: str, req: dict) -> None:
    """Join or leave in-network aggregation trees in the lab's switches."""
    try:
        resp = fabric_client.request(lab, {"op": "inc", **req})
    except (OSError, ValueError) as e:
        raise JobError(f"cannot set up in-network aggregation: {e}") from e
    if not resp.get("ok"):
        raise JobError(f"cannot set up in-network aggregation: {resp.get('error')}")


def fabric_sample(lab: str, prev: dict | None = None) -> dict:
    """One sample of the fabric (Fabric.sample), its ports packed
    (fidelity.PortRows, sharing prev's names), taken now (monotonic t)."""
    resp = fabric_client.request(lab, {"op": "sample"})
    if not resp.get("ok"):
        raise ValueError(resp.get("error", "sample failed"))
    st = resp["sample"]
    ports = fidelity.PortRows(st["ports"], prev["ports"] if prev else None)
    return {"t": time.monotonic(), "cpu_s": st["cpu_s"], "k": st["time_scale"], "ports": ports,
            "ring_drops": st.get("ring_drops", 0)}  # fmt: skip


def iteration_times_s(timing: dict) -> list[float] | None:
    """Each timed iteration's nominal seconds, from one rank's timing (from
    when its previous one ended; with --check all, its run alone) or from a
    job's row (from when the previous one had ended on every rank; the
    slowest rank's run alone); None without the fabric clock's times."""
    if "nruns" in timing:
        return timing["nruns"]
    if "nends" not in timing or timing.get("n0") is None:
        return None
    starts = [timing["n0"], *timing["nends"][:-1]]
    return [end - start for start, end in zip(starts, timing["nends"], strict=True)]


def _rank_iters_range_s(per_rank: list[dict]) -> list[float] | None:
    """The shortest and the longest timed iteration of any rank, nominal
    seconds, each rank's from its own clock readings (iteration_times_s)."""
    its = [t for x in per_rank for t in iteration_times_s(x) or [] if t > 0]
    return [min(its), max(its)] if its else None


class Job:
    def __init__(
        self,
        plan: Plan,
        rec: dict,
        on_result: Callable[[dict], None] | None = None,
        on_progress: Callable[[str], None] | None = None,
    ):
        """on_result(row) runs as each size completes on every rank;
        on_progress(barrier) as every rank passes a barrier (check-I, warm-I,
        time-I for size I, close)."""
        self.plan, self.rec = plan, rec
        self.on_result = on_result or (lambda row: None)
        self.on_progress = on_progress or (lambda name: None)
        hosts = sorted(
            (n for n in rec["topology"]["nodes"] if n["role"] == "host"), key=lambda n: n["index"]
        )
        if plan.nodes is not None:
            by_name = {h["name"]: h for h in hosts}
            missing = [x for x in plan.nodes if x not in by_name]
            if missing or len(set(plan.nodes)) != len(plan.nodes) or len(plan.nodes) < 2:
                raise JobError(f"a job needs two or more distinct accelerators, not {plan.nodes}")
            hosts = [by_name[x] for x in plan.nodes]
            plan.members = [h["index"] for h in hosts]
        all_reduce = canonical(plan.collective) == "all-reduce"
        if all_reduce and plan.algo == "auto" and inc.auto_in_network(rec, plan.transport):
            plan.algo = "in-network"  # catalog.pick_all_reduce's first choice
        if plan.algo == "in-network":
            plan.inc = plan_in_network(rec, plan.members)
        # Ranks are the job's: 0..n-1 in plan.nodes order (the lab's order by default).
        self.ranks = [Rank(i, h["name"]) for i, h in enumerate(hosts)]
        self.world = len(self.ranks)
        per = ranks_per_host(self.world, plan.ranks_per_host)
        self.hosts = [Host(self.ranks[i : i + per]) for i in range(0, self.world, per)]
        jobdir = registry.lab_dir(plan.lab) / "job"
        jobdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(jobdir, 0o700)  # its socket takes orders from workers: root's alone
        global _serial
        _serial += 1
        self.sock_path = str(jobdir / f"job-{os.getpid()}-{_serial}.sock")
        for h in self.hosts:
            h.log = str(jobdir / f"{h.ranks[0].node}.log")
        self.results: list[list[dict | None]] = [[None] * self.world for _ in plan.sizes]
        self.rows: list[dict] = []
        self.samples: list[dict] = []
        self.sample_s = fidelity.sample_interval_s(rec)
        self.barriers: dict[str, set[int]] = {}
        self.failed: asyncio.Future | None = None
        self._stop_signals: list = []  # run(): stop_signals()
        self.handlers: set[asyncio.Task] = set()
        self.last_msg = time.monotonic()  # or the fabric's last progress (_sample)
        self._frames_moved = -1
        self._plan_bytes: bytes | None = None  # _plan_line

    # -- the run
    def run(self) -> dict:
        with stop_signals() as self._stop_signals:
            return uvloop.run(self._main())

    def _interrupt(self, sig: int) -> None:
        """A signal: the job fails as if a rank had, stopping every worker."""
        if not self.failed.done():
            self.failed.set_exception(Interrupted(signal.Signals(sig).name))

    async def _main(self) -> dict:
        loop = asyncio.get_running_loop()
        self.failed = loop.create_future()
        for sig in self._stop_signals:  # the main thread's job only
            loop.add_signal_handler(sig, self._interrupt, sig)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.sock_path)
        server = await asyncio.start_unix_server(self._serve, self.sock_path, limit=1 << 24)
        os.chmod(self.sock_path, 0o600)
        t_start = time.monotonic()
        busy0 = cpu.machine_s()
        before = await loop.run_in_executor(None, fabric_stats, self.plan.lab)
        tasks: list[asyncio.Task] = []
        try:
            if self.plan.inc:
                await loop.run_in_executor(None, join_in_network, self.plan.lab, self.plan.inc)
            for h in self.hosts:
                await self._spawn(h)
                tasks.append(asyncio.create_task(self._watch(h)))
            # a job that does not sample still watches the frames: its
            # collective may outlast the stall limit while they move
            tasks.append(asyncio.create_task(self._sample()))
            tasks.append(asyncio.create_task(self._stall_guard()))
            await self.failed
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._stop_all()
            server.close()
            for r in self.ranks:
                if r.writer is not None:
                    r.writer.close()
            _, pending = (
                await asyncio.wait(self.handlers, timeout=GRACE_S) if self.handlers else ((), ())
            )
            for h in pending:
                h.cancel()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.sock_path)
            if self.plan.inc:
                await loop.run_in_executor(None, leave_in_network, self.plan.lab, self.plan.inc)
        after = await loop.run_in_executor(None, fabric_stats, self.plan.lab)
        busy1 = cpu.machine_s()
        return {
            "plan": asdict(self.plan),
            "world": self.world,
            "rows": self.rows,
            "ranks": [
                {
                    "rank": r.rank,
                    "node": r.node,
                    "transport": r.ready,
                    "ready_cpu_s": r.ready_cpu_s,
                    **(r.done or {}),
                }
                for r in self.ranks
            ],
            "hosts": [
                {"pid": h.proc.pid if h.proc else None, "ranks": [r.rank for r in h.ranks]}
                for h in self.hosts
            ],
            "samples": self.samples,
            "fabric_before": before,
            "fabric_after": after,
            "wall_s": time.monotonic() - t_start,
            "machine_busy_frac": (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1e-9),
        }

    async def _spawn(self, h: Host) -> None:
        pairs = [x for r in h.ranks for x in (r.node, self.rec["namespaces"][r.node])]
        with open(h.log, "wb") as log, _spawn_lock:
            h.proc = await asyncio.create_subprocess_exec(
                *python_module("dataplane.run.worker", self.sock_path, self.plan.lab, *pairs),
                cwd="/",
                env=parent.child_environ(module_environ()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def _fail(self, msg: str) -> None:
        if not self.failed.done():
            self.failed.set_exception(JobError(msg))

    def _finish_if_done(self) -> None:
        if all(r.done is not None for r in self.ranks) and not self.failed.done():
            self.failed.set_result(None)

    def _log_tail(self, h: Host, lines: int = 3) -> str:
        try:
            with open(h.log, errors="replace") as f:
                tail = [ln.rstrip() for ln in f.readlines() if ln.strip()][-lines:]
        except OSError:
            return ""
        return " | ".join(tail)

    async def _watch(self, h: Host) -> None:
        rc = await h.proc.wait()
        await asyncio.sleep(0.05)  # let its last message arrive first
        if any(r.done is None for r in h.ranks):
            why = next((r.error for r in h.ranks if r.error), None) or self._log_tail(h)
            verb = "was" if len(h.ranks) == 1 else "were"
            how = f"{verb} killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
            self._fail(f"{h.names()} {how}: {why or 'no message'}")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handlers.add(asyncio.current_task())
        # A handler's task belongs to the server: it must end by itself, not by
        # a cancellation (which asyncio would log as an error).
        with contextlib.suppress(asyncio.CancelledError):
            await self._converse(reader, writer)
        writer.close()

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        r: Rank | None = None
        try:
            hello = json.loads(await reader.readline())
            r = next(x for x in self.ranks if x.node == hello["hello"])
            r.writer = writer
            writer.write(self._plan_line())
            await writer.drain()
            while line := await reader.readline():
                self.last_msg = time.monotonic()
                self._on_message(r, json.loads(line))
        except (ConnectionError, ValueError, StopIteration) as e:
            if r is None:
                self._fail(f"a worker spoke out of turn: {e}")
        if r is not None and r.done is None:
            # The process watcher names the exit status: wait for the exit
            # (a process the kernel killed for memory takes seconds to go).
            h = next(h for h in self.hosts if r in h.ranks)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(h.proc.wait()), 10.0)
            await asyncio.sleep(0.1)  # its watcher's turn
            self._fail(
                f"rank {r.rank} ({r.node}) closed its channel: {r.error or 'no error given'}"
            )

    def _plan_line(self) -> bytes:
        """The plan as every rank is told it: encoded once a job (upn-512's
        in-network plan, copied and encoded per rank, took the coordinator
        about 9 s of CPU before the first barrier)."""
        if self._plan_bytes is None:
            self._plan_bytes = json.dumps({"plan": asdict(self.plan)}).encode() + b"\n"
        return self._plan_bytes

    def _on_message(self, r: Rank, msg: dict) -> None:
        if "barrier" in msg:
            name = msg["barrier"]
            arrived = self.barriers.setdefault(name, set())
            arrived.add(r.rank)
            if len(arrived) == self.world:
                del self.barriers[name]
                go = json.dumps({"go": name}).encode() + b"\n"
                for x in self.ranks:
                    x.writer.write(go)
                self.on_progress(name)
        elif "ready" in msg:
            r.ready = msg["ready"]
            r.ready_cpu_s = float(msg.get("cpu_s", 0.0))
        elif "result" in msg:
            res = msg["result"]
            slot = self.results[res["index"]]
            slot[r.rank] = res
            if all(x is not None for x in slot):
                row = self._row(slot)
                self.rows.append(row)
                self.on_result(row)
        elif "done" in msg:
            r.done = msg["done"]
            self._finish_if_done()
        elif "error" in msg:
            r.error = msg["error"]
            self._fail(f"rank {r.rank} ({r.node}) failed: {r.error}")

    def _row(self, per_rank: list[dict]) -> dict:
        """One size, every rank: the slowest rank's time per iteration."""
        iters = self.plan.iters
        return {
            "size": per_rank[0]["size"],
            "count": per_rank[0]["count"],
            # the runs alone (--check all puts a check and a barrier between runs)
            "time_real_s": max(x.get("run_s", x["t1"] - x["t0"]) for x in per_rank) / iters,
            # the same on the lab's fabric clock: right even when k moved
            "time_nominal_s": max(
                sum(x["nruns"]) if "nruns" in x else x["n1"] - x["n0"] for x in per_rank
            )
            / iters,
            "wrong": sum(x["wrong"] for x in per_rank),
            "t0": min(x["t0"] for x in per_rank),
            "t1": max(x["t1"] for x in per_rank),
            "n0": min(x["n0"] for x in per_rank),
            "n1": max(x["n1"] for x in per_rank),
            # how far apart the ranks began (each after the same barrier)
            "start_skew_s": max(x["n0"] for x in per_rank) - min(x["n0"] for x in per_rank),
            # when each timed iteration had ended on every rank
            "ends": [max(e) for e in zip(*(x["ends"] for x in per_rank), strict=True)],
            "nends": [max(e) for e in zip(*(x["nends"] for x in per_rank), strict=True)],
            # --check all: each iteration's run alone, its check left out
            **(
                {"nruns": [max(e) for e in zip(*(x["nruns"] for x in per_rank), strict=True)]}
                if "nruns" in per_rank[0]
                else {}
            ),
            # the fastest and the slowest timed iteration on any rank, as the
            # time above reads them (each rank's own): its mean lies between
            "rank_iters_range_s": _rank_iters_range_s(per_rank),
            # each rank's NIC engine over its timed window (none for kernel TCP)
            "engines": [
                {"rank": r, **x["engine"]} for r, x in enumerate(per_rank) if x.get("engine")
            ],
        }

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            prev = self.samples[-1] if self.samples else None
            try:
                s = await loop.run_in_executor(None, fabric_sample, self.plan.lab, prev)
            except (OSError, ValueError) as e:
                self._fail(f"the fabric of lab {self.plan.lab!r} stopped answering: {e}")
                return
            except Exception as e:  # noqa: BLE001 - a bug here must not pass silently
                self._fail(f"sampling the fabric failed: {type(e).__name__}: {e}")
                return
            moved = sum(p[4] for p in s["ports"].values())  # frames sent by every port
            if moved != self._frames_moved:
                self._frames_moved, self.last_msg = moved, time.monotonic()
            if not self.plan.sample:
                # one job of several samples the fabric; the others only watch
                # its frames move (for the stall guard), seldom
                await asyncio.sleep(max(self.sample_s, min(FRAMES_WATCH_S, self.plan.stall_s / 4)))
                continue
            s["workers_cpu_s"] = sum(cpu.process_s(h.proc.pid) for h in self.hosts if h.proc)
            self.samples.append(s)
            await asyncio.sleep(self.sample_s)

    async def _stall_guard(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            quiet = time.monotonic() - self.last_msg
            if quiet > self.plan.stall_s:
                waiting = {n: sorted(set(range(self.world)) - a) for n, a in self.barriers.items()}
                self._fail(
                    f"no rank reported and no frame moved for {quiet:.0f} s (stalled);"
                    f" missing at barriers: {waiting}"
                )

    async def _stop_all(self) -> None:
        live = [h.proc for h in self.hosts if h.proc and h.proc.returncode is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), GRACE_S)
        except TimeoutError:
            for p in live:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
            await asyncio.gather(*(p.wait() for p in live))
