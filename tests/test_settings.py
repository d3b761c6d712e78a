"""Every setting a lab file declares goes where its declaration says, on a
real lab: file -> lab.json -> the C structs the switches and the NIC
engines run with (converted to real units at the lab's k exactly as
declared), in this process and in a job's workers (their results record
it) -> `lab show --settings`, unchanged; kernel TCP's timers reach every
namespace's routes.  Each declared key is set to a value other than its
default, so a setting dropped or defaulted on the way shows."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RUN_ID, ethplus

from dataplane.lab import kernel, labs, registry
from dataplane.lab.nic import RTO_FLOOR_NS, Endpoint
from dataplane.model import labfile

pytestmark = pytest.mark.root

LAB_FILES = Path(__file__).resolve().parent.parent / "netns-labs"
K = 100  # the lab's time scale, pinned: every conversion is at this k
# values a generic rule cannot pick (the NIC takes 1 to 16 queue pairs)
SPECIAL = {"roce_qps": 1, "jitter_ns": 100, "mtu_bytes": 9000}


def _other(key: str, f: labfile.Field):
    """A valid value for f other than its default."""
    d = f.default
    if key in SPECIAL:
        v = SPECIAL[key]
    elif f.choices:
        v = next(c for c in f.choices if c != d)
    elif isinstance(d, bool):
        v = not d
    elif isinstance(d, int):
        v = 2 * d if d else 1_000_000
    else:
        v = d * 1.5
    assert f.ok(v) and v != d, (key, v)
    return v


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f'"{v}"' if isinstance(v, str) else repr(v)


SWITCH = labfile.switch_fields("erack")
DECLARED = {
    "switch": {k: _other(k, f) for k, f in SWITCH.items() if f.c is not None},
    "nic": {k: _other(k, f) for k, f in labfile.NIC_FIELDS.items()},
    "tcp": {k: _other(k, f) for k, f in labfile.schema("erack")["tcp"].items()},
    "link": {k: _other(k, f) for k, f in labfile.schema("erack")["link"].items()},
}


@pytest.fixture(scope="module")
def settings_lab(tmp_path_factory):
    name = f"{RUN_ID}-st"
    path = tmp_path_factory.mktemp("settings") / "settings.toml"
    body = [
        "[lab]", 'family = "erack"', f"time_scale = {K}",
        "[topology]", "accelerators = 4", "planes = 2",
    ]  # fmt: skip
    for sec, values in DECLARED.items():
        body.append(f"[{sec}]")
        body += [f"{k} = {_toml(v)}" for k, v in values.items()]
    path.write_text("\n".join(body) + "\n")
    ethplus("lab", "up", str(path), "--name", name, check=True)
    try:
        yield name
    finally:
        ethplus("lab", "down", name)


def _same(a, b) -> bool:
    return math.isclose(a, b, rel_tol=1e-9) if isinstance(a, float) else a == b


def test_every_switch_setting_reaches_the_switches_c_struct(settings_lab):
    rec = registry.load_lab(settings_lab)
    assert {k: rec["switch"][k] for k in DECLARED["switch"]} == DECLARED["switch"]  # lab.json
    want = labfile.c_values(SWITCH, rec["switch"], K)
    assert "pfc_watchdog_ns" in want and want["pfc_watchdog_ns"] != rec["switch"]["pfc_watchdog_us"]
    for node in ("plane0", "plane1"):
        got = labs.control(settings_lab, {"op": "config", "node": node})["config"]
        wrong = {c: (got[c], v) for c, v in want.items() if not _same(got[c], v)}
        assert not wrong, f"{node}: C struct field: (in C, declared): {wrong}"


def _want_nic(rec: dict, roce: bool, rate_bps: int) -> dict:
    """The engine's C struct fields the lab's [nic] declares, at K, with the
    engine's own bounds on top."""
    want = labfile.c_values(labfile.NIC_ETHP_FIELDS, rec["nic"], K)
    if roce:
        want.update(labfile.c_values(labfile.NIC_ROCE_FIELDS, rec["nic"], K))
        want["rto_ns"] = max(want["rto_ns"], RTO_FLOOR_NS)
        want["dcqcn_min_rate_bps"] = min(rate_bps, want["dcqcn_min_rate_bps"])
    return want


def _wrong(got: dict, want: dict) -> dict:
    return {c: (got[c], v) for c, v in want.items() if not _same(got[c], v)}


@pytest.mark.parametrize("roce", [False, True], ids=["ethplus", "roce"])
def test_every_nic_setting_reaches_the_engines_c_struct(settings_lab, roce):
    rec = registry.load_lab(settings_lab)
    assert {k: rec["nic"][k] for k in DECLARED["nic"]} == DECLARED["nic"]  # lab.json
    with Endpoint(settings_lab, "h0", roce=roce) as ep:
        got = ep.c_config()
        wrong = _wrong(got, _want_nic(rec, roce, got["rate_bps"]))
        assert not wrong, f"C struct field: (in C, declared): {wrong}"
        assert ep.config["cc"] == ("dcqcn" if roce else DECLARED["nic"]["cc"])
        if roce:
            assert ep.config["qps"] == DECLARED["nic"]["roce_qps"]


