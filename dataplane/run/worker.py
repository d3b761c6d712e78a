"""The ranks of a job: a process (a rank host) running one rank, or several
in threads of their own, each inside its accelerator's namespace.

Started by dataplane/run/job.py as ``python -m dataplane.run.worker SOCKET
LAB NODE NS [NODE NS ...]``.  The process joins the first rank's namespace
(before any thread exists: the fabric finds it there), arranges to die with
its parent, and runs each rank: a rank of many moves its own thread into its
namespace (its kernel sockets open there; its NIC engine opens its own).
Each rank says hello on the job's Unix socket, gets the plan, and for each
size: fills its buffers, runs the collective once and checks it against the
numpy reference, warms up, then times ``iters`` back-to-back runs between two
barriers.  It reports one line of JSON per size, then its counters.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import threading
import time
import traceback

import numpy as np

from dataplane.lab import cgroup, clock, core, cpu, registry
from dataplane.memo import once
from dataplane.model.catalog import available
from dataplane.run import parent, reference, stacks
from dataplane.run.collectives import Comm
from dataplane.run.transport import Group, Options, Transport, TransportError
from dataplane.run.workload import Case
from dataplane.scale import Scale


class Link:
    """The worker's line-of-JSON channel to the job."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.rf = self.sock.makefile("rb")

    def send(self, **msg) -> None:
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def recv(self) -> dict:
        line = self.rf.readline()
        if not line:
            raise SystemExit("the job went away")
        return json.loads(line)

    def barrier(self, name: str) -> None:
        self.send(barrier=name)
        msg = self.recv()
        if msg.get("go") != name:
            raise SystemExit(f"expected go {name!r}, got {msg}")


def open_transport(
    name: str, lab: str, node: str, rec: dict, opts: Options, barrier=None
) -> Transport:
    """The transport of one rank.  barrier(name) returns once every rank has
    called it: transports that must listen before their peers connect use it."""
    if name in ("ethplus", "roce"):
        from dataplane.run.transports.nic import NicTransport

        t: Transport = NicTransport(name, lab, node, rec, opts)
    elif name == "tcp":
        from dataplane.run.transports.tcp import TcpTransport

        t = TcpTransport(lab, node, rec, opts, barrier)
    else:
        raise TransportError(
            f"unknown transport {name!r} (expected one of {', '.join(available())})"
        )
    return Group(t, opts.members) if opts.members is not None else t


@once(maxsize=2)
def _lab_record(lab: str) -> dict | None:
    """The lab's record, read once per process: its ranks share it (read
    only; upn-512's is 1.3 MB of JSON, 13 ms to parse, once per rank before)."""
    return registry.load_lab(lab)


# Process-wide readings of /proc: every rank of a rank host asks at the same
# barrier, and one reading (of all its threads) serves them all.
_process_waited_s = cpu.Shared(cpu.process_waited_s)
_frame_threads_s = cpu.Shared(cpu.frame_threads_s)


