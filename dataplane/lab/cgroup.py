"""A lab's cgroup: where the processes ethplus starts in a lab's namespaces
live, so that kernel TCP's handshake timeout follows k.

Linux sends a SYN (or a SYN-ACK) again after a fixed second of real time.
At a large k a lab's handshake takes longer than that in real time (upn-512
at k 409,600: 0.8 s before any queue), so every SYN went out again, and
again, and the fabric carried the copies.  Only a BPF sock_ops program can
give a connection another initial timeout, and it runs for the sockets of
the processes of the cgroup (v2) it is attached to.  `lab up` makes one
cgroup a lab, ``ethp-<lab>`` at the root of the cgroup v2 hierarchy (a lab,
like its namespaces, belongs to the machine, not to whoever brought it up),
and attaches csrc/sockops.c's program to it: a connection made or accepted
there waits the kernel's largest RTO (120 s real) before its SYN goes again,
as a 1 s timeout would at any k over 120.  The processes ethplus starts in a
lab (a job's rank hosts, `ethplus run`'s ranks and store, `ethplus exec`'s
command) join it before they enter a namespace (which hides the cgroup
file system behind a /sys of its own).  A socket opened by any other
process, or a lab whose machine has no cgroup v2 or no BPF (or no root:
`ethplus` without root), keeps Linux's second; the lab's record says
which (``tcp_syn_rto``) and so do reports' TCP notes.

The processes themselves never leave the cgroup they were started in (the
caller's, with whatever memory and CPU limits it set: a systemd unit, a
container, a batch job's allocation): each makes one of its own below it,
``ethp-<lab>.job<pid>``, attaches the program there and moves in (`join`).
So a lab's processes stay within their caller's limits.  A job cgroup is
removed once its process is gone by the next one made beside it, or by
`lab down` (those below its own cgroup, what is left in them killed); the
lab's own cgroup at the root (made by `lab up`, the proof that this
machine can attach the program) is removed by `lab down`, which kills
whatever is still in it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from dataplane.errors import EthplusError
from dataplane.lab import registry, userns

PREFIX = registry.NS_PREFIX  # "ethp-", as every name ethplus makes
REMOVE_WAIT_S = 5.0
SYN_RTO_MAX = "max"  # the record's tcp_syn_rto when the program is attached
SYN_RTO_LINUX = "the lab's [tcp] syn_rto is linux"  # ... when the lab asked for none


class CgroupError(EthplusError, RuntimeError):
    """A process could not join its lab's cgroup."""


def _v2_root() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (the first such mount), or None."""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    return fields[1].replace("\\040", " ")
    except OSError:
        pass
    return None


def lab_path(name: str) -> str | None:
    """The cgroup of lab name (which may not exist), or None without cgroup
    v2, or for a user's rootless lab: those have none, so the ``ethp-NAME``
    cgroups are root's labs' alone and a user's lab of the same name never
    touches one."""
    root = None if userns.rootless() else _v2_root()
    return None if root is None else os.path.join(root, PREFIX + registry.check_name(name))


def create(name: str) -> str:
    """Make lab name's cgroup and attach the SYN timeout's program to it.
    Returns SYN_RTO_MAX, or why a lab's connections keep Linux's second."""
    from dataplane.lab import core

    path = lab_path(name)
    if path is None:
        return "no cgroup v2 hierarchy is mounted"
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass  # a leftover of this lab's name that clean did not see: reused
    except OSError as exc:
        return f"cannot make cgroup {path}: {exc.strerror}"
    rc = core.sockops_syn_rto_max(path)
    if rc:
        remove(name)
        return f"cannot attach the BPF sock_ops program to {path}: {os.strerror(rc)}"
    return SYN_RTO_MAX


def own_path() -> str | None:
    """This process's cgroup (v2) directory, or None."""
    root = _v2_root()
    try:
        with open("/proc/self/cgroup") as f:
            rel = next(line[3:].strip() for line in f if line.startswith("0::"))
    except (OSError, StopIteration):
        return None
    if root is None or not rel.startswith("/") or "/.." in rel:
        return None
    return os.path.normpath(root + rel)


