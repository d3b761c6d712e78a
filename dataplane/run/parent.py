"""A process ethplus starts for a job (a rank, a rank host, the run's store)
dies with the process that started it: PR_SET_PDEATHSIG, then a check that
its parent is still the one that started it (it may have died before the
prctl).  The check compares with that parent's pid, told in the
environment, not with 1: under a subreaper (systemd --user, a container's
init, tini) an orphan is adopted by it, not by init."""

from __future__ import annotations

import ctypes
import os
import signal

ENV_PARENT_PID = "ETHPLUS_PARENT_PID"
PR_SET_PDEATHSIG = 1


def child_environ(env: dict[str, str] | None = None) -> dict[str, str]:
    """env (the caller's own if None) for a child that dies with this process."""
    return {**(os.environ if env is None else env), ENV_PARENT_PID: str(os.getpid())}


def die_with_parent() -> bool:
    """Arrange to be killed when the parent dies; False if it already has
    (this process's parent is no longer the one that started it)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    told = os.environ.pop(ENV_PARENT_PID, "")
    expected = int(told) if told.isdigit() else 0
    return os.getppid() == expected if expected else os.getppid() != 1
