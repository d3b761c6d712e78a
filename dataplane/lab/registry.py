"""Where running labs are recorded: one directory per lab under /run/ethplus.

``/run/ethplus/labs/NAME/journal.json`` is written (and fsynced) before a
single kernel object is made, listing every namespace the lab will create and
the lab's interface tag.  It is what ``lab down`` and ``clean`` trust, so a
controller killed at any point leaves a record of exactly what it may have
made.  ``lab.json`` beside it holds the realised lab for ``show``.  Both live
on tmpfs, like /run/netns, so a reboot clears them together.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dataplane.errors import EthplusError
from dataplane.model.topology import LAB_NAME_EXPECTED, LAB_TAG_CHARS, NODE_NAME_RE, valid_name

# Fixed paths: code run as root takes no directory from the caller's environment.
RUN_DIR = Path("/run/ethplus")
NETNS_DIR = Path("/run/netns")
NS_PREFIX = "ethp-"
_TAG_ALPHABET = string.digits + string.ascii_lowercase
STATUSES = ("creating", "up", "failed", "deleting")


class RegistryError(EthplusError, ValueError):
    """A lab name or record that ethplus refuses to act on; the message says which."""


def check_name(name: object) -> str:
    if not valid_name(name):
        raise RegistryError(f"lab name {name!r}: expected {LAB_NAME_EXPECTED}")
    return name  # type: ignore[return-value]


def check_run_dir(path: Path = RUN_DIR) -> None:
    """Refuse a run directory (or its labs/) that root does not own, or that
    others may write: whoever could would control what root tears down."""
    for d in (path, path / "labs"):
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise RegistryError(
                f"{d} is not a directory owned by root and writable by root only "
                f"(owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}): remove it"
            )


def labs_dir() -> Path:
    return RUN_DIR / "labs"


def lab_dir(name: str) -> Path:
    return labs_dir() / check_name(name)


def ns_name(lab: str, node: str) -> str:
    return f"{NS_PREFIX}{lab}-{node}"


def ns_path(lab: str, node: str) -> str:
    return str(NETNS_DIR / ns_name(lab, node))


def tag_for(slot: int) -> str:
    base = len(_TAG_ALPHABET)
    chars = []
    for _ in range(LAB_TAG_CHARS):
        slot, d = divmod(slot, base)
        chars.append(_TAG_ALPHABET[d])
    return "".join(reversed(chars))


MAX_LABS = len(_TAG_ALPHABET) ** LAB_TAG_CHARS


@dataclass
class Journal:
    name: str
    tag: str
    slot: int
    status: str  # creating | up | failed | deleting
    namespaces: list[str]  # full paths
    pid: int
    file: str = ""
    fabric_pid: int = 0
    pid_start: int = 0  # the creator's start time (/proc/PID/stat), against pid reuse
    fabric_start: int = 0  # the fabric's start time (0: a journal from before it was kept)

    def save(self) -> None:
        d = lab_dir(self.name)
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(d, 0o755)  # whatever the caller's umask: root's to write
        _write_json(d / "journal.json", self.__dict__)

    @classmethod
    def load(cls, name: str) -> Journal | None:
        """The lab's journal; None if there is none (or it is unreadable, as
        a crash mid-write leaves it).  RegistryError if it is not one
        ethplus would have written for this name."""
        path = lab_dir(name) / "journal.json"
        check_run_dir()
        try:
            data = json.loads(path.read_text())
            j = cls(**data)
        except (OSError, ValueError, TypeError):
            return None
        why = j.problem(name)
        if why:
            raise RegistryError(f"{path}: {why}; ethplus did not write it and will not act on it")
        return j

    def problem(self, name: str) -> str | None:
        """Why this journal is not one ethplus would have made for lab name."""
        if self.name != name:
            return f"it names lab {self.name!r}"
        if not isinstance(self.slot, int) or not 0 <= self.slot < MAX_LABS:
            return f"slot {self.slot!r} is out of range"
        if self.tag != tag_for(self.slot):
            return f"tag {self.tag!r} is not slot {self.slot}'s"
        if self.status not in STATUSES:
            return f"status {self.status!r} is unknown"
        for f in ("pid", "fabric_pid", "pid_start", "fabric_start"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                return f"{f} {v!r} is not a process id"
        if not isinstance(self.namespaces, list):
            return "namespaces is not a list"
        prefix = str(NETNS_DIR / ns_name(name, ""))
        for ns in self.namespaces:
            node = ns[len(prefix) :] if isinstance(ns, str) and ns.startswith(prefix) else ""
            if NODE_NAME_RE.fullmatch(node) is None:
                return f"namespace {ns!r} is not one of lab {name!r} ({prefix}NODE)"
        return None


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # never write through what somebody left there
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with open(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_lab(name: str, data: dict) -> None:
    _write_json(lab_dir(name) / "lab.json", data)


def load_lab(name: str) -> dict | None:
    if not valid_name(name):
        return None
    try:
        return json.loads((lab_dir(name) / "lab.json").read_text())
    except (OSError, ValueError):
        return None


def remove(name: str) -> None:
    shutil.rmtree(lab_dir(name), ignore_errors=True)


def names() -> list[str]:
    """The recorded labs (directories under labs/ whose names are valid)."""
    try:
        return sorted(p.name for p in labs_dir().iterdir() if p.is_dir() and valid_name(p.name))
    except FileNotFoundError:
        return []


def journals() -> list[Journal]:
    """Every readable journal ethplus would have written (others are skipped)."""
    out = []
    for n in names():
        with contextlib.suppress(RegistryError):
            j = Journal.load(n)
            if j is not None:
                out.append(j)
    return out


def process_start(pid: int) -> int:
    """pid's start time in clock ticks since boot, or 0 if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return 0
    # field 22, counted after the command name (which may hold spaces and parens)
    return int(stat_line.rsplit(b")", 1)[1].split()[19])


def process_alive(pid: int, start: int) -> bool:
    """Is pid still the process that started at start (not a recycled pid)?"""
    return pid > 0 and start > 0 and process_start(pid) == start


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serialise lab creation and removal across ethplus processes."""
    os.makedirs(RUN_DIR, mode=0o755, exist_ok=True)
    os.makedirs(labs_dir(), mode=0o755, exist_ok=True)
    check_run_dir()
    fd = os.open(RUN_DIR / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def free_slot() -> int | None:
    """The lowest interface-tag slot no recorded lab uses (call under locked())."""
    used = {j.slot for j in journals()}
    return next((s for s in range(MAX_LABS) if s not in used), None)
