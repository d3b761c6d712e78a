"""dataplane.lab.cpu on this machine's real CPUs: busy time that a user's
CPU-per-frame and CPU-per-GB figures are built on."""

import glob
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import together

from dataplane.lab import cpu

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def _spin_on(n: int, seconds: float) -> None:
    subprocess.run(
        [sys.executable, "-c", SPIN.format(s=seconds)],
        preexec_fn=lambda: os.sched_setaffinity(0, {n}),
        check=True,
    )


CPUIDLE = glob.glob(cpu._CPUIDLE)
# Both sources of the machine's busy time, where this machine has them:
# the cpuidle driver's residency (bare metal, most VMs) and /proc/stat's
# tick-less idle clock (every Linux; the only one on a VM without cpuidle).
SOURCES = [
    pytest.param(lambda: cpu.from_cpuidle(CPUIDLE), id="cpuidle",
                 marks=pytest.mark.skipif(not CPUIDLE, reason="no cpuidle driver here")),
    pytest.param(cpu.from_proc_stat, id="proc-stat"),
]  # fmt: skip


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.parametrize("machine_s", SOURCES)
def test_work_on_a_cpu_that_was_idle_at_the_first_reading_is_counted(machine_s):
    # A CPU idle since before the interval began, then busy inside it: its
    # idle time before the interval must not be credited to the interval.
    other = max(os.sched_getaffinity(0) - {os.sched_getaffinity(0).pop()})
    for _ in range(3):
        time.sleep(0.5)  # every CPU idles, likely the other one throughout
        b0, t0 = machine_s()
        _spin_on(other, 0.4)
        b1, t1 = machine_s()
        assert 0.38 <= b1 - b0 <= t1 - t0, (b1 - b0, t1 - t0)


BURSTS = (
    "import time\nend = time.monotonic() + 1.5\n"
    "while time.monotonic() < end:\n"
    "    t = time.monotonic() + 0.0002\n"
    "    while time.monotonic() < t: pass\n"
    "    time.sleep(0.0008)\n"
    "print(time.process_time())\n"
)


@pytest.mark.parametrize("machine_s", SOURCES)
def test_short_bursts_are_counted_as_the_process_itself_counts_them(machine_s):
    # A paced sender's pattern: 0.2 ms of work, then a sleep, for 1.5 s.
    # The machine's busy time over it is at least the CPU time the process
    # ran (its scheduler's exact clock), plus little else on a quiet machine.
    b0, _ = machine_s()
    out = subprocess.run([sys.executable, "-c", BURSTS], capture_output=True, text=True, check=True)
    b1, _ = machine_s()
    own_s = float(out.stdout)
    assert 0.9 * own_s <= b1 - b0 <= own_s + 0.5, (b1 - b0, own_s)


def test_a_ranks_cpu_wait_is_its_dataplane_threads_thread_by_thread():
    """A NIC rank's wait is its engine thread's (the rest is the application);
    a rank without one (kernel TCP: a thread each) its thread's; a process
    of many ranks (a rank host) the worst rank's, not their sum; a thread
    that appears or goes between two readings adds nothing (an engine
    closing at a job's end once showed as a rank waiting 196% of the time)."""
    app, eng = (1, 2)
    a = {app: ("python", 5_000), eng: (cpu.NIC_THREAD, 10_000)}
    b = {app: ("python", 9_000_000), eng: (cpu.NIC_THREAD, 30_000)}
    assert cpu.waited_s(a, b) == pytest.approx(20_000 / 1e9)
    tcp_a, tcp_b = (
        {app: ("python", 5_000), 3: ("python", 0)},
        {app: ("python", 45_000), 3: ("python", 7)},
    )
    assert cpu.waited_s(tcp_a, tcp_b) == pytest.approx(40_000 / 1e9)
    host_a = {**a, 4: (cpu.NIC_THREAD, 0)}
    host_b = {**b, 4: (cpu.NIC_THREAD, 15_000)}  # a second rank's engine, waited less
    assert cpu.waited_s(host_a, host_b) == pytest.approx(20_000 / 1e9)
    closed = {app: ("python", 9_000_000)}  # the engine exited: the app's wait is not counted
    assert cpu.waited_s(b, closed) == 0.0
    started = {app: ("python", 10**9), eng: (cpu.NIC_THREAD, 10**9)}
    assert cpu.waited_s({app: ("python", 0)}, started) == 0.0
    own = cpu.threads_waited(os.getpid())
    assert own and all(isinstance(ns, int) and ns >= 0 for _, ns in own.values())


def _named_thread(name: bytes, ready, stop) -> None:
    """A thread of this process whose kernel name is name (as nic.c names
    its engine threads), until stop is set."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(15, name, 0, 0, 0)  # PR_SET_NAME
    ready.set()
    stop.wait()


def test_the_governors_watch_reads_the_engine_threads_and_sees_them_wait():
    """The governor reads its ranks' waits several times a second: a process
    with NIC engine threads is read for those threads only, one without for
    all of its threads (kernel TCP), with the figures threads_waited gives."""

    me = os.getpid()
    watch = cpu.WaitWatch()
    watch.refresh([me])
    assert set(watch.read()[me]) == set(cpu.threads_waited(me))  # no engine: every thread
    ready, stop = threading.Event(), threading.Event()
    t = threading.Thread(target=_named_thread, args=(cpu.NIC_THREAD.encode(), ready, stop))
    t.start()
    try:
        ready.wait(5)
        watch.refresh([me])
        first = watch.read()[me]
        assert [name for name, _ in first.values()] == [cpu.NIC_THREAD]
        (tid,) = first
        assert cpu.threads_waited(me)[tid][1] >= first[tid][1]
    finally:
        stop.set()
        t.join()
    deadline = time.monotonic() + 5  # the OS thread ends a moment after join returns
    while os.path.exists(f"/proc/{me}/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.read()[me] == {}  # the engine exited: nothing left to read
    watch.refresh([me, 2**22 + 1])  # and a process that is gone
    assert set(watch.read()) == {me, 2**22 + 1} and watch.read()[2**22 + 1] == {}


def test_threads_asking_together_share_one_reading_of_a_process():
    """A rank host's ranks read the process's threads at the same barrier:
    one reading serves all who ask while it is fresh; a later call reads
    again."""
    calls = []

    def slow_reading(pid: int) -> float:
        calls.append(pid)
        time.sleep(0.1)  # a reading of 257 threads' /proc files takes milliseconds
        return float(len(calls))

    shared = cpu.Shared(slow_reading)
    assert together(32, lambda: shared(7)) == [1.0] * 32 and calls == [7]
    assert shared(8) == 2.0, "another process: its own reading"
    time.sleep(0.6)  # well past twice the reading's time (even if its sleep overran): stale
    assert shared(7) == 3.0 and calls == [7, 8, 7]


def test_ranks_at_one_barrier_share_its_reading_however_late_they_come():
    """With the barrier's name as token, a rank that comes long after the
    reading (its thread waited seconds for the GIL on upn-512) still gets
    it, and does not read all the process's threads again; the next barrier
    reads afresh."""
    calls = []

    def reading(pid: int) -> float:
        calls.append(pid)
        return float(len(calls))

    shared = cpu.Shared(reading)
    assert together(16, lambda: shared(7, token="time-0")) == [1.0] * 16
    time.sleep(0.2)  # far past twice the reading's time
    assert shared(7, token="time-0") == 1.0 and calls == [7]
    assert together(16, lambda: shared(7, token="time-1")) == [2.0] * 16 and calls == [7, 7]
