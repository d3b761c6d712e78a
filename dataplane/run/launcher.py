"""``ethplus run``: a program's ranks in a lab's accelerators, torchrun style.

One process per rank, each started inside its node's namespace (this
module's ``__main__``: join the namespace, die with the launcher, exec the
command) with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR on the lab's network, MASTER_PORT) and the lab's (ENV_*: what the
``ethplus`` torch backend reads).  Each rank's output is printed prefixed with
its rank; when one fails, the others are stopped and the run fails in one
line naming it.  After a run, the ranks' records (torch_backend writes one
each) become the per-collective table, beside the fabric's counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

from dataplane.errors import EthplusError, UsageError
from dataplane.lab import cpu
from dataplane.lab.labs import python_module
from dataplane.model.catalog import ALGORITHMS, bus_factor
from dataplane.report import fidelity
from dataplane.run import parent, stacks, store

ENV_LAB = "ETHPLUS_LAB"
ENV_NODES = "ETHPLUS_NODES"  # the job's accelerators, in rank order, comma-separated
ENV_TRANSPORT = "ETHPLUS_TRANSPORT"  # ethplus, roce, tcp, or gloo (stock gloo, timed)
ENV_RUN_DIR = "ETHPLUS_RUN_DIR"  # where each rank writes rank-N.json at shutdown
ENV_BACKEND = "ETHPLUS_BACKEND"  # the name a program passes to init_process_group
ENV_ALGO = "ETHPLUS_ALGO"  # all-reduce: ring, halving-doubling, hierarchical, tree, auto, ...
INC_FILE = "inc.json"  # in the run's directory: the job's in-network aggregation plan
TRANSPORTS = ("ethplus", "roce", "tcp")
BACKENDS = ("ethplus", "gloo")
ALGOS = ALGORITHMS["all-reduce"]
MASTER_PORT = 29500
GRACE_S = 3.0
STACKS_S = 1.0  # --timeout: how long the ranks' stacks have to come out
SAMPLE_S = 0.5
READ_BYTES = 64 * 1024  # a rank's output is read in chunks this large
LINE_MAX_CHARS = 4096  # a longer line is shown cut, and says so


class RunError(EthplusError, RuntimeError):
    """A rank failed, or the run could not start."""


@dataclass
class RankEnv:
    """What ethplus run told this rank."""

    lab: str
    nodes: list[str]
    transport: str
    run_dir: str | None
    algo: str = "auto"

    @property
    def world(self) -> int:
        return len(self.nodes)

    def members(self, rec: dict) -> list[int]:
        index = {n["name"]: n["index"] for n in rec["topology"]["nodes"] if n["role"] == "host"}
        return [index[n] for n in self.nodes]


def rank_env(environ=os.environ) -> RankEnv:
    """This rank's settings (UsageError naming what is missing or wrong)."""
    lab = environ.get(ENV_LAB)
    if not lab:
        raise UsageError(
            f"the ethplus backend runs under `ethplus run LAB -- CMD` ({ENV_LAB} is not set)"
        )
    nodes = [x for x in environ.get(ENV_NODES, "").split(",") if x]
    transport = environ.get(ENV_TRANSPORT, "ethplus")
    if transport not in (*TRANSPORTS, "gloo"):
        raise UsageError(
            f"{ENV_TRANSPORT}={transport!r}: expected one of {', '.join(TRANSPORTS)}, gloo"
        )
    if not nodes:
        raise UsageError(f"{ENV_NODES} is not set (ethplus run sets it)")
    algo = environ.get(ENV_ALGO, "auto")
    if algo not in ALGOS:
        raise UsageError(f"{ENV_ALGO}={algo!r}: expected one of {', '.join(ALGOS)}")
    return RankEnv(lab, nodes, transport, environ.get(ENV_RUN_DIR) or None, algo)


