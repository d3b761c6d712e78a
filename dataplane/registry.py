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
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dataplane.topology import LAB_TAG_CHARS

RUN_DIR = Path(os.environ.get("ETHPLUS_RUN_DIR", "/run/ethplus"))
NETNS_DIR = Path("/run/netns")
NS_PREFIX = "ethp-"
_TAG_ALPHABET = string.digits + string.ascii_lowercase


def labs_dir() -> Path:
    return RUN_DIR / "labs"


def lab_dir(name: str) -> Path:
    return labs_dir() / name


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

    def save(self) -> None:
        d = lab_dir(self.name)
        d.mkdir(parents=True, exist_ok=True)
        _write_json(d / "journal.json", self.__dict__)

    @classmethod
    def load(cls, name: str) -> Journal | None:
        try:
            data = json.loads((lab_dir(name) / "journal.json").read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_lab(name: str, data: dict) -> None:
    _write_json(lab_dir(name) / "lab.json", data)


def load_lab(name: str) -> dict | None:
    try:
        return json.loads((lab_dir(name) / "lab.json").read_text())
    except (OSError, ValueError):
        return None


def remove(name: str) -> None:
    shutil.rmtree(lab_dir(name), ignore_errors=True)


def names() -> list[str]:
    try:
        return sorted(p.name for p in labs_dir().iterdir() if p.is_dir())
    except FileNotFoundError:
        return []


def journals() -> list[Journal]:
    return [j for j in (Journal.load(n) for n in names()) if j is not None]


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serialise lab creation and removal across ethplus processes."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
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
