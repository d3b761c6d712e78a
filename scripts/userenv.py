"""For the benchmarks' rootless figures: this checkout installed (a normal
install, not editable) into a virtual environment that an unprivileged user
may run, and running commands as that user."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _world_python() -> str:
    from dataplane.lab import userns

    return userns.python_for_users() or sys.exit(
        "no Python of this version that other users may run (Debian's python3 has one)"
    )


def make() -> Path:
    """A temporary directory (the caller removes it) with venv/ (this
    checkout in it, every user may run it) and home/ (the user's)."""
    base = Path(tempfile.mkdtemp(prefix="ethp-userenv-", dir="/tmp"))
    os.chmod(base, 0o755)
    subprocess.run([_world_python(), "-m", "venv", str(base / "venv")], check=True)
    r = subprocess.run([str(base / "venv/bin/python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", str(ROOT)], capture_output=True,
                       text=True)  # fmt: skip
    if r.returncode:
        sys.exit(f"installing {ROOT} for the user failed: {r.stderr[-2000:]}")
    subprocess.run(["chmod", "-R", "a+rX", str(base / "venv")], check=True)
    (base / "home").mkdir()
    os.chown(base / "home", NOBODY, NOBODY)
    return base


def as_user(base: Path, cmd: list[str]) -> list[str]:
    """cmd run as the unprivileged user, with only PATH and its HOME."""
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "env", "-i",
            f"PATH={PATH}", f"HOME={base / 'home'}", *cmd]  # fmt: skip
