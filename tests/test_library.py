"""Lab files and scenarios by name: the user's directories ($ETHPLUS_LABS,
then ./netns-labs/) before the labs ethplus ships; an unknown name lists
what exists and where it looked.  The wheel that carries the shipped labs
is built and used from an empty directory in test_wheel.py."""

import subprocess
import sys

import pytest

from dataplane.model import labfile, library, scenario_file

SHIPPED_LABS = {"clos-16", "erack-64x8", "erack-8x4", "hpn-16", "upn-512"}


def _lab(path, name: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.toml").write_text(
        '[lab]\nfamily = "erack"\n[topology]\naccelerators = 4\nplanes = 2\n'
    )


def test_the_shipped_labs_and_scenarios_are_found_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./netns-labs/ here
    monkeypatch.delenv(library.ENV, raising=False)
    assert SHIPPED_LABS <= set(library.names())
    assert labfile.load("erack-8x4").path == str(library.SHIPPED / "erack-8x4.toml")
    assert {"ecmp-collision", "incast-alltoall"} <= {s.name for s in scenario_file.listing()}


def test_the_users_directories_come_before_the_package(tmp_path, monkeypatch):
    """$ETHPLUS_LABS first, then ./netns-labs/, then the package: the same
    name in each resolves to the first; a name only the user has is found."""
    env, cwd = tmp_path / "env", tmp_path / "work"
    _lab(env, "erack-8x4")
    _lab(cwd / "netns-labs", "erack-8x4")
    _lab(cwd / "netns-labs", "mine")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv(library.ENV, str(env))
    assert labfile.load("erack-8x4").path == str(env / "erack-8x4.toml")
    assert labfile.load("mine").path == str(cwd / "netns-labs" / "mine.toml")
    monkeypatch.delenv(library.ENV)
    assert labfile.load("erack-8x4.toml").path == str(cwd / "netns-labs" / "erack-8x4.toml")
    assert "mine" in library.names() and SHIPPED_LABS <= set(library.names())


def test_an_unknown_name_lists_what_exists_and_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(library.ENV, str(tmp_path / "mine"))
    _lab(tmp_path / "mine", "own-lab")
    with pytest.raises(labfile.LabFileError) as e:
        labfile.load("no-such-lab")
    msg = str(e.value)
    assert msg.startswith("no-such-lab: file: expected an existing lab file or one of: ")
    assert "own-lab" in msg and "erack-8x4" in msg
    assert f"$ETHPLUS_LABS ({tmp_path / 'mine'})" in msg and "./netns-labs" in msg
    assert "the package (" in msg
    with pytest.raises(labfile.LabFileError, match="scenario file or one of: .*ecmp-collision"):
        scenario_file.load("no-such-scenario")


@pytest.mark.parametrize("name", ["../netns-labs/erack-8x4", "scenarios/ecmp-collision", ".x"])
def test_a_name_is_never_joined_as_a_path(tmp_path, monkeypatch, name):
    """Only a plain name is looked up in the library's directories; anything
    else must be a file that exists as given."""
    monkeypatch.chdir(tmp_path)
    assert library.find(name) is None


def test_ethplus_version_names_the_installed_package():
    from importlib import metadata

    r = subprocess.run([sys.executable, "-m", "cli.main", "--version"], capture_output=True,
                       text=True, check=True)  # fmt: skip
    assert r.stdout.strip() == f"ethplus {metadata.version('ethplus')}"