def in_network_plan(env: RankEnv) -> dict | None:
    """The job's in-network aggregation plan, if ethplus run made one."""
    if not env.run_dir:
        return None
    try:
        with open(os.path.join(env.run_dir, INC_FILE)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


# ---------------------------------------------------------------- the launcher side


@dataclass
class Rank:
    rank: int
    node: str
    proc: asyncio.subprocess.Process | None = None
    rc: int | None = None


def _ports(rec: dict, node: str) -> list[dict]:
    """node's ports, by plane."""
    n = next(x for x in rec["topology"]["nodes"] if x["name"] == node)
    return sorted(n["ports"], key=lambda p: p.get("plane", 0))


def command(cmd: list[str]) -> list[str]:
    """The user's command, `python` meaning the Python ethplus runs on (as
    torchrun runs a script with its own)."""
    if not cmd:
        raise UsageError("nothing to run: ethplus run LAB [OPTIONS] -- CMD [ARGS...]")
    if cmd[0] in ("python", "python3"):
        return [sys.executable, *cmd[1:]]
    return list(cmd)


def rank_environ(rec: dict, nodes: list[str], rank: int, transport: str, backend: str,
                 run_dir: str, master_port: int, algo: str = "auto",
                 serves_store: bool = False) -> dict[str, str]:  # fmt: skip
    """The environment of rank's process: the caller's, torchrun's, the lab's."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # ranks share the machine's cores, as torchrun's
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(len(nodes)), "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
        "MASTER_ADDR": _ports(rec, nodes[0])[0]["ip"], "MASTER_PORT": str(master_port),
        "PYTHONUNBUFFERED": "1",
        ENV_LAB: rec["name"], ENV_NODES: ",".join(nodes),
        ENV_TRANSPORT: "gloo" if backend == "gloo" else transport,
        ENV_RUN_DIR: run_dir, ENV_BACKEND: "ethplus", ENV_ALGO: algo,
        "GLOO_SOCKET_IFNAME": ",".join(p["ifname"] for p in _ports(rec, nodes[rank])),
    })  # fmt: skip
    if serves_store:  # ethplus run serves it (store.py), as torchrun's agent does
        env[store.USE_AGENT_STORE] = "True"
    return env


def check_options(transport: str, backend: str, algo: str, master_port: int) -> None:
    """UsageError naming the option that is wrong, before anything starts."""
    if transport not in TRANSPORTS:
        raise UsageError(f"--transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if not 1 <= master_port <= 65535:
        raise UsageError(f"--master-port {master_port}: expected 1 to 65535")
    if algo not in ALGOS:
        raise UsageError(f"--algo {algo!r}: expected one of {', '.join(ALGOS)}")
    if algo == "in-network" and (backend, transport) != ("ethplus", "ethplus"):
        raise UsageError("--algo in-network: the ethplus backend on the ethplus transport only")


class Launch:
    """One run of a command on some of a lab's accelerators."""

    def __init__(self, rec: dict, nodes: list[str], cmd: list[str], transport: str = "ethplus",
                 backend: str = "ethplus", master_port: int = MASTER_PORT,
                 timeout_s: float | None = None, algo: str = "auto", say=print):  # fmt: skip
        check_options(transport, backend, algo, master_port)
        self.algo = algo
        self.rec, self.nodes, self.cmd = rec, nodes, command(cmd)
        self.transport, self.backend = transport, backend
        self.master_port, self.timeout_s, self.say = master_port, timeout_s, say
        self.ranks = [Rank(i, n) for i, n in enumerate(nodes)]
        # with torch here, this run serves the ranks' store (store.py, beside rank 0)
        self.serves_store = importlib.util.find_spec("torch") is not None
        self.store: asyncio.subprocess.Process | None = None
        self.failed: str | None = None
        self.stop_signals: list = []  # run(): what stops it, its ranks stopped first

    def run(self) -> dict:
        import uvloop

        from dataplane.run import inc, job

        run_dir = make_run_dir(self.rec["name"])
        plan_inc = None
        try:
            if self.algo == "in-network" or (
                self.algo == "auto" and self.backend == "ethplus"
                and inc.auto_in_network(self.rec, self.transport)
            ):  # fmt: skip
                members = RankEnv(self.rec["name"], self.nodes, self.transport, None).members(
                    self.rec
                )
                plan_inc = job.plan_in_network(self.rec, members)
                with open(os.path.join(run_dir, INC_FILE), "w") as f:
                    json.dump(plan_inc, f)
                job.join_in_network(self.rec["name"], plan_inc)
            with job.stop_signals() as self.stop_signals:
                res = uvloop.run(self._main(run_dir))
            res["algo"] = "in-network" if plan_inc is not None else self.algo
            return res
        finally:
            if plan_inc is not None:
                job.leave_in_network(self.rec["name"], plan_inc)
            shutil.rmtree(run_dir, ignore_errors=True)

    async def _main(self, run_dir: str) -> dict:
        from dataplane.run.job import fabric_sample, fabric_stats

        loop = asyncio.get_running_loop()
        for sig in self.stop_signals:
            loop.add_signal_handler(sig, self._fail, f"interrupted by {signal.Signals(sig).name}")
        lab = self.rec["name"]
        before = await loop.run_in_executor(None, fabric_stats, lab)
        busy0 = cpu.machine_s()
        t0 = time.monotonic()
        samples: list[dict] = []

        async def sample() -> None:
            while True:
                prev = samples[-1] if samples else None
                s = await loop.run_in_executor(None, fabric_sample, lab, prev)
                s["workers_cpu_s"] = sum(cpu.process_s(r.proc.pid) for r in self.ranks if r.proc)
                samples.append(s)
                await asyncio.sleep(max(SAMPLE_S, fidelity.sample_interval_s(self.rec)))

        sampler = asyncio.create_task(sample())
        serving = None
        try:
            if self.serves_store:  # the ranks' clients retry until it listens
                serving = asyncio.create_task(self._serve_store())
            for r in self.ranks:
                if self.failed:  # a signal came while the ranks were starting
                    break
                await self._spawn(r, run_dir)
            watch = asyncio.gather(*(self._watch(r) for r in self.ranks if r.proc))
            try:
                await asyncio.wait_for(asyncio.shield(watch), self.timeout_s)
            except TimeoutError:
                await self._stacks()
                self._fail(f"the run took longer than --timeout {self.timeout_s:g} s"
                           " (each rank's stacks above: where it was waiting)")  # fmt: skip
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        finally:
            for task in (sampler, serving):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, OSError, ValueError):
                        await task
            await self._stop_all()
        if self.failed:
            raise RunError(self.failed)
        after = await loop.run_in_executor(None, fabric_stats, lab)
        busy1 = cpu.machine_s()
        ranks = []
        for r in self.ranks:
            rep = _read_report(run_dir, r)
            ranks.append({"rank": r.rank, "node": r.node, **rep})
        return {
            "lab": lab, "nodes": self.nodes, "command": self.cmd, "backend": self.backend,
            "transport": "gloo" if self.backend == "gloo" else self.transport,
            "ranks": ranks, "rows": [], "samples": samples,
            "fabric_before": before, "fabric_after": after, "wall_s": time.monotonic() - t0,
            "machine_busy_frac": (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1e-9),
        }  # fmt: skip

    async def _spawn(self, r: Rank, run_dir: str) -> None:
        ns = self.rec["namespaces"][r.node]
        env = rank_environ(self.rec, self.nodes, r.rank, self.transport, self.backend, run_dir,
                           self.master_port, self.algo, self.serves_store)  # fmt: skip
        r.proc = await _start_in(self.rec["name"], ns, self.cmd, env=env)

    async def _serve_store(self) -> None:
        """The run's store (store.py) in rank 0's namespace, until the ranks
        are done; if it fails, so does the run."""
        ns = self.rec["namespaces"][self.nodes[0]]
        addr = _ports(self.rec, self.nodes[0])[0]["ip"]
        cmd = python_module("dataplane.run.store", addr, str(self.master_port),
                            str(len(self.nodes)))  # fmt: skip
        self.store = await _start_in(self.rec["name"], ns, cmd, cwd="/")
        assert self.store.stdout is not None
        last = ""
        async for line in output_lines(self.store.stdout):
            last = line.strip() or last
        rc = await self.store.wait()
        self._fail(f"the run's store on {self.nodes[0]} (--master-port {self.master_port}) "
                   f"exited with status {rc}: {last}")  # fmt: skip

    async def _watch(self, r: Rank) -> None:
        prefix = f"[rank {r.rank} {r.node}] "
        assert r.proc is not None and r.proc.stdout is not None
        async for line in output_lines(r.proc.stdout):
            self.say(prefix + line)
        r.rc = await r.proc.wait()
        if r.rc != 0:
            how = f"was killed by signal {-r.rc}" if r.rc < 0 else f"exited with status {r.rc}"
            self._fail(f"rank {r.rank} ({r.node}) {how}")

    def _fail(self, msg: str) -> None:
        if self.failed is None:
            self.failed = msg
            for r in self.ranks:
                _signal(r.proc, signal.SIGTERM)

    async def _stacks(self) -> None:
        """Each rank still running asked for its threads' stacks (stacks.py:
        a rank that imported the ethplus backend prints them), and STACKS_S
        for them to come out, prefixed, before the run is stopped."""
        for r in self.ranks:
            if r.proc is not None and r.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(r.proc.pid, stacks.SIGNAL)  # the rank's own process: exec'd
        await asyncio.sleep(STACKS_S)

    async def _stop_all(self) -> None:
        """The ranks, then the store they may still be using."""
        for procs in ([r.proc for r in self.ranks], [self.store]):
            live = [p for p in procs if p is not None and p.returncode is None]
            for p in live:
                _signal(p, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), GRACE_S)
            except TimeoutError:
                for p in live:
                    _signal(p, signal.SIGKILL)
                await asyncio.gather(*(p.wait() for p in live))
            _signal_all(procs, signal.SIGKILL)  # what each left behind in its session


