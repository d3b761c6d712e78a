"""CPU time: of the whole machine, and of one process, measured exactly.

The scheduler tick's accounting (``/proc/stat``, ``/proc/PID/stat``) samples
what runs at each tick; work done in short bursts between ticks (a paced
sender, a switch thread waking per ring block, softirqs run on the way out
of a syscall) is largely missed there, and under partial load it showed the
kernel bridge forwarding a frame in half the CPU it takes saturated.  So:

- the machine: its CPUs' time minus the idle states' residency, which the
  cpuidle driver keeps in microseconds (``/sys/devices/system/cpu/cpuN/
  cpuidle/stateK/time``); the tick's counts only where there is no cpuidle.
  The driver adds an idle period when it ends, so a CPU idle at the reading
  would have its current period missed, and later counted inside the next
  interval (a measured TCP transfer showed a quarter of its real CPU time,
  once less than none).  Each CPU is therefore read from a thread moved
  onto it: being woken to run it ends the CPU's idle period first.
  Where there is no cpuidle driver (a VM whose CPUs idle in the
  hypervisor), the idle and iowait columns of ``/proc/stat``: a tick-less
  kernel fills them from its own idle clock, the current idle period
  included, in 10 ms units; the busy columns stay the tick's samples, so
  busy time is the elapsed time less idle, not the sum of those;
- a process: the sum of its threads' run time from ``schedstat``
  (nanoseconds); the tick's counts only where schedstat is missing.
"""

from __future__ import annotations

import glob
import os
import resource
import threading
import time

_CPUIDLE = "/sys/devices/system/cpu/cpu[0-9]*/cpuidle"


def _cpu_number(cpuidle_dir: str) -> int:
    return int(os.path.basename(os.path.dirname(cpuidle_dir))[3:])


def machine_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, on a monotonic clock.

    Only differences between two readings mean anything."""
    cpus = glob.glob(_CPUIDLE)
    return from_cpuidle(cpus) if cpus else from_proc_stat()


def source() -> str:
    """Where machine_s reads this machine's busy time, for reports."""
    if glob.glob(_CPUIDLE):
        return "cpuidle residency"
    return "/proc/stat idle clock (no cpuidle driver)"


def from_cpuidle(cpus: list[str]) -> tuple[float, float]:
    """machine_s from the cpuidle directories cpus (see the module)."""
    try:
        allowed = os.sched_getaffinity(0)
    except OSError:
        allowed = set()
    busy = total = 0.0
    try:
        for c in cpus:
            n = _cpu_number(c)
            if n in allowed:
                try:
                    os.sched_setaffinity(0, {n})  # now running there: not idle
                except OSError:
                    pass  # read it from here, a little behind
            idle_us = 0
            for t in glob.glob(f"{c}/state*/time"):
                with open(t) as f:
                    idle_us += int(f.read())
            now = time.monotonic()
            busy += now - idle_us / 1e6
            total += now
    finally:
        if allowed:
            os.sched_setaffinity(0, allowed)
    return busy, total


