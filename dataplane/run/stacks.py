"""A rank's Python stacks on demand: ``kill -USR1 PID`` of a rank's process
writes every thread's stack to its stderr (an ``ethplus run`` rank's:
passed on with the rank's prefix; a bench's rank host's: its log): what a
job that seems stuck is waiting in, without a debugger (py-spy dump shows
the same where it is installed)."""

from __future__ import annotations

import faulthandler
import signal

SIGNAL = signal.SIGUSR1


def on_signal() -> None:
    """Dump the stacks on SIGNAL from now on, unless the program has a
    handler of its own for it (from the main thread: signals' rule)."""
    if signal.getsignal(SIGNAL) == signal.SIG_DFL:
        faulthandler.register(SIGNAL, all_threads=True)
