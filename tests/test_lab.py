"""Real labs in real namespaces: what the kernel says, not the tool's state."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ethplus, fabric_pids, lab_namespaces, netns_names

from dataplane.lab import kernel, registry
from dataplane.model import labfile

pytestmark = pytest.mark.root

ERACK = "netns-labs/erack-8x4.toml"


def ip_json(ns: str, *args: str):
    out = subprocess.run(["ip", "-n", ns, "-j", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout or "[]")


def lab_links(ns: str) -> list[dict]:
    return [x for x in ip_json(ns, "-d", "link", "show") if x["ifname"] != "lo"]


def offloads(ns: str, ifname: str) -> dict[str, str]:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "ethtool", "-k", ifname],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    feats = {}
    for line in out.splitlines()[1:]:
        k, _, v = line.strip().partition(": ")
        feats[k] = v.split()[0] if v else ""
    return feats


def test_erack_8x4_up_creates_exactly_the_fabric_and_down_removes_it(lab_name):
    r = ethplus("lab", "up", ERACK, "--name", lab_name, check=True)
    assert f"lab {lab_name} is up" in r.stdout
    namespaces = lab_namespaces(lab_name)
    assert len(namespaces) == 12
    assert namespaces == {f"ethp-{lab_name}-h{i}" for i in range(8)} | {
        f"ethp-{lab_name}-plane{p}" for p in range(4)
    }
    ends = {}
    for ns in sorted(namespaces):
        for link in lab_links(ns):
            assert link["ifname"].startswith("ethp")
            assert len(link["ifname"]) <= 15
            assert link["linkinfo"]["info_kind"] == "veth"
            assert link["mtu"] == 4200
            assert link["operstate"] in ("UP", "UNKNOWN") or "UP" in link["flags"]
            ends[ns, link["ifname"]] = link
    assert len(ends) == 64  # 32 veth pairs, both ends in lab namespaces
    # every host has one port per plane, and each plane switch one per host
    for i in range(8):
        names = sorted(x["ifname"] for x in lab_links(f"ethp-{lab_name}-h{i}"))
        assert [n.split("-", 1)[1] for n in names] == [f"plane{p}" for p in range(4)]
    for p in range(4):
        assert len(lab_links(f"ethp-{lab_name}-plane{p}")) == 8
    # offloads off on every lab veth, read back through ethtool
    for ns, ifname in ends:
        f = offloads(ns, ifname)
        for feat in (
            "tcp-segmentation-offload",
            "generic-segmentation-offload",
            "generic-receive-offload",
            "tx-checksumming",
            "rx-checksumming",
            "scatter-gather",
        ):
            assert f[feat] == "off", (ns, ifname, feat)
    # no route from a lab host to the host network: only lab subnets
    h0 = f"ethp-{lab_name}-h0"
    routes = ip_json(h0, "route", "show")
    assert sorted(r["dst"] for r in routes) == [f"198.18.{16 * p}.0/20" for p in range(4)]
    probe = subprocess.run(["ip", "-n", h0, "route", "get", "8.8.8.8"], capture_output=True)
    assert probe.returncode != 0  # unreachable
    addrs = {
        a["local"] for x in ip_json(h0, "addr") for a in x["addr_info"] if a["family"] == "inet"
    }
    assert addrs == {"127.0.0.1", "198.18.0.1", "198.18.16.1", "198.18.32.1", "198.18.48.1"}

    assert list(fabric_pids(lab_name).values()) == [lab_name]  # one fabric runs the switches
    # with numpy's math on one thread: no OpenBLAS thread per core spinning beside the switches
    (fabric_pid,) = fabric_pids(lab_name)
    environ = Path(f"/proc/{fabric_pid}/environ").read_bytes().split(b"\0")
    assert b"OPENBLAS_NUM_THREADS=1" in environ
    # a thread per switch, named so that its CPU is told from the fabric's Python
    names = [
        Path(t, "comm").read_text().strip() for t in Path(f"/proc/{fabric_pid}/task").iterdir()
    ]
    assert names.count("ethp-sw") == 4, names
    r = ethplus("lab", "down", lab_name, check=True)
    assert lab_namespaces(lab_name) == set()
    assert fabric_pids(lab_name) == {}
    assert not Path(f"/run/ethplus/labs/{lab_name}").exists()
    root_ifs = [x["ifname"] for x in json.loads(subprocess.check_output(["ip", "-j", "link"]))]
    assert not [i for i in root_ifs if i.startswith("ethp")]


def test_two_labs_from_one_file_coexist_and_go_down_independently(lab_name):
    other = lab_name + "-b"
    try:
        ethplus("lab", "up", ERACK, "--name", lab_name, check=True)
        ethplus("lab", "up", ERACK, "--name", other, check=True)
        assert len(lab_namespaces(lab_name)) == 12 and len(lab_namespaces(other)) == 12
        tags = {
            x["ifname"].split("-")[0]
            for lab in (lab_name, other)
            for x in lab_links(f"ethp-{lab}-h0")
        }
        assert len(tags) == 2  # each lab's interfaces carry their own tag
        ls = json.loads(ethplus("lab", "ls", "--json", check=True).stdout)
        assert {lab_name, other} <= {x["name"] for x in ls}
        ethplus("lab", "down", lab_name, check=True)
        assert lab_namespaces(lab_name) == set()
        assert len(lab_namespaces(other)) == 12
        assert all(x["operstate"] == "UP" for x in lab_links(f"ethp-{other}-h3"))
    finally:
        ethplus("lab", "down", other)
    assert lab_namespaces(other) == set()


def test_same_name_twice_is_refused_without_touching_the_first(lab_name):
    ethplus("lab", "up", ERACK, "--name", lab_name, check=True)
    r = ethplus("lab", "up", ERACK, "--name", lab_name)
    assert r.returncode == 1 and "already exists" in r.stderr and "Traceback" not in r.stderr
    assert len(lab_namespaces(lab_name)) == 12


def test_show_json_and_exec(lab_name):
    ethplus("lab", "up", "clos-16", "--name", lab_name, check=True)
    rec = json.loads(ethplus("lab", "show", lab_name, "--json", check=True).stdout)
    assert rec["family"] == "clos" and rec["time_scale"] > 1
    assert len(rec["topology"]["nodes"]) == 24 and len(rec["topology"]["links"]) == 32
    text = ethplus("lab", "show", lab_name, check=True).stdout
    assert "leaf0-spine0" in text and "time scale" in text
    r = ethplus("exec", lab_name, "h5", "--", "ip", "-j", "addr", check=True)
    addrs = [a["local"] for x in json.loads(r.stdout) for a in x["addr_info"]]
    assert "198.18.0.6" in addrs
    # /sys shows the node's own interfaces, as with `ip netns exec`
    r = ethplus("exec", lab_name, "spine0", "--", "ls", "/sys/class/net", check=True)
    assert sorted(r.stdout.split()) == sorted(
        ["lo"] + [x["ifname"] for x in lab_links(f"ethp-{lab_name}-spine0")]
    )
    r = ethplus("exec", lab_name, "nosuch", "--", "true")
    assert r.returncode == 1 and "no node 'nosuch'" in r.stderr
    r = ethplus("exec", lab_name, "h0", "--", "no-such-command-xyz")
    assert r.returncode == 127


def _decoys(tag: str):
    """A namespace whose name looks like ours and a root-namespace veth pair."""
    ns = f"ethp-{tag}-decoy"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(
        [
            "ip",
            "link",
            "add",
            f"ethp{tag[-4:]}dA",
            "type",
            "veth",
            "peer",
            "name",
            f"ethp{tag[-4:]}dB",
        ],
        check=True,
    )
    return ns, f"ethp{tag[-4:]}dA"


def test_sigkill_mid_up_then_clean_removes_only_what_ethplus_made(lab_name):
    decoy_ns, decoy_if = _decoys(lab_name)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "lab", "up", "erack-64x8", "--name", lab_name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        first = f"ethp-{lab_name}-h0"
        deadline = time.monotonic() + 30
        while first not in netns_names() and time.monotonic() < deadline:
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        journal = json.loads(Path(f"/run/ethplus/labs/{lab_name}/journal.json").read_text())
        assert journal["status"] == "creating"  # killed in the middle
        assert lab_namespaces(lab_name)  # and it had made something

        r = ethplus("clean", lab_name, check=True)  # never a global clean in tests
        assert "removed" in r.stdout
        assert fabric_pids(lab_name) == {}  # even one the killed command never recorded
        assert lab_namespaces(lab_name) == {decoy_ns}  # looks like a node of the lab, is not
        assert not Path(f"/run/ethplus/labs/{lab_name}").exists()
        assert decoy_ns in netns_names()
        root_ifs = [x["ifname"] for x in json.loads(subprocess.check_output(["ip", "-j", "link"]))]
        assert decoy_if in root_ifs
    finally:
        subprocess.run(["ip", "netns", "del", decoy_ns], check=False)
        subprocess.run(["ip", "link", "del", decoy_if], check=False)


def test_clean_recognises_its_namespaces_even_without_the_journal(lab_name):
    decoy_ns, decoy_if = _decoys(lab_name)
    try:
        ethplus("lab", "up", ERACK, "--name", lab_name, check=True)
        subprocess.run(["rm", "-rf", f"/run/ethplus/labs/{lab_name}"], check=True)
        ethplus("clean", lab_name, check=True)
        assert lab_namespaces(lab_name) == {decoy_ns}
        cg = _cgroup(lab_name)
        assert cg is None or not cg.exists()  # found by the program ethplus attached
    finally:
        subprocess.run(["ip", "netns", "del", decoy_ns], check=False)
        subprocess.run(["ip", "link", "del", decoy_if], check=False)


def test_down_kills_what_runs_inside_the_lab(lab_name):
    ethplus("lab", "up", ERACK, "--name", lab_name, check=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "exec", lab_name, "h2", "--", "sleep", "300"]
    )
    try:
        ns = f"/run/netns/ethp-{lab_name}-h2"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if (
                os.path.exists(f"/proc/{proc.pid}/ns/net")
                and os.stat(f"/proc/{proc.pid}/ns/net").st_ino == os.stat(ns).st_ino
            ):
                break
            time.sleep(0.02)
        ethplus("lab", "down", lab_name, check=True)
        assert proc.wait(timeout=10) != 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_down_unknown_lab_is_a_clear_error(monkeypatch, capsys):
    r = ethplus("lab", "down", "no-such-lab-here")
    assert r.returncode == 1 and "no lab named 'no-such-lab-here'" in r.stderr
    # no name and no --all is refused; run in this process with every way of
    # removing a lab made to fail, so a regression cannot take down the
    # developer's running labs
    from cli import main as cli_main
    from dataplane.lab import labs

    def removing(*_a, **_k):
        raise AssertionError("lab down with no name removed a lab")

    monkeypatch.setattr(labs, "down_all", removing)
    monkeypatch.setattr(labs, "down", removing)
    assert cli_main.main(["lab", "down"]) == 1
    assert "--all" in capsys.readouterr().err


# ---------------------------------------------------------------- trust


@pytest.mark.parametrize("bad", ["../../x", "x\n", "Upper", "a/b", "_x", "x" * 25])
def test_a_lab_name_that_is_not_one_is_refused_before_it_becomes_a_path(bad):
    for cmd in (["lab", "down", bad], ["lab", "show", bad], ["clean", bad]):
        r = ethplus(*cmd)
        assert r.returncode == 1, (cmd, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and "lab name" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "change",
    [
        {"namespaces": ["/proc/1/ns/net"]},
        {"namespaces": ["/run/netns/ethp-someone-else-h0"]},
        {"name": "another-lab"},
        {"tag": "zz", "slot": 3},
        {"pid": "1; rm -rf /"},
    ],
)
def test_a_journal_ethplus_did_not_write_is_refused_and_nothing_is_touched(lab_name, change):
    """A crafted journal (teardown trusts its namespaces: /proc/1/ns/net
    would kill every process of the host's network namespace): `lab down`
    refuses it in one line, `clean` warns and leaves it, nothing is killed."""
    d = Path(f"/run/ethplus/labs/{lab_name}")
    journal = {
        "name": lab_name,
        "tag": registry.tag_for(7),
        "slot": 7,
        "status": "up",
        "namespaces": [f"/run/netns/ethp-{lab_name}-h0"],
        "pid": 1,
        "file": "",
        "fabric_pid": 1,
        **change,
    }
    d.mkdir(parents=True)
    try:
        (d / "journal.json").write_text(json.dumps(journal))
        r = ethplus("lab", "down", lab_name)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert "did not write it" in r.stderr, r.stderr
        r = ethplus("clean", lab_name, check=True)
        assert "did not write it" in r.stderr and "removed 0 namespaces" in r.stdout
        assert (d / "journal.json").exists()
        os.kill(1, 0)  # init is untouched (it would be dead, with this shell's whole namespace)
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=True)


def test_clean_removes_a_dead_lab_and_leaves_a_live_one(lab_name):
    """`clean` removes leftovers only: a lab whose fabric was killed (and whose
    creator is gone) goes, a healthy one named beside it stays."""
    dead = f"{lab_name}d"
    try:
        ethplus("lab", "up", ERACK, "--name", lab_name, check=True)
        ethplus("lab", "up", ERACK, "--name", dead, check=True)
        for pid in fabric_pids(dead):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        r = ethplus("clean", lab_name, dead, check=True)
        assert "left 1 live lab(s) alone" in r.stdout, r.stdout
        assert lab_namespaces(dead) == set()
        assert not Path(f"/run/ethplus/labs/{dead}").exists()
        assert len(lab_namespaces(lab_name)) == 12 and fabric_pids(lab_name)
        listed = json.loads(ethplus("lab", "ls", "--json", check=True).stdout)
        assert any(x["name"] == lab_name and x["status"] == "up" for x in listed)
    finally:
        ethplus("lab", "down", dead)


def test_a_module_planted_in_the_working_directory_is_never_run(lab_name, tmp_path):
    """The fabric and the workers run as root: started from a directory that
    holds a ./dataplane/ of somebody else's, they still run ethplus's own."""
    planted = tmp_path / "dataplane"
    planted.mkdir()
    mark = tmp_path / "pwned"
    for mod in ("__init__", "fabric", "worker"):
        (planted / f"{mod}.py").write_text(f"open({str(mark)!r}, 'a').write('{mod}')\n")
    cli = str(Path(sys.executable).parent / "ethplus")
    lab_file = str(Path(__file__).parents[1] / ERACK)
    subprocess.run([cli, "lab", "up", lab_file, "--name", lab_name], cwd=tmp_path, check=True)
    r = subprocess.run(
        [cli, "bench", "all-reduce", "--lab", lab_name, "--sizes", "64K", "--iters", "1",
         "--warmup", "0", "--nodes", "h0,h1"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not mark.exists(), f"a planted module ran as root: {mark.read_text()}"
    sock = Path(f"/run/ethplus/labs/{lab_name}/fabric.sock")
    assert sock.stat().st_uid == 0 and sock.stat().st_mode & 0o077 == 0  # root's alone
    assert Path(f"/run/ethplus/labs/{lab_name}/job").stat().st_mode & 0o777 == 0o700


def test_a_tcp_congestion_control_the_kernel_lacks_is_refused_before_building(lab_name, tmp_path):
    """[tcp] congestion_control names one this kernel does not have: one
    line naming the file and key, and no namespace made."""
    missing = [
        c for c in labfile.TCP_CONGESTION_CONTROLS if c not in kernel.tcp_congestion_controls()
    ]
    if not missing:
        pytest.skip("this kernel has every congestion control a lab file may name")
    lab_file = tmp_path / "lab.toml"
    text, n = re.subn(r'^congestion_control = "\w+"$', f'congestion_control = "{missing[0]}"',
                      Path(ERACK).read_text(), flags=re.M)  # fmt: skip
    assert n == 1
    lab_file.write_text(text)
    r = ethplus("lab", "up", str(lab_file), "--name", lab_name)
    assert r.returncode == 2, r.stderr
    assert f"{lab_file}: [tcp] congestion_control:" in r.stderr and missing[0] in r.stderr
    assert "Traceback" not in r.stderr
    assert not lab_namespaces(lab_name)


_HOLD_OPEN = """
import socket, sys, time
l = socket.create_server(("198.18.0.2", 5001))
print("up", flush=True)
c, _ = l.accept()
time.sleep(600)  # never reads nor closes: lab down kills it
"""
_CLOSE_FIRST = """
import socket
s = socket.create_connection(("198.18.0.2", 5001), timeout=60, source_address=("198.18.0.1", 0))
s.close()
"""


# A SYN from h0 to an address no accelerator has; prints the socket's
# retries and RTO (us) once the first retry went, or after argv[1] seconds
# (0: at once, the initial RTO).
_SYN_INTO_NOTHING = """
import socket, struct, sys, time
s = socket.socket()
s.bind(("198.18.0.1", 0))
s.setblocking(False)
try:
    s.connect(("198.18.0.200", 5001))  # no accelerator has it: the SYN goes unanswered
except BlockingIOError:
    pass
t0 = time.monotonic()
while True:
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    if info[2] >= 1 or time.monotonic() - t0 >= float(sys.argv[1]):  # tcpi_retransmits
        break
    time.sleep(0.05)
print(info[2], struct.unpack_from("I", info, 8)[0])  # retries, tcpi_rto (us)
"""


def test_a_hosts_syn_retries_back_off_from_the_first(lab_name):
    """A SYN's retries run on real time from the kernel's 1 s initial RTO,
    which a large k's round trip nears: every SYN still queued is sent
    again.  Linux (since 6.7) sends 4 retries a fixed 1 s apart before it
    backs off; a lab's accelerators back off from the first (2 s next)."""
    ethplus("lab", "up", ERACK, "--name", lab_name, check=True)
    out = subprocess.run(
        ["ip", "netns", "exec", f"ethp-{lab_name}-h0", sys.executable, "-c", _SYN_INTO_NOTHING,
         "30"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    retries, rto_us = int(out[0]), int(out[1])
    assert retries >= 1 and rto_us >= 2_000_000, out  # Linux's default: 1 s again


def _cgroup(lab: str) -> Path | None:
    from dataplane.lab import cgroup

    path = cgroup.lab_path(lab)
    return None if path is None else Path(path)


def test_a_command_in_a_lab_waits_the_kernels_largest_rto_before_a_syn_goes_again(lab_name):
    """Linux sends a SYN again after a fixed real second, shorter than a
    handshake at a large k: what `ethplus exec` runs in a lab (as a job's
    ranks) waits the kernel's largest RTO instead, through the lab's cgroup,
    which `lab down` removes.  A process that is not the lab's keeps 1 s."""
    ethplus("lab", "up", ERACK, "--name", lab_name, check=True)
    cg = _cgroup(lab_name)
    if cg is None:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    assert (
        json.loads(ethplus("lab", "show", lab_name, "--json", check=True).stdout)["tcp_syn_rto"]
        == "max"
    )
    r = ethplus("exec", lab_name, "h0", "--", sys.executable, "-c", _SYN_INTO_NOTHING, "0",
                check=True)  # fmt: skip
    assert r.stdout.split()[1] == "120000000", r.stdout  # us
    outside = subprocess.run(
        ["ip", "netns", "exec", f"ethp-{lab_name}-h0", sys.executable, "-c", _SYN_INTO_NOTHING,
         "0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert outside.stdout.split()[1] == "1000000", outside.stdout
    assert cg.is_dir()
    from dataplane.lab import cgroup

    ethplus("lab", "down", lab_name, check=True)
    # its processes' job cgroups (below this process's own) go with it
    assert not cg.exists() and not list(Path(cgroup.own_path()).glob(f"ethp-{lab_name}.job*"))


def test_a_command_in_a_lab_stays_inside_its_callers_cgroup(lab_name, tmp_path):
    """What ethplus starts in a lab joins a cgroup of its own *below* the one
    its caller runs in (a systemd unit's, a container's, a batch job's), so
    the caller's memory and CPU limits still hold; there it waits the
    kernel's largest RTO before a SYN goes again."""
    from dataplane.lab import cgroup

    ethplus("lab", "up", ERACK, "--name", lab_name, check=True)
    if _cgroup(lab_name) is None:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    caller = Path(cgroup.own_path()) / f"ethp-{lab_name}-caller"
    caller.mkdir()
    syn = tmp_path / "syn.py"
    syn.write_text(_SYN_INTO_NOTHING)

    def into_caller() -> None:
        (caller / "cgroup.procs").write_text("0")

    try:
        r = subprocess.run(
            [sys.executable, "-m", "cli.main", "exec", lab_name, "h0", "--", "sh", "-c",
             f"cat /proc/self/cgroup; {sys.executable} {syn} 0"],
            capture_output=True, text=True, timeout=60, preexec_fn=into_caller,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        line = next(x for x in r.stdout.splitlines() if x.startswith("0::"))
        assert line.startswith(f"0::{'/' + str(caller.relative_to(cgroup._v2_root()))}/"
                               f"ethp-{lab_name}.job"), line  # fmt: skip
        assert r.stdout.split()[-1] == "120000000", r.stdout  # us
    finally:
        for d in caller.glob("ethp-*"):
            d.rmdir()
        caller.rmdir()


def test_a_lab_may_keep_linuxs_second_before_a_syn_goes_again(lab_name, tmp_path):
    """[tcp] syn_rto = "linux": no cgroup, and its commands' SYNs go again
    after Linux's real second."""
    src = Path(ERACK).read_text().replace("[tcp]", '[tcp]\nsyn_rto = "linux"', 1)
    f = tmp_path / "lab.toml"
    f.write_text(src)
    ethplus("lab", "up", str(f), "--name", lab_name, check=True)
    cg = _cgroup(lab_name)
    assert cg is None or not cg.exists()
    r = ethplus("exec", lab_name, "h0", "--", sys.executable, "-c", _SYN_INTO_NOTHING, "0",
                check=True)  # fmt: skip
    assert r.stdout.split()[1] == "1000000", r.stdout


def _tcp_states(netns_fd: int) -> list[str]:
    """The TCP sockets' states in the namespace open at netns_fd (ss)."""
    out = subprocess.run(
        ["nsenter", f"--net=/proc/self/fd/{netns_fd}", "ss", "-Htan"],
        pass_fds=(netns_fd,),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split()[0] for line in out.splitlines()]


def test_down_leaves_no_tcp_connection_of_the_lab_in_the_kernel(lab_name):
    """A process killed mid-job leaves its connections to the kernel, which
    at a large k would go on resending into a lab that is gone for many
    minutes (an orphan's RTO follows k), keeping its namespace and taking
    from the host's orphan budget that the next job shares.  `lab down`
    destroys the lab's TCP sockets: here an orphan that closed first and
    waits for its peer (FIN-WAIT-2), in a namespace the test keeps open."""
    ethplus("lab", "up", ERACK, "--name", lab_name, check=True)
    h0, h1 = (f"ethp-{lab_name}-h{i}" for i in (0, 1))
    held = os.open(f"/run/netns/{h0}", os.O_RDONLY)
    server = subprocess.Popen(
        ["ip", "netns", "exec", h1, sys.executable, "-c", _HOLD_OPEN],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "up"
        subprocess.run(["ip", "netns", "exec", h0, sys.executable, "-c", _CLOSE_FIRST], check=True)
        # orphaned (no process holds it), its FIN sent, acked or on its way
        assert _tcp_states(held) in (["FIN-WAIT-1"], ["FIN-WAIT-2"])
        out = ethplus("lab", "down", lab_name, check=True).stdout
        assert server.wait(10) != 0  # killed with the lab
        assert _tcp_states(held) == []
        # the orphan at least (the killed server's own may have closed)
        destroyed = re.search(r"(\d+) TCP sockets destroyed", out)
        assert destroyed and int(destroyed[1]) >= 1, out
    finally:
        os.close(held)
        server.kill()
        server.wait()
