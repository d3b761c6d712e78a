"""Where lab files and scenarios are found: the lab library.

A name (``erack-8x4``, ``ecmp-collision``) is looked up in the user's
directories first, then in what ethplus ships:

1. ``$ETHPLUS_LABS`` (one directory, or several separated by ``:``),
2. ``./netns-labs/`` in the working directory,
3. the package's own copy (``dataplane/netns_labs/`` in a wheel; in a
   checkout or an editable install, the checkout's ``netns-labs/``, which is
   the source the wheel copies).

Scenarios are the same directories' ``scenarios/``.  A path that exists is
taken as it is.  Lab files are data, checked key by key (labfile.py), so
reading them from the working directory runs nothing of the caller's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ENV = "ETHPLUS_LABS"
_PACKAGE = Path(__file__).resolve().parents[1]
# a wheel carries the labs inside the package; a checkout has them beside it
SHIPPED = next(
    (p for p in (_PACKAGE / "netns_labs", _PACKAGE.parent / "netns-labs") if p.is_dir()),
    _PACKAGE / "netns_labs",
)
KINDS = {"lab file": "", "scenario file": "scenarios"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def directories() -> list[tuple[Path, str]]:
    """The library's directories, first looked in first, each with how a
    message names it."""
    out = []
    for d in filter(None, os.environ.get(ENV, "").split(os.pathsep)):
        out.append((Path(d), f"${ENV} ({d})"))
    out.append((Path.cwd() / "netns-labs", "./netns-labs"))
    out.append((SHIPPED, f"the package ({SHIPPED})"))
    return out


def _kind_dirs(kind: str) -> list[tuple[Path, str]]:
    sub = KINDS[kind]
    return [(d / sub if sub else d, label) for d, label in directories()]


def files(kind: str = "lab file") -> dict[str, Path]:
    """Every name of this kind in the library, the first directory's file
    where two have the same name, sorted by name."""
    found: dict[str, Path] = {}
    for d, _ in _kind_dirs(kind):
        try:
            paths = sorted(d.glob("*.toml"))
        except OSError:
            continue
        for p in paths:
            found.setdefault(p.stem, p)
    return dict(sorted(found.items()))


def names(kind: str = "lab file") -> list[str]:
    return list(files(kind))


def find(file_or_name: str, kind: str = "lab file") -> Path | None:
    """A file path as it is, or a name (with or without .toml) found in the
    library, or None."""
    p = Path(file_or_name)
    if p.is_file():
        return p
    stem = file_or_name.removesuffix(".toml")
    if _NAME.fullmatch(stem):
        for d, _ in _kind_dirs(kind):
            cand = d / f"{stem}.toml"
            if cand.is_file():
                return cand
    return None


def looked_in(kind: str = "lab file") -> str:
    """Where find() looks, for a message."""
    return "; ".join(label for _, label in _kind_dirs(kind))
