"""Labs without root: the user namespace ethplus keeps for a user.

Run by a user other than root, ethplus works inside a user namespace of
its own, where it is root over what it makes.  A small keeper process holds
that namespace, with a mount namespace (a private tmpfs on /run, so that
/run/netns and /run/ethplus are this user's alone) and a network namespace
(its home: only a loopback, never routed anywhere).  Every ethplus command
of the user joins the keeper's three namespaces before it does anything
else, and everything the labs run (switches, NIC engines, workers, iperf3,
`exec`) lives under them.  Root's labs and a user's cannot see or remove
each other: neither sees the other's /run.

The keeper's pid is in the user's runtime directory (``$XDG_RUNTIME_DIR``,
``/run/user/UID``, or ``/tmp/ethplus-UID``; each must be the user's own,
mode 0700), ``ethplus/keeper.pid``, next to ``keeper.lock``: every command
holds that lock shared while it runs; a command that finds no lab left when
it ends takes it exclusive and stops the keeper (so `lab down` of the last
lab, or `clean`, leaves nothing behind), unless another command is running.

What a user namespace cannot do is said once at `lab up` (rootless_notes).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from dataplane.errors import EthplusError

KEEPER_MODULE = "dataplane.lab.userns"
START_TIMEOUT_S = 10.0


class UsernsError(EthplusError, RuntimeError):
    """The user namespace could not be made or joined."""


def _own_private_dir(d: Path) -> bool:
    try:
        st = os.lstat(d)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def state_dir() -> Path:
    """The user's runtime directory for ethplus (made 0700 if missing)."""
    uid = os.getuid()
    for base in (os.environ.get("XDG_RUNTIME_DIR"), f"/run/user/{uid}"):
        if base and _own_private_dir(Path(base)):
            d = Path(base) / "ethplus"
            break
    else:
        d = Path(f"/tmp/ethplus-{uid}")
    with contextlib.suppress(FileExistsError):
        d.mkdir(mode=0o700)
    if not _own_private_dir(d):
        raise UsernsError(
            f"{d}: expected a directory of uid {uid}'s own, mode 0700 (not a link): remove it"
        )
    return d


def _keeper_pid(d: Path) -> int | None:
    """The running keeper of this user, from its pid file, checked: alive,
    this user's, running the keeper module."""
    try:
        pid = int((d / "keeper.pid").read_text())
        st = os.stat(f"/proc/{pid}")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if st.st_uid != os.getuid() or KEEPER_MODULE.encode() not in argv:
        return None
    return pid


def _start(d: Path) -> int:
    """Start the keeper and wait for its namespaces (the caller holds the
    lock exclusive)."""
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-m", KEEPER_MODULE, str(w)],
            cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(w,), start_new_session=True,
        )  # fmt: skip
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode(errors="replace").strip()
    if said != "ok":
        proc.kill()
        proc.wait()
        raise UsernsError(
            f"cannot make a user namespace for labs without root: {said or 'the keeper died'}"
            " (does this kernel allow unprivileged user namespaces?"
            " `unshare -Urn true` tells; or run ethplus as root)"
        )
    tmp = d / f"keeper.pid.{os.getpid()}"
    tmp.write_text(str(proc.pid))
    tmp.rename(d / "keeper.pid")
    return proc.pid


# (lock fd, state directory fd, keeper pid) of this process's session: kept
# from before it joined, since inside the namespace its uid reads 0 and a
# runtime directory under /run is out of sight
_session: tuple[int, int, int] | None = None


def enter() -> None:
    """Join this user's keeper (started if there is none).  Call before any
    thread starts: the kernel lets only a single-threaded process join."""
    global _session
    if os.geteuid() == 0 or _session is not None:
        return
    from dataplane.lab import core

    with open("/proc/self/status") as f:
        threads = next(int(x.split()[1]) for x in f if x.startswith("Threads:"))
    if threads != 1:
        raise UsernsError(
            "without root, a lab command joins this user's namespace before any thread"
            " starts: run it through the `ethplus` command (cli/entry.py)"
        )
    d = state_dir()
    dir_fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fd = os.open("keeper.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    fcntl.flock(fd, fcntl.LOCK_SH)  # shared while it runs: others may run too
    pid = _keeper_pid(d)
    if pid is None:  # none yet: start one, alone (exclusive), then back to shared
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            pid = _keeper_pid(d) or _start(d)
        finally:
            fcntl.flock(fd, fcntl.LOCK_SH)
    rc = core.lib.ethp_userns_join(pid)
    if rc < 0:
        os.close(fd)
        os.close(dir_fd)
        raise UsernsError(f"cannot join the user namespace of keeper {pid}: {os.strerror(-rc)}")
    _session = (fd, dir_fd, pid)


def leave_if_idle(labs_exist) -> None:
    """At the end of a command run inside the user namespace: stop the keeper
    if no lab is left (labs_exist() is false) and no other command runs."""
    global _session
    if _session is None:
        return
    (fd, dir_fd, pid), _session = _session, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    else:
        if not labs_exist():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(FileNotFoundError):
                os.unlink("keeper.pid", dir_fd=dir_fd)
    finally:
        os.close(fd)
        os.close(dir_fd)


def rootless() -> bool:
    """Does this process run inside a user namespace ethplus keeps?"""
    return _session is not None


def rootless_notes() -> list[str]:
    """What a lab cannot do without root, and what it changes in results."""
    notes = [
        "running without root, in a user namespace of this user's: its labs and root's"
        " do not see each other",
        "the fabric cannot raise its CPU priority (nice -10 needs root over the host):"
        " on a busy machine its switches fall behind sooner, and the governor raises k"
        " sooner (more real time per run; nominal results are unchanged)",
    ]
    caps = {}
    for key in ("rmem_max", "wmem_max"):
        with contextlib.suppress(OSError, ValueError):
            caps[key] = int(Path(f"/proc/sys/net/core/{key}").read_text())
    if caps:
        notes.append(
            "socket buffers cannot be forced past the host's net.core.rmem_max/wmem_max ("
            + ", ".join(f"{k} {v} B" for k, v in caps.items())
            + "): a switch port's frame-by-frame socket holds fewer frames while its RX ring"
            " is down; a burst beyond it is dropped and counted (rx drops)"
        )
    return notes


def python_for_users() -> str | None:
    """A Python of this one's version that every user may run (this one may
    sit under a home only its owner can enter): for a user's own virtual
    environment, e.g. in the tests without root.  None if there is none."""
    v = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for cand in (sys.executable, f"/usr/bin/python{v}"):
        p = Path(os.path.realpath(cand))
        if p.exists() and all(os.stat(a).st_mode & 0o001 for a in (p, *p.parents)):
            return str(p)
    return None


def _keep(fd: int) -> int:
    from dataplane.lab import core

    rc = core.lib.ethp_userns_unshare(os.getuid(), os.getgid())
    with os.fdopen(fd, "wb") as f:
        f.write(b"ok\n" if rc == 0 else os.strerror(-rc).encode())
    if rc < 0:
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(_keep(int(sys.argv[1])))