def _peak_rss_bytes() -> int:
    """This process's peak resident memory so far (all its ranks)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# Schedule ops a process builds ahead of its timed runs (Case.prepare),
# shared among its ranks: about half a KB an op (the Python schedule and the
# engine's compiled form), so half a GB at most
PREPARED_OPS_PER_PROCESS = 1 << 20

# The NIC engine's own fidelity counters, taken over each timed window.
ENGINE_KEYS = (
    "eng_late_wakeups", "eng_late_sum_ns", "eng_lost_ns", "rx_ring_drops", "rx_wait_sum_ns",
    "rx_wait_frames",
)  # fmt: skip


class Timer:
    """Real and nominal seconds: nominal from the lab's fabric clock (so a
    change of k in the middle of a run is accounted for exactly), or real / k
    when the lab has no clock."""

    def __init__(self, lab: str | None, k: float):
        self.clock = clock.Clock.open(lab) if lab else None
        self.scale = Scale(k)

    def now(self) -> tuple[float, float]:
        if self.clock is not None:
            return self.clock.now()
        t = time.monotonic()
        return t, self.scale.nominal_s(t)

    def any_late_ns(self) -> int:
        """Real ns so far that at least one NIC engine of the lab ran behind
        (the clock's union of their late spans; 0 without a clock)."""
        return self.clock.reports()["any_late_ns"] if self.clock is not None else 0


def checked_run(
    link: Link, case: Case, barrier: str, timer: Timer | None = None
) -> tuple[int, float, float]:
    """--check all: fresh inputs, then every rank ready (a peer writes into
    this rank's buffers as soon as it runs), one run, timed, then its check.
    Returns (elements wrong, real and nominal seconds the run took; without
    a timer, nominal = real)."""
    timer = timer or Timer(None, 1.0)
    case.fill()
    link.barrier(barrier)
    t, n = timer.now()
    case.run()
    t1, n1 = timer.now()
    return case.wrong(), t1 - t, n1 - n


def run(link: Link, plan: dict, node: str, ranks_here: int = 1) -> None:
    """One rank's whole job, in a process of ranks_here ranks."""
    rec = _lab_record(plan["lab"])
    if rec is None:
        raise SystemExit(f"lab {plan['lab']!r} is gone")
    opts = Options(
        tcp_streams=plan.get("tcp_streams"),
        adaptive=plan.get("adaptive", False),
        roce_qps=plan.get("qps"),
        members=plan.get("members"),
        inc=plan.get("inc"),
        cc=plan.get("cc"),
        shared_engine=ranks_here > 1 and plan.get("shared_engine", True),
        # the run's seed: kernel TCP's source ports, the NICs' entropy values
        # (which paths a flow hashes onto)
        seed=plan.get("seed", 1),
    )
    t = open_transport(plan["transport"], plan["lab"], node, rec, opts, link.barrier)
    comm = Comm(t, plan["dtype"])
    # (the process's CPU so far: its start-up, imports and transport set-up)
    link.send(ready=t.describe(), cpu_s=cpu.self_s())
    item = reference.itemsize(plan["dtype"])
    timer = Timer(plan["lab"], float(rec["time_scale"]))
    np.seterr(all="ignore")  # timed runs reduce already-reduced data: overflow is fine
    try:
        for i, size in enumerate(plan["sizes"]):
            case = Case(
                comm, plan["collective"], size // item, dtype=plan["dtype"], op=plan["op"],
                algo=plan["algo"], root=plan["root"], uneven=plan["uneven"], seed=plan["seed"],
            )  # fmt: skip
            every = plan.get("check_all", False)
            case.fill()
            link.barrier(f"check-{i}")
            case.run()
            wrong = case.wrong() if plan["check"] or every else 0
            link.barrier(f"warm-{i}")
            for k in range(max(0, plan["warmup"] - 1)):
                if every:
                    wrong += checked_run(link, case, f"warm-{i}-{k}", timer)[0]
                else:
                    case.run()
            # the timed runs built now: after the barrier each only starts
            case.prepare(plan["iters"], PREPARED_OPS_PER_PROCESS // ranks_here)
            link.barrier(f"time-{i}")
            c0 = t.counters()
            # one reading for all the ranks of this process at this barrier
            waited0 = _process_waited_s(os.getpid(), token=f"time-{i}")
            late0 = timer.any_late_ns()
            t0, n0 = timer.now()
            ends, nends, nruns, run_s = [], [], [], 0.0
            for k in range(plan["iters"]):
                if every:
                    w, dt, dn = checked_run(link, case, f"time-{i}-{k}", timer)
                    wrong, run_s = wrong + w, run_s + dt
                    nruns.append(dn)
                else:
                    case.run()
                end, nend = timer.now()
                ends.append(end)
                nends.append(nend)
            t1, n1 = ends[-1], nends[-1]
            c1 = t.counters()
            engine = {k: c1[k] - c0.get(k, 0) for k in ENGINE_KEYS if k in c1}
            engine["waited_s"] = _process_waited_s(os.getpid()) - waited0
            engine["any_late_ns"] = timer.any_late_ns() - late0
            timing = {"t0": t0, "t1": t1, "ends": ends, "n0": n0, "n1": n1, "nends": nends}
            if every:  # the runs alone, their checks left out
                timing.update(run_s=run_s, nruns=nruns)
            link.send(result={"index": i, "size": size, "count": case.count, "wrong": wrong,
                              **timing, "engine": engine, "cpu_s": cpu.self_s(),
                              "pid": os.getpid()})  # fmt: skip
            del case
        # Nobody closes before everyone is through: a closing rank would leave
        # its peers' last acks (ethplus) or unread bytes (tcp) unanswered.
        link.barrier("close")
        link.send(done={"counters": t.counters(), "cpu_s": cpu.self_s(), "pid": os.getpid(),
                        "frames_cpu_s": _frame_threads_s(os.getpid()),
                        "peak_rss_bytes": _peak_rss_bytes()})  # fmt: skip
    finally:
        t.close()


def serve_rank(path: str, node: str, ranks_here: int = 1) -> int:
    """One rank, start to end, on the job's socket at path: 0, or 1 after
    telling the job why not."""
    link = Link(path)
    link.send(hello=node, pid=os.getpid())
    plan = link.recv()["plan"]
    try:
        run(link, plan, node, ranks_here)
    except (TransportError, OSError, ValueError) as e:
        link.send(error=str(e))
        return 1
    except Exception as e:  # noqa: BLE001 - a bug: report it whole, to the job
        link.send(error=f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        return 1
    return 0


def _hosted(path: str, node: str, ns: str, ranks_here: int, codes: dict[str, int]) -> None:
    """A thread's rank in a rank host: in its own namespace first."""
    codes[node] = 1
    try:
        core.netns_enter_thread(ns)
        codes[node] = serve_rank(path, node, ranks_here)
    except SystemExit as e:  # the job went away
        print(f"{node}: {e}", file=sys.stderr)
    except BaseException:  # noqa: BLE001 - into the log, for the job to quote
        traceback.print_exc()


NR_OPEN = "/proc/sys/fs/nr_open"  # the most open files the kernel lets a process have


def _open_files_as_many_as_allowed() -> None:
    """A rank host's ranks hold their sockets in one process (upn-512's 256
    ranks a process over kernel TCP: some 10,000 in halving-doubling, 523,264
    in an all-to-all with 4 streams a pair), past the soft limit many
    systems start a process with (1,024) and the hard limit many give
    (here 20,000).  Root (CAP_SYS_RESOURCE) may raise both to the kernel's
    most; otherwise the soft limit goes up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return
    try:
        with open(NR_OPEN) as f:
            most = max(int(f.read()), hard)
    except (OSError, ValueError):
        most = hard
    for lim in (most, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (lim, lim))
            return
        except (ValueError, OSError):  # not allowed (no CAP_SYS_RESOURCE): the next
            pass


def main(argv: list[str]) -> int:
    path, lab, *pairs = argv
    if not pairs or len(pairs) % 2:
        print("usage: worker SOCKET LAB NODE NS [NODE NS ...]", file=sys.stderr)
        return 2
    _open_files_as_many_as_allowed()
    stacks.on_signal()  # kill -USR1: the rank host's threads' stacks on its stderr
    ranks = list(zip(pairs[0::2], pairs[1::2], strict=True))
    cgroup.join(_lab_record(lab) or {"name": lab})  # its TCP handshakes' timeout (cgroup.py)
    core.netns_join(ranks[0][1])  # while single-threaded: setns applies to the calling thread
    if not parent.die_with_parent():
        return 1  # the job died before it could be told to
    if len(ranks) == 1:
        return serve_rank(path, ranks[0][0])
    codes: dict[str, int] = {}
    threads = [
        threading.Thread(
            target=_hosted, args=(path, node, ns, len(ranks), codes), name=f"rank-{node}"
        )
        for node, ns in ranks
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(codes.values())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
