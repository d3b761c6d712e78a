"""Labs without root: an unprivileged user (nobody, 65534) with ethplus
installed from the wheel runs a lab in a user namespace of its own: lab up,
ping, iperf3, an ETH+ all-reduce checked byte for byte, a capture, lab down,
and nothing of it is left; root's labs and the user's do not see or remove
each other."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import RUN_ID, ethplus, lab_namespaces
from wheeltools import install, run, world_python

pytestmark = pytest.mark.root

NOBODY = 65534


def _procs(uid: int) -> list[str]:
    """Live (not zombie) processes of uid: their command lines."""
    out = []
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            if os.stat(e.path).st_uid != uid:
                continue
            status = Path(e.path, "status").read_text()
            if "\nState:\tZ" in status:
                continue
            out.append(Path(e.path, "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return out


@pytest.fixture(scope="module")
def user_env(built_wheel):
    """A virtual environment the user may run (the wheel in it), and a home."""
    base = Path(tempfile.mkdtemp(prefix="ethp-rootless-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        bin_dir = install(built_wheel, base / "venv", python=world_python())
        subprocess.run(["chmod", "-R", "a+rX", str(base / "venv")], check=True)
        home = base / "home"
        home.mkdir()
        os.chown(home, NOBODY, NOBODY)
        yield bin_dir / "ethplus", home
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as_user(cli, home):
    """The user's ethplus: run(*args) checked; bg(*args) a Popen."""

    def user(*args, timeout=300):
        return run([cli, *args], home, timeout=timeout, user=NOBODY, env={"HOME": str(home)})

    def user_bg(*args):
        base = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "env",
                "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"HOME={home}"]  # fmt: skip
        return subprocess.Popen([*base, str(cli), *args], cwd=home, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip

    return user, user_bg


def _user_down_and_reap(cli, home, name):
    """The user's lab down (unchecked), then any of its lab processes killed."""
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                    "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"HOME={home}",
                    str(cli), "lab", "down", name], cwd=home, capture_output=True)  # fmt: skip
    if any("dataplane.lab" in cmd for cmd in _procs(NOBODY)):
        subprocess.run(["pkill", "-u", str(NOBODY), "-f", "dataplane.lab"])


def test_a_user_without_root_runs_a_whole_lab(user_env):
    cli, home = user_env
    name = f"{RUN_ID}-rl"
    user, user_bg = _as_user(cli, home)

    try:
        r = user("lab", "up", "erack-8x4", "--name", name)
        assert "rootless:" in r.stdout  # what differs is said once, at lab up
        assert not lab_namespaces(name)  # not among root's namespaces
        r = user("exec", name, "h0", "--", "ping", "-c", "2", "-W", "5", "198.18.0.2")
        assert " 0% packet loss" in r.stdout
        server = user_bg("exec", name, "h1", "--", "iperf3", "-s", "-1")
        time.sleep(1.0)
        r = user("exec", name, "h0", "--", "iperf3", "-c", "198.18.0.2", "-t", "1", "-J")
        assert json.loads(r.stdout)["end"]["sum_received"]["bytes"] > 0
        assert server.wait(timeout=60) == 0
        out = home / "ar.json"
        user(
            "bench",
            "all-reduce",
            "--lab",
            name,
            "--transport",
            "ethplus",
            "--sizes",
            "256K",
            "--iters",
            "1",
            "--warmup",
            "1",
            "--check",
            "all",
            "--no-govern",
            "--json",
            out,
        )
        rows = json.loads(out.read_text())["rows"]
        assert rows and all(r["wrong"] == 0 for r in rows)
        cap = user_bg("capture", name, "h0-plane0", "-c", "4", "--seconds", "60")
        time.sleep(2.0)
        user("exec", name, "h0", "--", "ping", "-c", "3", "-W", "5", "198.18.0.2")
        lines, err = cap.communicate(timeout=90)
        assert cap.returncode == 0 and lines.count("ICMP 198.18.0.") == 4, (lines, err)

        # root's labs and the user's: the same name, neither sees nor removes the other
        ethplus("lab", "up", "netns-labs/erack-8x4.toml", "--name", name, check=True)
        try:
            assert name in ethplus("lab", "ls", check=True).stdout
            ethplus("clean", name)  # root's clean: its own lab is live, so nothing goes
            assert name in user("lab", "ls").stdout
        finally:
            ethplus("lab", "down", name, check=True)
        assert name in user("lab", "ls").stdout

        user("lab", "down", name)
        assert not _procs(NOBODY), _procs(NOBODY)  # no keeper, fabric or worker left
    finally:
        _user_down_and_reap(cli, home, name)


PING = ("h0", "--", "ping", "-c", "2", "-W", "5", "198.18.0.2")


