"""The command line itself: help, and the message a non-root user gets."""

import os
import subprocess
import sys

import pytest
from conftest import ethplus

from cli import entry
from cli import main as cli_main


def test_help_lists_the_commands():
    r = ethplus("--help")
    assert r.returncode == 0
    for word in ("lab", "exec", "clean"):
        assert word in r.stdout
    r = ethplus("lab", "--help")
    for word in ("up", "down", "ls", "show"):
        assert word in r.stdout


def test_not_root_gets_a_clear_message(monkeypatch, capsys):
    """Not root and not through the `ethplus` command (which would join the
    user's namespace first): one line saying what to do."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rc = cli_main.main(["lab", "up", "erack-8x4", "--name", "never-built"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.strip() == (
        "ethplus: error: ethplus lab up needs root, or the `ethplus` command, which runs it"
        " without root in a user namespace of your own"
    )


@pytest.mark.parametrize(
    "argv, joins",
    [
        ([], False), (["--version"], False), (["lab", "up", "x", "--help"], False),
        (["wireshark"], False), (["lab", "keys"], False), (["scenario", "list"], False),
        (["lab", "up", "x"], True), (["lab", "ls"], True), (["scenario", "run", "x"], True),
        (["bench", "all-reduce", "--lab", "x"], True), (["clean"], True),
    ],
)  # fmt: skip
def test_which_commands_join_the_users_namespace_without_root(argv, joins):
    assert entry._needs_labs(argv) == joins


def test_unknown_command_is_a_usage_error():
    r = ethplus("lab", "explode")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_a_reader_that_goes_away_is_no_error():
    """`ethplus scenario list | head -1`: the pipe closes under the command,
    which stops quietly (status 141, as for SIGPIPE) instead of a traceback."""
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first line
    try:
        p = subprocess.run(
            [sys.executable, "-m", "cli.main", "scenario", "list"],
            stdout=w, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(w)
    assert p.returncode == 141 and p.stderr == "", p.stderr