def make_run_dir(lab: str) -> str:
    """A run's directory (the ranks' records, the in-network plan): in the
    lab's own directory under /run/ethplus (a user's: in its keeper's
    private /run), never the caller's $TMPDIR, root's alone, named for this
    process (pid and start time).  Those of runs whose process is gone (a
    SIGKILL skips the removal) are removed first."""
    from dataplane.lab import registry

    base = registry.lab_dir(lab) / "runs"
    base.mkdir(mode=0o700, exist_ok=True)
    os.chmod(base, 0o700)
    for d in base.iterdir():
        try:
            _run, pid, start, _rest = d.name.split("-", 3)
            alive = registry.process_alive(int(pid), int(start))
        except ValueError:
            alive = False
        if not alive:
            shutil.rmtree(d, ignore_errors=True)
    pid = os.getpid()
    return tempfile.mkdtemp(prefix=f"run-{pid}-{registry.process_start(pid)}-", dir=base)


async def output_lines(stream: asyncio.StreamReader, max_chars: int = LINE_MAX_CHARS):
    """A process's output as lines, whatever it writes: read in chunks, cut
    at '\n', '\r' or '\r\n' (a progress bar's updates end in '\r' alone),
    each line held to max_chars (the rest counted, never kept: a line of
    many megabytes without a newline costs no memory) and told as cut."""
    held = bytearray()
    cut = 0
    after_cr = False

    def line() -> str:
        text = held.decode(errors="replace")
        return f"{text}... [line cut: {cut} more bytes]" if cut else text

    while chunk := await stream.read(READ_BYTES):
        at = 0
        if after_cr and chunk[:1] == b"\n":
            at = 1  # the '\n' of a '\r\n' ends no second line
        after_cr = False
        while at < len(chunk):
            ends = [i for i in (chunk.find(b"\n", at), chunk.find(b"\r", at)) if i >= 0]
            end = min(ends) if ends else len(chunk)
            room = max_chars - len(held)
            held += chunk[at : at + min(end - at, room)]
            cut += max(end - at - room, 0)
            if not ends:
                break
            yield line()
            held.clear()
            cut = 0
            at = end + 1
            if chunk[end : end + 1] == b"\r":
                if chunk[at : at + 1] == b"\n":
                    at += 1
                elif at == len(chunk):
                    after_cr = True
    if held or cut:
        yield line()


