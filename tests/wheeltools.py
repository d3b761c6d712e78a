"""Helpers for the tests of a normal install: the wheel `python -m build`
makes from this checkout (built once per session) and fresh virtual
environments it goes into."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

from dataplane.model import library

ROOT = library.SHIPPED.parent  # the checkout


def run(cmd, cwd, timeout=600, user: int | None = None, env: dict | None = None):
    """cmd, checked; as uid/gid `user` (setpriv) with only env, if given."""
    cmd = [str(c) for c in cmd]
    if user is not None:
        base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **(env or {})}
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups",
               "env", "-i", *(f"{k}={v}" for k, v in base.items()), *cmd]  # fmt: skip
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)}: {r.stdout[-1000:]} {r.stderr[-2000:]}"
    return r


def build(out: Path) -> Path:
    """An sdist, then the wheel built from that sdist alone, as a user
    would (`python -m build`); returns the wheel."""
    run([sys.executable, "-m", "build", "--outdir", out, ROOT], out)
    (wheel,) = out.glob("ethplus-*.whl")
    assert len(list(out.glob("ethplus-*.tar.gz"))) == 1
    return wheel


def world_python() -> str:
    """A Python of this version that the user of the tests without root may run."""
    from dataplane.lab import userns

    py = userns.python_for_users()
    assert py, f"no Python {sys.version_info[0]}.{sys.version_info[1]} that other users may run"
    return py


def install(wheel: Path, env: Path, python: str = sys.executable) -> Path:
    """A fresh virtual environment with the wheel installed; returns its bin/."""
    if python == sys.executable:
        venv.create(env, with_pip=True)
    else:
        run([python, "-m", "venv", env], env.parent)
    run([env / "bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
         wheel], env.parent)  # fmt: skip
    return env / "bin"
