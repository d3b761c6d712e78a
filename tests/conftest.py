"""Shared fixtures: root-only tests, unique lab names, and a guarantee that
no test leaves a lab object behind, even when it fails."""

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from dataplane.lab import cgroup
from dataplane.run import stacks

IS_ROOT = os.geteuid() == 0
# Every lab a test makes is named with this prefix, so the finaliser can
# remove exactly those (and a developer's own labs survive a test run).
RUN_ID = f"t{os.getpid() % 100000}"


def pytest_addoption(parser):
    parser.addoption(
        "--all",
        action="store_true",
        help="also the slow tests (the flagship labs at full size: scripts/test --all)",
    )


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.skip(reason="slow: run with scripts/test --all")
    root = pytest.mark.skip(reason="needs root: creates real network namespaces")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--all"):
            item.add_marker(slow)
        if "root" in item.keywords and not IS_ROOT:
            item.add_marker(root)
    _engine_tests_once(items)


UNPRIVILEGED_RUN = "test_these_tests_need_no_privilege"  # in test_engine.py


def _engine_tests_once(items) -> None:
    """test_engine's tests run once: where the run that drops every
    capability and runs the whole file again is selected (as root, with
    setpriv), the root run leaves them to it, but for those that need a
    privilege (a skipif of their own); a test picked alone runs here."""
    if not IS_ROOT or os.environ.get("ETHP_ENGINE_UNPRIVILEGED") or not shutil.which("setpriv"):
        return
    engine = [item for item in items if item.path.name == "test_engine.py"]
    if not any(item.name == UNPRIVILEGED_RUN for item in engine):
        return
    there = pytest.mark.skip(reason=f"run without any privilege by {UNPRIVILEGED_RUN}")
    for item in engine:
        if item.name != UNPRIVILEGED_RUN and item.get_closest_marker("skipif") is None:
            item.add_marker(there)


def together(n: int, fn) -> list:
    """fn() from n threads started at once (as a rank host's ranks leave a
    barrier): what each returned."""
    got = []
    threads = [threading.Thread(target=lambda: got.append(fn())) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def ethplus(
    *args: str, check: bool = False, timeout: float = 300, governed: bool = False
) -> subprocess.CompletedProcess:
    """The ethplus command.  `lab up` pins the lab's time scale (--pin)
    unless governed: a governor moving k would make every test's real time
    depend on the machine's load; the governor has tests of its own."""
    if args[:2] == ("lab", "up") and not governed:
        args = (*args, "--pin")
    p = subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"ethplus {' '.join(args)} still running after {timeout:g} s; its last output,"
            f" with the stacks of this run's labs' processes:\n{_stuck_output(p)}"
        ) from None
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    if check and r.returncode != 0:
        raise AssertionError(f"ethplus {' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r


STACKS_WAIT_S = 3.0


def _stuck_output(p: subprocess.Popen) -> str:
    """A command that outlived its timeout: every process in the cgroups of
    this run's labs (their ranks, rank hosts and stores) asked for its
    threads' stacks (dataplane.run.stacks), which `ethplus run` passes on;
    then the command killed, and the tail of what it printed."""
    # (their job cgroups are below this process's own: cgroup.join)
    root = cgroup.own_path() or "/nonexistent"
    for procs in glob.glob(os.path.join(root, f"{cgroup.PREFIX}{RUN_ID}-*", "cgroup.procs")):
        with contextlib.suppress(OSError), open(procs) as f:
            for pid in f.read().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), stacks.SIGNAL)
    time.sleep(STACKS_WAIT_S)
    p.kill()
    try:
        out, err = p.communicate(timeout=STACKS_WAIT_S)
    except subprocess.TimeoutExpired:  # a child still holds the pipes
        return "(no output: the command's pipes are still held open)"
    return (out or "")[-20000:] + "\n--- stderr:\n" + (err or "")[-3000:]


def netns_names() -> set[str]:
    try:
        return set(os.listdir("/run/netns"))
    except FileNotFoundError:
        return set()


def lab_namespaces(lab: str) -> set[str]:
    """Namespaces of lab: ethp-LAB-NODE, where node names never contain '-'."""
    prefix = f"ethp-{lab}-"
    return {n for n in netns_names() if n.startswith(prefix) and "-" not in n[len(prefix) :]}


@pytest.fixture
def lab_name(request):
    """A unique lab name for this test; the lab is removed afterwards whatever happens."""
    name = f"{RUN_ID}-{uuid.uuid4().hex[:6]}"
    yield name
    if lab_namespaces(name) or Path(f"/run/ethplus/labs/{name}").exists():
        ethplus("lab", "down", name)
    for ns in lab_namespaces(name):  # the command failed to: fall back to iproute2
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert not lab_namespaces(name), f"test left namespaces of {name} behind"


def fabric_pids(prefix: str, module: str = "dataplane.lab.fabric") -> dict[int, str]:
    """Fabric (or worker) processes whose lab name starts with prefix: pid -> lab."""
    lab_arg = 1 if module == "dataplane.lab.fabric" else 2  # after the module's name
    out = {}
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{e.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if module.encode() not in argv:
            continue
        at = argv.index(module.encode()) + lab_arg
        if len(argv) > at and argv[at].startswith(prefix.encode()):
            out[int(e.name)] = argv[at].decode()
    return out


# Session-wide labs for the modules that only send traffic over a shipped lab
# and judge it by counter deltas (receiver credits, HPCC, the fuzzer): none
# of their tests changes a link, a switch or k.  A module that does builds
# its own (labtools.module_lab).  Removed at the session's end whatever
# happens, before the check below.


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory):
    """The wheel `python -m build` makes of this checkout (via its sdist)."""
    from wheeltools import build

    return build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def traffic_erack():
    from labtools import running_lab

    yield from running_lab("tr", "erack-8x4")


@pytest.fixture(scope="session")
def traffic_clos():
    from labtools import running_lab

    yield from running_lab("tr", "clos-16")


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind():
    yield
    if not IS_ROOT:
        return
    left = {n for n in netns_names() if n.startswith(f"ethp-{RUN_ID}-")}
    for ns in left:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    fabrics = fabric_pids(RUN_ID)
    workers = fabric_pids(RUN_ID, "dataplane.run.worker")
    for pid in [*fabrics, *workers]:
        os.kill(pid, 9)
    assert not workers, f"the test run left worker processes behind: {workers}"
    assert not left, f"the test run left namespaces behind: {sorted(left)}"
    assert not fabrics, f"the test run left fabric processes behind: {fabrics}"
