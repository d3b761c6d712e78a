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

The keeper is found by what the kernel says: a process of this uid running
the keeper module in a user namespace this uid owns (``find_keeper``), so
that labs are never orphaned when the state below is lost (logind deletes
``$XDG_RUNTIME_DIR`` at the user's last logout).  The state is a lock and
the keeper's pid and start time, in the user's runtime directory
(``$XDG_RUNTIME_DIR`` or ``/run/user/UID``) or else ``~/.cache/ethplus``;
each must be the user's own, mode 0700, and none is a predictable name in a
world-writable directory (another user could make it first).  Every command
holds ``keeper.lock`` shared while it runs; a command that finds no lab
left when it ends takes it exclusive and stops the keeper (so `lab down` of
the last lab, or `clean`, leaves nothing behind), unless another command is
running.  The keeper is signalled through a pidfd opened once its start
time was checked, never by a pid that may have been recycled.

What a user namespace cannot do is said once at `lab up` (rootless_notes).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dataplane.errors import EthplusError

KEEPER_MODULE = "dataplane.lab.userns"
START_TIMEOUT_S = 10.0


class UsernsError(EthplusError, RuntimeError):
    """The user namespace could not be made or joined."""


def _own_dir(d: Path, others_may: int = 0o055) -> bool:
    """d is a directory (not a link) of this user's that no other may do
    more with than others_may (default: read and enter, not write)."""
    try:
        st = os.lstat(d)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
        and not st.st_mode & 0o077 & ~others_may
    )  # fmt: skip


def _own_private_dir(d: Path) -> bool:
    return _own_dir(d, others_may=0)


def state_dir() -> Path:
    """The user's directory for ethplus's state (made 0700 if missing): in
    its runtime directory, else under its home; never a name another user
    could make first."""
    uid = os.getuid()
    for base in (os.environ.get("XDG_RUNTIME_DIR"), f"/run/user/{uid}"):
        if base and _own_private_dir(Path(base)):
            d = Path(base) / "ethplus"
            break
    else:
        home = Path(os.environ.get("HOME") or "/nonexistent")
        if not home.is_absolute() or not _own_dir(home):
            raise UsernsError(
                f"no private directory for ethplus's state: $XDG_RUNTIME_DIR is unset or not"
                f" a directory of uid {uid}'s own (mode 0700), /run/user/{uid} is not either,"
                f" and neither is $HOME ({home}); set XDG_RUNTIME_DIR to one"
            )
        d = home / ".cache" / "ethplus"
        with contextlib.suppress(FileExistsError):
            d.parent.mkdir(mode=0o700)
    with contextlib.suppress(FileExistsError):
        d.mkdir(mode=0o700)
    if not _own_private_dir(d):
        raise UsernsError(
            f"{d}: expected a directory of uid {uid}'s own, mode 0700 (not a link): remove it"
        )
    return d


_NS_GET_OWNER_UID = 0xB704  # ioctl on a namespace's fd: the uid that owns it


def _is_keeper(pid: int, start: int = 0) -> bool:
    """Is pid this user's keeper (and, given start, the one that started
    then): this uid's, running the keeper module, in a user namespace of
    its own that this uid owns?"""
    from dataplane.lab import registry

    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        if KEEPER_MODULE.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
            return False
        fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_ino == os.stat("/proc/self/ns/user").st_ino:
                return False  # not in a namespace of its own (yet)
            owner = struct.unpack("I", fcntl.ioctl(fd, _NS_GET_OWNER_UID, b"\0" * 4))[0]
        finally:
            os.close(fd)
    except OSError:
        return False
    return owner == os.getuid() and (not start or registry.process_start(pid) == start)


def find_keeper() -> int | None:
    """This user's running keeper, as the kernel shows it (the oldest, if
    there were ever two), whatever became of the state directory."""
    from dataplane.lab import registry

    found = [
        (registry.process_start(int(e.name)), int(e.name))
        for e in os.scandir("/proc")
        if e.name.isdigit() and _is_keeper(int(e.name))
    ]
    return min(found)[1] if found else None