async def _start_in(lab: str, ns: str, cmd: list[str], env: dict[str, str] | None = None,
                    **kw) -> asyncio.subprocess.Process:  # fmt: skip
    """cmd in namespace ns of lab (this module's __main__), in a session of
    its own, its output (stderr too) on a pipe; it dies with this process."""
    proc = await asyncio.create_subprocess_exec(
        *python_module("dataplane.run.launcher", lab, ns, "--", *cmd),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        env=parent.child_environ(env), **kw,
    )  # fmt: skip
    proc.ethp_netns = ns  # type: ignore[attr-defined]  # where its session lives (_signal)
    return proc


def sessions_members(sessions: dict[int, str]) -> dict[int, list[int]]:
    """The processes of each session (sid -> the network namespace it lives
    in) that live in that namespace: one look at /proc for them all."""
    want = {}
    for sid, netns in sessions.items():
        with contextlib.suppress(OSError):
            want[sid] = os.stat(netns).st_ino
    out: dict[int, list[int]] = {sid: [] for sid in sessions}
    if not want:
        return out
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            with open(f"/proc/{e.name}/stat", "rb") as f:
                session = int(f.read().rsplit(b")", 1)[1].split()[3])
            if session in want and os.stat(f"/proc/{e.name}/ns/net").st_ino == want[session]:
                out[session].append(int(e.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def session_members(sid: int, netns: str) -> list[int]:
    """The processes of session sid that live in network namespace netns."""
    return sessions_members({sid: netns})[sid]


def _signal(proc: asyncio.subprocess.Process | None, sig: int) -> None:
    """sig to a rank's (or the store's) whole session: its command and what
    that started (_signal_all)."""
    _signal_all([proc], sig)


def _signal_all(procs: list, sig: int) -> None:
    """sig to each rank's (or the store's) whole session.  Its group as a
    whole while its leader is not reaped (its pid is still its own); after,
    only the processes that still have its session, in its lab namespace: a
    pid freed by the leader may be another process's, and its group that
    process's."""
    reaped = {}
    for proc in procs:
        if proc is None:
            continue
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
        else:
            reaped[proc.pid] = getattr(proc, "ethp_netns", "")
    for pids in sessions_members(reaped).values() if reaped else ():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def _read_report(run_dir: str, r: Rank) -> dict:
    """A rank's record, or {} if it wrote none (a program that did not use
    the ethplus backend)."""
    path = os.path.join(run_dir, f"rank-{r.rank}.json")
    try:
        with open(path) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return {}
    return rep if isinstance(rep, dict) else {}


def call_times(result: dict) -> list[tuple[str, int, float]]:
    """Each collective call of a run: its name, size (the largest of its
    ranks': an uneven all-to-all's differ) and nominal seconds from the last
    rank's start to the last rank's end (the fabric clock is the lab's, one
    for every rank)."""
    ranks = [r["calls"] for r in result["ranks"] if r.get("calls") is not None]
    if not ranks:
        return []
    out = []
    for i in range(min(len(c) for c in ranks)):
        start = max(c[i][2] for c in ranks)
        end = max(c[i][3] for c in ranks)
        out.append((ranks[0][i][0], max(c[i][1] for c in ranks), max(end - start, 0.0)))
    return out


def summary(result: dict) -> list[dict]:
    """Per collective and size: calls, bytes, nominal seconds (call_times),
    busbw (nccl-tests' factors, GB/s).  A call's size is the
    largest of its ranks' (an uneven all-to-all's differ); calls whose sizes
    differ but round up to the same power of two share a row, which gives
    their range."""
    ranks = [r for r in result["ranks"] if r.get("calls") is not None]
    if not ranks:
        return []
    world = len(result["ranks"])
    rows: dict[tuple[str, int], dict] = {}
    for name, nbytes, t in call_times(result):
        bucket = 1 << max(nbytes - 1, 0).bit_length()
        row = rows.setdefault((name, bucket), {"collective": name, "min_bytes": nbytes,
                                               "size_bytes": nbytes, "calls": 0,
                                               "bytes": 0, "time_s": 0.0})  # fmt: skip
        row["calls"] += 1
        row["bytes"] += nbytes
        row["time_s"] += t
        row["min_bytes"] = min(row["min_bytes"], nbytes)
        row["size_bytes"] = max(row["size_bytes"], nbytes)
    out = []
    for row in rows.values():
        alg = row["bytes"] / row["time_s"] / 1e9 if row["time_s"] > 0 else 0.0
        factor = 0.0 if row["collective"] == "barrier" else bus_factor(row["collective"], world)
        out.append({**row, "algbw_GBps": alg, "busbw_GBps": alg * factor})
    for kind in ("send", "recv"):
        calls = sum(r["p2p"][kind][0] for r in ranks)
        if calls:
            nbytes = sum(r["p2p"][kind][1] for r in ranks)
            t = sum(r["p2p"][kind][2] for r in ranks)
            alg = nbytes / t / 1e9 if t else 0.0
            out.append({"collective": kind, "min_bytes": 0, "size_bytes": 0, "calls": calls,
                        "time_s": t, "bytes": nbytes, "algbw_GBps": alg,
                        "busbw_GBps": 0.0})  # fmt: skip
    return out


# ---------------------------------------------------------------- a rank's start


def main(argv: list[str]) -> int:
    """python -I -m dataplane.run.launcher LAB NS -- CMD...: CMD in lab LAB's
    namespace NS (and its cgroup: its TCP handshakes' timeout follows k)."""
    from dataplane.lab import cgroup, core, registry

    if len(argv) < 4 or argv[2] != "--":
        print("usage: launcher LAB NS -- CMD [ARGS...]", file=sys.stderr)
        return 2
    if not parent.die_with_parent():
        return 1  # ethplus run died before it could be told to
    cgroup.join(registry.load_lab(argv[0]) or {"name": argv[0]})
    core.netns_join(argv[1])
    cmd = argv[3:]
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        print(f"ethplus run: cannot start {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