@pytest.mark.parametrize("transport", ["ethplus", "roce"])
def test_a_jobs_workers_run_with_every_nic_setting(settings_lab, transport, tmp_path):
    """The settings reach the engines of a job's worker processes (in their
    namespaces), and the result records them."""
    out = tmp_path / "r.json"
    ethplus("bench", "all-reduce", "--lab", settings_lab, "--transport", transport,
            "--sizes", "64K", "--iters", "1", "--warmup", "0", "--json", str(out),
            check=True)  # fmt: skip
    got = json.loads(out.read_text())["transport_config"]["c_config"]
    rec = registry.load_lab(settings_lab)
    wrong = _wrong(got, _want_nic(rec, transport == "roce", got["rate_bps"]))
    assert not wrong, f"a worker's C struct field: (in C, declared): {wrong}"


def test_kernel_tcps_timers_reach_every_accelerators_routes(settings_lab):
    """[tcp] rto_min_us x k, congestion_control, ecn and quickack on every
    route of every accelerator's namespace."""
    rec = registry.load_lab(settings_lab)
    want_ms = min(round(DECLARED["tcp"]["rto_min_us"] * K / 1000), 120_000)
    hosts = [n for n in rec["topology"]["nodes"] if n["role"] == "host"]
    for node in hosts:
        ns = os.path.basename(rec["namespaces"][node["name"]])
        out = subprocess.run(["ip", "-n", ns, "route", "show"], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        via = [line for line in out.splitlines() if " via " in line]  # one per plane
        assert len(via) == len(node["ports"]), (node["name"], out)
        for line in via:
            m = re.search(r"rto_min (?:lock )?(\d+)(ms|s)\b", line)
            assert m, (node["name"], line)
            got_ms = int(m.group(1)) * (1000 if m.group(2) == "s" else 1)
            assert got_ms == want_ms, (node["name"], line, want_ms)
            assert f"congctl {DECLARED['tcp']['congestion_control']} " in line + " ", line
            assert ("features ecn" in line) == DECLARED["tcp"]["ecn"], line
            assert ("quickack 1" in line) == DECLARED["tcp"]["quickack"], line


_SIDE = """
import socket, sys
TCPI_OPT_ECN = 8
if sys.argv[1] == "serve":
    ls = socket.create_server((sys.argv[2], 5999))
    print("listening", flush=True)
    c, _ = ls.accept()
else:
    c = socket.create_connection((sys.argv[2], 5999))
cc = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\\0").decode()
info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
print(cc, bool(info[5] & TCPI_OPT_ECN), flush=True)
c.sendall(b"x")
c.recv(1)
"""


def test_a_labs_tcp_connections_use_its_congestion_control_not_the_hosts(settings_lab):
    """A real connection between two accelerators, both ends, runs the lab
    file's congestion control with ECN agreed, whatever the host's sysctl
    (this machine's default is bbr; the lab asks for another)."""
    rec = registry.load_lab(settings_lab)
    hosts = sorted((n for n in rec["topology"]["nodes"] if n["role"] == "host"),
                   key=lambda n: n["index"])  # fmt: skip
    ns = [os.path.basename(rec["namespaces"][h["name"]]) for h in hosts[:2]]
    ip = hosts[1]["ports"][0]["ip"]
    py = [sys.executable, "-I", "-c", _SIDE]
    sides = []
    try:
        for netns, role in ((ns[1], "serve"), (ns[0], "connect")):
            sides.append(subprocess.Popen(["ip", "netns", "exec", netns, *py, role, ip],
                                          stdout=subprocess.PIPE, text=True))  # fmt: skip
            if role == "serve":
                assert sides[0].stdout.readline().strip() == "listening"
        want = f"{DECLARED['tcp']['congestion_control']} {DECLARED['tcp']['ecn']}"
        for side in sides:
            out, _ = side.communicate(timeout=60)
            assert side.returncode == 0 and out.split("\n")[-2] == want, (out, want)
    finally:
        for side in sides:
            side.kill()
            side.wait()


def test_lab_show_settings_lists_every_declared_key_with_its_value(settings_lab):
    r = ethplus("lab", "show", settings_lab, "--settings", check=True)
    rows = {line.split()[0]: line.split()[1] for line in r.stdout.splitlines()[1:] if line}
    for sec, fields in labfile.schema("erack").items():
        for key in fields:
            assert f"{sec}.{key}" in rows, f"{sec}.{key} missing from lab show --settings"
    for sec, values in DECLARED.items():
        for key, v in values.items():
            shown = rows[f"{sec}.{key}"]
            assert shown == (f"{v:g}" if isinstance(v, float) else _toml(v)), (key, shown, v)


def test_every_link_setting_reaches_the_fabric_and_the_interfaces(settings_lab):
    """[link] on every host link, as the fabric holds it (nominal: what it
    shapes and paces each port with) and the MTU on both ends' interfaces."""
    rec = registry.load_lab(settings_lab)
    want = DECLARED["link"]
    hosts = {n["name"]: n for n in rec["topology"]["nodes"] if n["role"] == "host"}
    for node in hosts.values():
        for port in node["ports"]:
            query = {"op": "link", "link": port["link"], "set": {}}
            got = labs.control(settings_lab, query)["link"]
            assert got["rate_bps"] == want["rate_gbps"] * 1e9, (port["link"], got)
            for key in ("delay_ns", "jitter_ns", "buffer_bytes", "llr"):
                assert got[key] == want[key], (port["link"], key, got)
            ns = os.path.basename(rec["namespaces"][node["name"]])
            out = subprocess.run(["ip", "-n", ns, "link", "show", port["ifname"]],
                                 capture_output=True, text=True, check=True).stdout  # fmt: skip
            assert f" mtu {want['mtu_bytes']} " in out, out


def test_the_report_says_how_far_tcp_can_back_off_at_this_k():
    """The kernel caps an RTO at 120 s real: at a larger k fewer doublings of
    the (scaled) minimum fit under it, which the report states."""
    rec = {**labfile.load(LAB_FILES / "erack-8x4.toml").to_dict(), "tcp": {"rto_min_us": 1000.0}}
    notes = {k: " ".join(kernel.tcp_timer_notes({**rec, "time_scale": k})) for k in (6400, 122880)}
    assert "18750 us nominal at this k: 4 doublings" in notes[6400]
    assert "976.562 us nominal at this k: 0 doublings" in notes[122880]


def test_a_connection_held_back_by_its_peers_window_is_counted_and_reported():
    """A receiver that does not read: its sender's time held back by the
    receive window comes from the kernel (TCP_INFO), and the report says
    it (a lost window update waits for the zero-window probe, timed by the
    RTO).  On loopback: the kernel's own TCP, no lab needed."""
    import socket
    import time

    from dataplane.report import fidelity

    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    peer, _ = srv.accept()
    try:
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        cli.setblocking(False)
        chunk, deadline = b"x" * 65536, time.monotonic() + 10
        while time.monotonic() < deadline:  # until the peer's window is shut
            try:
                cli.send(chunk)
            except BlockingIOError:
                time.sleep(0.05)
                if kernel.tcp_info(cli).get("tcp_rwnd_limited_us", 0) > 0:
                    break
        got = kernel.tcp_info(cli)
        assert got["tcp_rwnd_limited_us"] > 0, got
        assert kernel.tcp_info(peer)["tcp_rwnd_limited_us"] == 0  # it sent nothing
        text = fidelity.kernel_tcp_text({"tcp_retx_segs": 0, **got})
        assert "held back by the receivers' windows" in text, text
    finally:
        for s in (cli, peer, srv):
            s.close()


def test_a_namespaces_zero_window_probes_are_counted_in_that_namespace_alone():
    """A receiver that never reads, in one namespace: its sender's
    zero-window probes (timed by the RTO) are counted in that namespace's
    own counters (what the fidelity report adds over a job's hosts), and
    not in another namespace's."""
    import socket
    import time

    from dataplane.lab import core
    from dataplane.report import fidelity

    names = [f"ethp{RUN_ID}zw{i}" for i in range(2)]
    paths = [f"/run/netns/{n}" for n in names]
    socks: list[socket.socket] = []
    try:
        for n in names:
            subprocess.run(["ip", "netns", "add", n], check=True)
            subprocess.run(["ip", "-n", n, "link", "set", "lo", "up"], check=True)
        before = [kernel.netns_tcp_counts(p) for p in paths]
        assert before[0].get("tcp_win_probes") == 0, before  # a new namespace counts from 0
        # every counter the report names, this kernel has (a misspelt one would be missing)
        assert set(before[0]) == {name for name, _ in kernel._NETSTAT_FIELDS}, before

        def sock() -> socket.socket:
            fd = core.netns_socket(paths[0], socket.AF_INET, socket.SOCK_STREAM)
            s = socket.socket(fileno=fd)
            socks.append(s)
            return s

        srv = sock()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # before the handshake
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        cli = sock()
        cli.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        cli.connect(srv.getsockname())
        peer, _ = srv.accept()
        socks.append(peer)
        cli.setblocking(False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the receiver never reads
            try:
                cli.send(b"x" * 65536)
            except BlockingIOError:
                if kernel.netns_tcp_counts(paths[0])["tcp_win_probes"] > 0:
                    break
                time.sleep(0.05)
        got = kernel.netns_tcp_counts(paths[0])
        assert got["tcp_zero_window_adv"] > 0 and got["tcp_win_probes"] > 0, got
        assert kernel.netns_tcp_counts(paths[1]) == before[1]
        text = fidelity.kernel_tcp_text({"tcp_retx_segs": 0, **got})
        assert f"{got['tcp_win_probes']} zero-window probes" in text, text
    finally:
        for s in socks:
            s.close()
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def test_past_the_k_where_120_s_caps_the_minimum_rto_a_report_says_tcp_is_not_the_labs():
    """A lab's 1 ms nominal minimum RTO is 120 s real at k 120,000: past
    that the kernel's cap cuts it (at 138,240, 868 us nominal) and a pinned
    comparison says so, with the k up to which TCP is still the lab's
    (bench_fidelity and bench_scenarios pin below it, or warn)."""
    rec = {"tcp": {"rto_min_us": 1000.0}}
    assert kernel.tcp_rto_min_k_cap(1000.0) == 120_000
    assert kernel.tcp_rto_capped_note(rec, 100_000) == ""
    note = kernel.tcp_rto_capped_note(rec, 138_240)
    assert "868 us nominal, not the lab's 1000 us" in note and "k=120000" in note, note


def test_the_report_says_cubic_grows_on_real_time_and_reno_does_not():
    """Linux's cubic regrows its window on a real-time curve, so at a larger
    k it takes fewer round trips and, without ECN, loses more (measured:
    4.1x the segments resent at 4x k, where reno resent 1.05x, and cubic
    with ECN 5 and 4); the report says so for cubic, not for reno, and
    names the cure that the lab does not use."""

    def notes(cc: str, ecn: bool) -> str:
        rec = labfile.load(LAB_FILES / "clos-16.toml").to_dict()
        rec.update(tcp={"congestion_control": cc, "ecn": ecn}, time_scale=6400)
        return " ".join(kernel.tcp_timer_notes(rec))

    assert "cubic's window growth runs on real time" in notes("cubic", False)
    assert "loses more (`[tcp] ecn = true`" in notes("cubic", False)
    assert "ECN (asked for) stops it" in notes("cubic", True)
    assert "loses more" not in notes("cubic", True)
    assert "its marks and its share of a congested link do" in notes("cubic", True)
    assert "window growth runs on real time" not in notes("reno", False)
    assert "reno grows its window per round trip" in notes("reno", True)


def _cubic_regrowth_leader(rec: dict, k: float) -> str:
    """Which of Linux's cubic's two windows is back at the last maximum W
    first after a cut to beta W, at time scale k: 'curve' (C (t - K)^3 + W,
    t in real seconds since the cut, one round trip = base RTT x k) or
    'estimate' (its reno-friendly window, 3 (1 - beta) / (1 + beta) segments
    more each round trip)."""
    w = kernel.cubic_window_segments(rec)
    beta, c = kernel.CUBIC_BETA, kernel.CUBIC_C
    k_s = ((1 - beta) * w / c) ** (1 / 3)
    rtt_real_s = rec["topology"]["base_rtt_ns"] * k / 1e9
    est = beta * w
    for n in range(1, 100_000):
        est += 3 * (1 - beta) / (1 + beta)
        curve = c * (n * rtt_real_s - k_s) ** 3 + w
        if curve >= w or est >= w:
            return "curve" if curve > est else "estimate"
    raise AssertionError("neither regrew")


@pytest.mark.parametrize("lab", ["erack-8x4", "clos-16"])
def test_the_report_says_up_to_which_k_cubic_regrows_as_on_the_real_fabric(lab):
    """Below cubic_k_max, cubic's reno-friendly estimate regrows a cut window
    before its real-time curve does (as on the real fabric, k = 1); above
    it, the curve first: cubic pushes harder than on the fabric it stands
    for.  clos-16's 10 us round trip puts that below the floor k (a flow
    filling a link: 145 segments); erack-8x4's 2 us at about 85,000."""
    rec = labfile.load(LAB_FILES / f"{lab}.toml").to_dict()
    k_max = kernel.cubic_k_max(rec)
    assert _cubic_regrowth_leader(rec, 1) == "estimate"
    assert _cubic_regrowth_leader(rec, 0.9 * k_max) == "estimate"
    assert _cubic_regrowth_leader(rec, 1.1 * k_max) == "curve"
    assert (k_max < 6400) == (lab == "clos-16"), k_max
    rec.update(tcp={"congestion_control": "cubic", "ecn": True}, time_scale=6400)
    assert f"holds up to k={k_max:.3g} only" in " ".join(kernel.tcp_timer_notes(rec))
