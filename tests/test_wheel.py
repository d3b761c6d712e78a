"""A normal install works anywhere: the wheel `python -m build` makes,
installed into a fresh virtual environment, runs a lab by name from an
empty directory (the labs and scenarios are package data), with nothing of
the checkout on its path."""

import subprocess
import sys
import venv

import pytest
from conftest import RUN_ID, lab_namespaces

from dataplane.model import library

pytestmark = pytest.mark.root

ROOT = library.SHIPPED.parent  # the checkout


def _run(cmd, cwd, timeout=600):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}: {r.stderr[-2000:]}"
    return r


def test_the_wheel_runs_a_lab_by_name_from_an_empty_directory(tmp_path):
    dist, env, empty = tmp_path / "dist", tmp_path / "venv", tmp_path / "empty"
    empty.mkdir()
    # as a user would: an sdist, then the wheel built from that sdist alone
    _run([sys.executable, "-m", "build", "--outdir", dist, ROOT], tmp_path)
    (wheel,) = dist.glob("ethplus-*.whl")
    assert len(list(dist.glob("ethplus-*.tar.gz"))) == 1
    venv.create(env, with_pip=True)
    _run([env / "bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
          wheel], tmp_path)  # fmt: skip
    cli = env / "bin/ethplus"
    name = f"{RUN_ID}-whl"
    try:
        r = _run([cli, "--version"], empty)
        assert r.stdout.strip() == f"ethplus {wheel.name.split('-')[1]}"
        # the package, not the checkout: it imports from the new environment
        r = _run([env / "bin/python", "-c", "import dataplane, sys; print(dataplane.__file__)"],
                 empty)  # fmt: skip
        assert r.stdout.startswith(str(env))
        r = _run([cli, "lab", "up", "erack-8x4", "--name", name], empty)
        assert "ethplus lab down" in r.stdout
        r = _run([cli, "bench", "all-reduce", "--lab", name, "--sizes", "64K", "--iters", "1",
                  "--warmup", "0", "--no-govern"], empty)  # fmt: skip
        assert "65536" in r.stdout or "64K" in r.stdout, r.stdout
        r = _run([cli, "wireshark"], empty)  # the dissector is package data too
        lua = r.stdout.split("dissector: ", 1)[1].split()[0]
        assert lua.startswith(str(env)) and lua.endswith("ethplus.lua"), r.stdout
        r = _run([cli, "scenario", "list"], empty)
        shipped = {p.stem for p in (library.SHIPPED / "scenarios").glob("*.toml")}
        listed = {line.split()[0] for line in r.stdout.splitlines()[1:] if line.strip()}
        assert shipped <= listed, (shipped - listed, r.stdout)
        _run([cli, "lab", "down", name], empty)
        assert not lab_namespaces(name)
    finally:
        if lab_namespaces(name):
            subprocess.run([cli, "lab", "down", name], capture_output=True)