def _keeper_pid(d: Path) -> int | None:
    """The running keeper of this user: the one its state names (pid and
    start time, checked), else the one the kernel shows (find_keeper,
    recorded again)."""
    try:
        pid, start = (int(x) for x in (d / "keeper.pid").read_text().split())
        if _is_keeper(pid, start):
            return pid
    except (OSError, ValueError):
        pass
    pid = find_keeper()
    if pid is not None:
        _record(d, pid)
    return pid


def _record(d: Path, pid: int) -> None:
    from dataplane.lab import registry

    tmp = d / f"keeper.pid.{os.getpid()}"
    tmp.write_text(f"{pid} {registry.process_start(pid)}\n")
    tmp.rename(d / "keeper.pid")


def _start(d: Path) -> int:
    """Start the keeper and wait for its namespaces, START_TIMEOUT_S at most
    (the caller holds the lock exclusive).  A keeper that fails says why:
    the kernel's refusal of the namespace, or its own last words."""
    r, w = os.pipe()
    err = tempfile.TemporaryFile()  # noqa: SIM115 - its stderr, read if it fails
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-m", KEEPER_MODULE, str(w)],
            cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=err, pass_fds=(w,), start_new_session=True,
        )  # fmt: skip
    finally:
        os.close(w)
    said, deadline = b"", time.monotonic() + START_TIMEOUT_S
    with os.fdopen(r, "rb", buffering=0) as f:
        while (left := deadline - time.monotonic()) > 0 and select.select([f], [], [], left)[0]:
            chunk = f.read(4096)
            if not chunk:
                break
            said += chunk
    said_text = said.decode(errors="replace").strip()
    if said_text != "ok":
        proc.kill()
        proc.wait()
        err.seek(0)
        last = (err.read().decode(errors="replace").strip().splitlines() or [""])[-1]
        err.close()
        if said_text.startswith(UNSHARE_REFUSED):
            raise UsernsError(
                f"cannot make a user namespace for labs without root: "
                f"{said_text[len(UNSHARE_REFUSED):]} (does this kernel allow unprivileged"
                " user namespaces? `unshare -Urn true` tells; or run ethplus as root)"
            )
        why = ("did not start within " f"{START_TIMEOUT_S:g} s" if not said_text and not last
               else f"failed: {said_text or last}")  # fmt: skip
        raise UsernsError(f"the keeper of this user's labs (python -m {KEEPER_MODULE}) {why}")
    err.close()
    _record(d, proc.pid)
    return proc.pid


# (lock fd, state directory fd, keeper pidfd) of this process's session:
# kept from before it joined, since inside the namespace its uid reads 0
# and a runtime directory under /run is out of sight
_session: tuple[int, int, int] | None = None
UNSHARE_REFUSED = "unshare: "  # the keeper's word when the kernel refused the namespaces


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
        except BaseException:
            os.close(fd)
            os.close(dir_fd)
            raise
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_SH)
    # from here on the keeper is held by a pidfd: its pid cannot be another
    # process's while the join checks it and the end signals it
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # it ended since it was found: nothing of it to hold
        pidfd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)  # (closed below)
        rc = -errno.ESRCH
    else:
        rc = core.lib.ethp_userns_join(pid) if _is_keeper(pid) else -errno.ESRCH
    if rc < 0:
        for f in (fd, dir_fd, pidfd):
            os.close(f)
        raise UsernsError(
            f"cannot join the user namespace of keeper {pid}: {os.strerror(-rc)}"
            + (" (it ended meanwhile: run the command again)" if rc == -errno.ESRCH else "")
        )
    _session = (fd, dir_fd, pidfd)


def leave_if_idle(labs_exist) -> None:
    """At the end of a command run inside the user namespace: stop the keeper
    if no lab is left (labs_exist() is false) and no other command runs."""
    global _session
    if _session is None:
        return
    (fd, dir_fd, pidfd), _session = _session, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    else:
        if not labs_exist():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            with contextlib.suppress(FileNotFoundError):
                os.unlink("keeper.pid", dir_fd=dir_fd)
    finally:
        for f in (fd, dir_fd, pidfd):
            os.close(f)


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
        f.write(b"ok\n" if rc == 0 else (UNSHARE_REFUSED + os.strerror(-rc)).encode())
    if rc < 0:
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(_keep(int(sys.argv[1])))