def from_proc_stat() -> tuple[float, float]:
    """machine_s from /proc/stat's idle and iowait per CPU (see the module)."""
    idle = cpus = 0
    with open("/proc/stat") as f:
        now = time.monotonic()
        for line in f:
            if not line.startswith("cpu"):
                break
            if line[3].isdigit():
                cols = line.split()
                idle += int(cols[4]) + int(cols[5])
                cpus += 1
    total = now * cpus
    return total - idle / os.sysconf("SC_CLK_TCK"), total


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (see machine_s)."""
    return machine_s()[0]


def _schedstat(task_dir: str) -> list[int]:
    """A thread's schedstat fields (run ns, wait ns, slices); [] once it has
    exited."""
    try:
        with open(f"{task_dir}/schedstat") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _schedstats(pid: int, named: bool = False):
    """(task dir, thread name or None, schedstat fields) of each thread of
    process pid that can still be read."""
    for d in glob.glob(f"/proc/{pid}/task/*"):
        name = None
        if named:
            try:
                with open(f"{d}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue  # a thread that just exited
        if fields := _schedstat(d):
            yield d, name, fields


def process_s(pid: int) -> float:
    """CPU seconds process pid has run, all threads; 0.0 if it is gone."""
    runs = [fields[0] for _, _, fields in _schedstats(pid)]
    if runs:
        return sum(runs) / 1e9
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def self_s() -> float:
    """CPU seconds this process has run, its threads that have exited
    included (process_s sees only those still running: a port's short-lived
    ring helpers were missing from the fabric's CPU); getrusage's total is
    the scheduler's exact run time, split into user and system by ticks."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


NIC_THREAD = "ethp-nic"  # a NIC engine's thread name (nic.c)
SWITCH_THREAD = "ethp-sw"  # a switch's thread name (switch.c)
# The threads that move frames: whatever runs them, a frame costs the same
# there (its sends, its receives, the kernel's veth path between them)
FRAME_THREADS = (NIC_THREAD, SWITCH_THREAD)


def frame_threads_s(pid: int) -> float:
    """CPU seconds process pid's frame threads (FRAME_THREADS: its NIC
    engines', its switches') have run; 0.0 if it has none or is gone."""
    return sum(f[0] for _, name, f in _schedstats(pid, named=True) if name in FRAME_THREADS) / 1e9


def threads_waited(pid: int) -> dict[int, tuple[str, int]]:
    """Process pid's threads: tid -> (name, ns spent runnable but not
    running: waiting on a run queue, ready, not scheduled), from schedstat."""
    return {
        int(d.rsplit("/", 1)[1]): (name, fields[1])
        for d, name, fields in _schedstats(pid, named=True)
        if len(fields) > 1
    }


def waited_s(a: dict[int, tuple[str, int]], b: dict[int, tuple[str, int]]) -> float:
    """Seconds the worst of a process's dataplane threads waited for a CPU
    between two threads_waited readings.  With NIC engines: the worst
    engine's thread (a rank's other threads run the application: posting,
    reducing, checking, which is real time as the reductions are, and 64
    ranks on two cores wait for a CPU there at any k); with kernel TCP: the
    worst thread, each of which moves one rank's data.  The worst, not the
    sum: a rank host's threads are many ranks, and the verdict is on the
    worst rank.  Thread by thread, so that an engine starting or stopping
    between the readings adds nothing."""
    nic = any(name == NIC_THREAD for name, _ in (*a.values(), *b.values()))
    return (
        max(
            (
                ns - a[tid][1]
                for tid, (name, ns) in b.items()
                if tid in a and (not nic or name == NIC_THREAD)
            ),
            default=0,
        )
        / 1e9
    )


class WaitWatch:
    """threads_waited of many processes, read several times a second (the
    governor's look at the ranks): their threads and names are looked up
    on refresh() only, and each read() then opens one file per thread that
    waited_s counts: a process's NIC engine threads where it has any, else
    all of its threads (a kernel TCP rank's).  A thread started since the
    last refresh is not seen until the next."""

    def __init__(self) -> None:
        self._threads: dict[int, dict[int, str]] = {}

    def refresh(self, pids: list[int]) -> None:
        self._threads = {}
        for pid in pids:
            names = {tid: name for tid, (name, _) in threads_waited(pid).items()}
            engines = {tid: name for tid, name in names.items() if name == NIC_THREAD}
            self._threads[pid] = engines or names

    def read(self) -> dict[int, dict[int, tuple[str, int]]]:
        """pid -> threads_waited(pid), of the threads that count."""
        out: dict[int, dict[int, tuple[str, int]]] = {}
        for pid, threads in self._threads.items():
            got = out[pid] = {}
            for tid, name in threads.items():
                if len(fields := _schedstat(f"/proc/{pid}/task/{tid}")) > 1:
                    got[tid] = (name, fields[1])  # else: a thread that has exited
        return out


class Shared:
    """A process-wide reading (fn(pid): every thread of pid read from /proc)
    that the threads asking for it together share.  With a token (a
    barrier's name): every caller with the last reading's token gets that
    reading, one who comes during it waits for it.  Without: a caller within
    twice the time the last reading took of its end gets it.  So a rank
    host's 256 ranks asking at one barrier cost one reading of its 257
    threads, not 256 (each 514 file reads: a third of upn-512's rank hosts'
    Python CPU).  Not by time alone at a barrier: there a reading, fought
    for the GIL by the ranks already running, took seconds (3.7 s on
    upn-512), the callers after it each read again, and its 256 ranks began
    their timed all-to-all up to 9.6 s apart.  A process of few threads
    reads in well under a millisecond, and shares next to nothing."""

    def __init__(self, fn):
        self.fn = fn
        self._lock = threading.Lock()
        # pid -> value, end, took, token
        self._last: dict[int, tuple[float, float, float, str | None]] = {}

    def __call__(self, pid: int, token: str | None = None) -> float:
        with self._lock:
            t0 = time.monotonic()
            last = self._last.get(pid)
            if last is not None and (
                last[3] == token if token is not None else t0 - last[1] <= 2 * last[2]
            ):
                return last[0]
            value = self.fn(pid)
            t1 = time.monotonic()
            self._last[pid] = (value, t1, t1 - t0, token)
            return value


def process_waited_s(pid: int) -> float:
    """Seconds process pid's dataplane threads (waited_s) have waited for a
    CPU so far."""
    now = threads_waited(pid)
    return waited_s({tid: (name, 0) for tid, (name, _) in now.items()}, now)