def _root_lab_works(name: str) -> None:
    r = ethplus("exec", name, *PING, check=True)
    assert " 0% packet loss" in r.stdout, r.stdout


def _fabric_of_uid(uid: int, name: str) -> int:
    for e in os.scandir("/proc"):
        try:
            argv = Path(e.path, "cmdline").read_bytes().split(b"\0")
            if os.stat(e.path).st_uid == uid and b"dataplane.lab.fabric" in argv:
                if name.encode() in argv:
                    return int(e.name)
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no fabric of uid {uid} for {name}")


def test_root_and_a_user_never_stop_each_others_lab_of_the_same_name(user_env):
    """Labs of one name, root's and the user's: each side's `lab down`, and
    its `clean NAME` of its own dead lab, leave the other's lab running and
    passing traffic (the fabric is found by the lab's own record, in the
    caller's own namespaces, never by a scan for its command line)."""
    cli, home = user_env
    name = f"{RUN_ID}-rs"
    lab = str(Path(__file__).resolve().parent.parent / "netns-labs" / "erack-8x4.toml")
    user, _ = _as_user(cli, home)

    def user_lab_works():
        assert " 0% packet loss" in user("exec", name, *PING).stdout

    try:
        user("lab", "up", "erack-8x4", "--name", name, "--pin")
        ethplus("lab", "up", lab, "--name", name, check=True)
        ethplus("lab", "down", name, check=True)  # root's
        user_lab_works()

        ethplus("lab", "up", lab, "--name", name, check=True)
        r = user("lab", "down", name)  # the user's: no error, root's fabric untouched
        assert "Traceback" not in r.stderr, r.stderr
        _root_lab_works(name)

        user("lab", "up", "erack-8x4", "--name", name, "--pin")
        root_fabric = json.loads(Path(f"/run/ethplus/labs/{name}/journal.json").read_text())
        os.kill(root_fabric["fabric_pid"], 9)  # root's lab is now a leftover
        time.sleep(0.3)
        r = ethplus("clean", name, check=True)
        assert "of 1 dead lab(s)" in r.stdout, r.stdout
        user_lab_works()

        ethplus("lab", "up", lab, "--name", name, check=True)
        os.kill(_fabric_of_uid(NOBODY, name), 9)  # the user's is the leftover now
        time.sleep(0.3)
        user("clean", name)
        _root_lab_works(name)
    finally:
        ethplus("lab", "down", name)
        _user_down_and_reap(cli, home, name)


def test_a_users_labs_outlive_its_state_and_a_foreign_tmp_path(user_env, tmp_path):
    """Another user made /tmp/ethplus-65534 first (the old fallback: a
    denial of service); the user's lab comes up regardless.  A mount the
    host makes after the user's keeper started is seen in the user's labs
    (slave propagation).  The user's state directory is deleted (as logind
    deletes $XDG_RUNTIME_DIR at logout) while its lab runs: `lab ls` still
    finds the keeper (by what the kernel shows) and lists the lab, and
    `lab down` removes it, leaving no process behind."""
    cli, home = user_env
    name = f"{RUN_ID}-ro"
    user, _ = _as_user(cli, home)
    foreign = Path(f"/tmp/ethplus-{NOBODY}")
    made_foreign = not foreign.exists()
    shared = Path(tempfile.mkdtemp(prefix="ethp-prop-", dir="/tmp"))
    os.chmod(shared, 0o755)
    mounted: list[Path] = []
    try:
        if made_foreign:
            foreign.mkdir(mode=0o700)  # root's: the user may neither use nor remove it
        subprocess.run(["mount", "--bind", shared, shared], check=True)
        mounted.append(shared)
        subprocess.run(["mount", "--make-shared", shared], check=True)
        user("lab", "up", "erack-8x4", "--name", name, "--pin")

        sub = shared / "sub"
        sub.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "ethp-prop", sub], check=True)
        mounted.append(sub)
        (sub / "marker").write_text("mounted later\n")
        assert user("exec", name, "h0", "--", "cat", str(sub / "marker")).stdout == (
            "mounted later\n"
        )

        state = home / ".cache" / "ethplus"
        assert (state / "keeper.pid").exists()
        shutil.rmtree(state)
        assert name in user("lab", "ls").stdout
        user("lab", "down", name)
        assert name not in user("lab", "ls").stdout
        time.sleep(0.5)
        assert not _procs(NOBODY), _procs(NOBODY)
    finally:
        _user_down_and_reap(cli, home, name)
        for m in reversed(mounted):
            subprocess.run(["umount", "-l", m], check=False)
        shutil.rmtree(shared, ignore_errors=True)
        if made_foreign:
            foreign.rmdir()