JOB_MARK = ".job"  # never in a lab name: a job cgroup is no lab's (strays)


def _job_name(lab: str, pid: int) -> str:
    return f"{PREFIX}{lab}{JOB_MARK}{pid}"


def join(rec: dict) -> None:
    """Move the calling process (all its threads) into a cgroup of its own
    below the one it runs in (the caller's limits hold), with the lab's SYN
    timeout program attached, if the lab asked for it (its record says
    tcp_syn_rto "max").  Call it before entering a namespace, while the
    process is single-threaded.  Job cgroups beside it whose process is
    gone are removed first."""
    name = rec["name"]
    if rec.get("tcp_syn_rto") != SYN_RTO_MAX or lab_path(name) is None:
        return
    from dataplane.lab import core

    here = own_path()
    if here is None:
        raise CgroupError(f"cannot join lab {name!r}'s cgroup: this process's cgroup is unknown")
    _remove_spent_jobs(here)
    path = os.path.join(here, _job_name(name, os.getpid()))
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
        rc = core.sockops_syn_rto_max(path)
        if rc:
            raise OSError(rc, os.strerror(rc))
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write("0")
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        raise CgroupError(f"cannot join lab {name!r}'s cgroup {path}: {exc.strerror}") from None


def _remove_spent_jobs(parent: str) -> None:
    """The job cgroups in parent whose process is gone and that hold nothing."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for e in entries:
        _lab, sep, pid = e.name.rpartition(JOB_MARK)
        if not (e.name.startswith(PREFIX) and sep and pid.isdigit() and e.is_dir()):
            continue
        if not os.path.exists(f"/proc/{pid}") and not _populated(e.path):
            with contextlib.suppress(OSError):
                os.rmdir(e.path)


def _populated(path: str) -> bool:
    try:
        with open(os.path.join(path, "cgroup.events")) as f:
            return any(line.split() == ["populated", "1"] for line in f)
    except OSError:
        return False


def remove(name: str) -> None:
    """Kill what is left in lab name's cgroup and remove it, and so the job
    cgroups of its processes below this process's own cgroup (those below
    another caller's go when the next job cgroup beside them is made)."""
    path = lab_path(name)
    here = own_path()
    if path is None:
        return
    jobs = []
    if here is not None and os.path.isdir(here):
        mark = f"{PREFIX}{name}{JOB_MARK}"
        jobs = [e.path for e in os.scandir(here)
                if e.name.startswith(mark) and e.name[len(mark):].isdigit()]  # fmt: skip
    for p in (*jobs, path):
        _kill_and_remove(p)


def _kill_and_remove(path: str) -> None:
    if not os.path.isdir(path):
        return
    pids = _pids(path)
    if pids:
        try:  # all at once, forks included (Linux 5.14 and later)
            with open(os.path.join(path, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + REMOVE_WAIT_S
        while _populated(path) and time.monotonic() < deadline:
            time.sleep(0.02)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


def _pids(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(line) for line in f if line.strip()]
    except OSError:
        return []


def strays(only: list[str] | None = None) -> list[str]:
    """The labs (of only, or any) whose cgroup ethplus made (its program is
    attached) but that no lab records: a crash's leftovers."""
    from dataplane.lab import core
    from dataplane.model.topology import valid_name

    root = None if userns.rootless() else _v2_root()
    if root is None or not os.path.isdir(root):
        return []
    out = []
    for entry in os.scandir(root):
        lab = entry.name[len(PREFIX) :]
        if (
            entry.name.startswith(PREFIX)
            and valid_name(lab)
            and (only is None or lab in only)
            and not registry.lab_dir(lab).exists()
            and core.sockops_is_ours(entry.path)
        ):
            out.append(lab)
    return out
