"""A normal install works anywhere: the wheel `python -m build` makes,
installed into a fresh virtual environment, runs a lab by name from an
empty directory (the labs and scenarios are package data), with nothing of
the checkout on its path."""

import subprocess

import pytest
from conftest import RUN_ID, lab_namespaces
from wheeltools import install, run

from dataplane.model import library

pytestmark = pytest.mark.root


def test_the_wheel_runs_a_lab_by_name_from_an_empty_directory(built_wheel, tmp_path):
    env, empty = tmp_path / "venv", tmp_path / "empty"
    empty.mkdir()
    wheel = built_wheel
    cli = install(wheel, env) / "ethplus"
    name = f"{RUN_ID}-whl"
    try:
        r = run([cli, "--version"], empty)
        assert r.stdout.strip() == f"ethplus {wheel.name.split('-')[1]}"
        # the package, not the checkout: it imports from the new environment
        r = run([env / "bin/python", "-c", "import dataplane, sys; print(dataplane.__file__)"],
                 empty)  # fmt: skip
        assert r.stdout.startswith(str(env))
        r = run([cli, "lab", "up", "erack-8x4", "--name", name], empty)
        assert "ethplus lab down" in r.stdout
        r = run([cli, "bench", "all-reduce", "--lab", name, "--sizes", "64K", "--iters", "1",
                  "--warmup", "0", "--no-govern"], empty)  # fmt: skip
        assert "65536" in r.stdout or "64K" in r.stdout, r.stdout
        r = run([cli, "wireshark"], empty)  # the dissector is package data too
        lua = r.stdout.split("dissector: ", 1)[1].split()[0]
        assert lua.startswith(str(env)) and lua.endswith("ethplus.lua"), r.stdout
        r = run([cli, "scenario", "list"], empty)
        shipped = {p.stem for p in (library.SHIPPED / "scenarios").glob("*.toml")}
        listed = {line.split()[0] for line in r.stdout.splitlines()[1:] if line.strip()}
        assert shipped <= listed, (shipped - listed, r.stdout)
        run([cli, "lab", "down", name], empty)
        assert not lab_namespaces(name)
    finally:
        if lab_namespaces(name):
            subprocess.run([cli, "lab", "down", name], capture_output=True)
