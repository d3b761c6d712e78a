"""dataplane.cpu on this machine's real CPUs: busy time that a user's
CPU-per-frame and CPU-per-GB figures are built on."""

import os
import subprocess
import sys
import time

import pytest

from dataplane import cpu

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def _spin_on(n: int, seconds: float) -> None:
    subprocess.run(
        [sys.executable, "-c", SPIN.format(s=seconds)],
        preexec_fn=lambda: os.sched_setaffinity(0, {n}),
        check=True,
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_work_on_a_cpu_that_was_idle_at_the_first_reading_is_counted():
    # A CPU idle since before the interval began, then busy inside it: its
    # idle time before the interval must not be credited to the interval.
    other = max(os.sched_getaffinity(0) - {os.sched_getaffinity(0).pop()})
    for _ in range(3):
        time.sleep(0.5)  # every CPU idles, likely the other one throughout
        b0, t0 = cpu.machine_s()
        _spin_on(other, 0.4)
        b1, t1 = cpu.machine_s()
        assert 0.38 <= b1 - b0 <= t1 - t0, (b1 - b0, t1 - t0)
