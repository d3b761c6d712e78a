"""The fabric clock: one time scale a running lab's fabric, host shapers and
NIC engines all follow, changed at run time (`ethplus lab scale`) without
losing a byte, and nominal time that runs on without a jump."""

import hashlib
import threading
import time

import numpy as np
import pytest
from conftest import ethplus
from labtools import Lab, module_lab

from dataplane.lab.clock import REPORTS, Clock
from dataplane.lab.core import ffi, lib
from dataplane.lab.nic import Endpoint

pytestmark = pytest.mark.root

MiB = 1 << 20

# k forced up and down, as multiples of the lab's own: each change lands
# while the transfers are still under way (they take seconds at any of them)
STEPS = (2.0, 4.0, 1.0, 3.0, 1.5)


erack = module_lab("clock", "erack-8x4")


def _scale(lab: Lab, k: float) -> None:
    ethplus("lab", "scale", lab.name, f"{k:g}", check=True)


def _forcing(lab: Lab, done: threading.Event, seen: list) -> threading.Thread:
    """A thread that moves k through STEPS while done is unset, then back."""

    def run():
        clk = Clock(lab.name)
        try:
            for m in STEPS:
                if done.wait(0.4):
                    break
                _scale(lab, lab.k * m)
                seen.append((clk.k, clk.nominal_ns()))
        finally:
            clk.close()

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.fixture
def two_mappings(tmp_path):
    """A clock page mapped twice (two processes' engines), and its union of
    late spans (any_late_ns) as a function."""
    err = ffi.new("int *")
    path = str(tmp_path / "clock").encode()
    a = ffi.gc(lib.ethp_clock_map(path, 1, 1000.0, err), lib.ethp_clock_unmap)
    b = ffi.gc(lib.ethp_clock_map(path, 0, 0.0, err), lib.ethp_clock_unmap)
    out = ffi.new("uint64_t[]", lib.ETHP_CLOCK_NREPORTS)

    def union_ns() -> int:
        lib.ethp_clock_reports(a, out)
        return dict(zip(REPORTS, out, strict=True))["any_late_ns"]

    return a, b, union_ns


def test_engines_late_spans_count_once_however_many_engines_were_late(two_mappings):
    """The clock's any_late_ns is the union of the spans engines report
    they ran behind (a collective waits for its slowest rank): spans that
    overlap count once, disjoint ones add, and one inside another adds
    nothing; two mappings of the page (two processes' engines) share it."""
    a, b, union_ns = two_mappings
    lib.ethp_clock_report_late(a, 1_000, 3_000)
    lib.ethp_clock_report_late(b, 2_000, 5_000)  # overlaps: adds 3000..5000
    assert union_ns() == 4_000
    lib.ethp_clock_report_late(a, 3_500, 4_500)  # inside: nothing new
    assert union_ns() == 4_000
    lib.ethp_clock_report_late(b, 10_000, 11_000)  # apart: adds all of it
    assert union_ns() == 5_000


def test_a_stall_reported_after_later_spans_counts_whole(two_mappings):
    """A frozen engine reports its stall when it wakes, after other engines
    reported shorter spans that ended later: the union still takes all of
    its stall that nobody else covered.  (It took only what came after the
    latest end: CI saw a 1 s freeze counted 0.11 s.)  Many disjoint spans
    later, spans out of order still count once."""
    a, b, union_ns = two_mappings
    lib.ethp_clock_report_late(b, 900_000, 910_000)  # a peer, late now and then
    lib.ethp_clock_report_late(b, 990_000, 1_000_000)
    lib.ethp_clock_report_late(a, 0, 1_000_500)  # the frozen one wakes
    assert union_ns() == 1_000_500
    lib.ethp_clock_report_late(b, 950_000, 960_000)  # inside it: nothing new
    assert union_ns() == 1_000_500
    # 200 disjoint spans (more than the page keeps apart), then each again
    base = 2_000_000
    for i in range(200):
        lib.ethp_clock_report_late(b, base + 100 * i, base + 100 * i + 50)
    assert union_ns() == 1_000_500 + 200 * 50
    for i in reversed(range(150, 200)):  # the latest ones, out of order: covered
        lib.ethp_clock_report_late(a, base + 100 * i + 10, base + 100 * i + 40)
    assert union_ns() == 1_000_500 + 200 * 50


def test_a_real_and_nominal_reading_are_of_one_instant(tmp_path):
    """Clock.now() reads real time once and derives nominal from it, so a
    run's real and nominal durations agree to the clock's 1 ns grain (two
    readings would differ by any preemption between them: a bench row's
    nominal time once came out 0.1% off its real time / k on a busy CI)."""
    err = ffi.new("int *")
    path = str(tmp_path / "clock").encode()
    c = ffi.gc(lib.ethp_clock_map(path, 1, 1000.0, err), lib.ethp_clock_unmap)
    clk = Clock.__new__(Clock)
    clk._c = c
    readings = [clk.now() for _ in range(20_000)]
    (r0, n0) = readings[0]
    for r, n in readings[1:]:
        assert abs((n - n0) - (r - r0) / 1000) < 3e-9, (r - r0, n - n0)


def test_lab_scale_moves_the_clock_and_nominal_time_runs_on(erack):
    lab = erack
    clk = Clock(lab.name)
    try:
        gen0, n0 = clk.gen, clk.nominal_ns()
        assert clk.k == lab.k
        try:
            _scale(lab, lab.k * 8)
            assert clk.k == lab.k * 8 and clk.gen == gen0 + 1
            n1 = clk.nominal_ns()
            _scale(lab, lab.k)
            assert clk.gen == gen0 + 2
            # nominal time never goes back, across both changes
            assert n0 <= n1 <= clk.nominal_ns()
            assert Lab(lab.name).k == lab.k  # the record follows too
        finally:
            _scale(lab, lab.k)
    finally:
        clk.close()


@pytest.mark.parametrize("k", ["0.5", "nan", "2e9"])
def test_lab_scale_refuses_a_k_out_of_range(erack, k):
    r = ethplus("lab", "scale", erack.name, k)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "time scale" in r.stderr
    assert Clock(erack.name).k == erack.k


def test_nic_transfer_stays_byte_exact_while_k_moves_up_and_down(erack):
    lab = erack
    a, b = Endpoint(lab.name, "h0"), Endpoint(lab.name, "h1")
    done, seen = threading.Event(), []
    try:
        size = 64 * MiB
        src = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8)
        dst = np.zeros(size, dtype=np.uint8)
        hr = b.post_recv(a.rank, 5, dst)
        hs = a.post_send(b.rank, 5, src)
        forcer = _forcing(lab, done, seen)
        try:
            assert a.wait(hs, 600) == size
            assert b.wait(hr, 600) == size
        finally:
            done.set()
            forcer.join()
        assert len(seen) >= 2, "the transfer ended before k moved twice: make it longer"
        assert hashlib.sha256(dst).digest() == hashlib.sha256(src).digest()
        # both engines followed the clock, and come to its k now (an idle
        # engine looks at the clock every 50 ms)
        assert a.counters()["rescales"] >= 1 and b.counters()["rescales"] >= 1
        k = Clock(lab.name).k
        deadline = time.monotonic() + 10
        while {a.time_scale, b.time_scale} != {k} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.time_scale == b.time_scale == k
    finally:
        _scale(lab, lab.k)
        a.close()
        b.close()


SERVER = """
import hashlib, socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5301)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); h = hashlib.sha256(); n = 0
while chunk := c.recv(1 << 20):
    h.update(chunk); n += len(chunk)
print(n, h.hexdigest(), flush=True)
"""

CLIENT = """
import socket, sys, numpy as np
data = np.random.default_rng(11).integers(0, 256, int(sys.argv[2]), dtype=np.uint8).tobytes()
c = socket.create_connection((sys.argv[1], 5301), timeout=600); c.sendall(data); c.close()
"""


def test_kernel_tcp_transfer_stays_byte_exact_while_k_moves(erack, tmp_path):
    import subprocess
    import sys

    lab = erack
    size = 32 * MiB  # seconds at any of STEPS (8 MiB ended too soon without host drops)
    want = hashlib.sha256(
        np.random.default_rng(11).integers(0, 256, size, dtype=np.uint8).tobytes()
    ).hexdigest()
    ip = next(p["ip"] for p in lab.nodes["h1"]["ports"] if p["plane"] == 0)
    ns = {h: lab.rec["namespaces"][h].rsplit("/", 1)[1] for h in ("h0", "h1")}
    py = [sys.executable, "-I", "-c"]
    server = subprocess.Popen(
        ["ip", "netns", "exec", ns["h1"], *py, SERVER, ip], stdout=subprocess.PIPE, text=True
    )
    done, seen = threading.Event(), []
    try:
        assert server.stdout.readline().strip() == "ready"
        forcer = _forcing(lab, done, seen)
        try:
            subprocess.run(
                ["ip", "netns", "exec", ns["h0"], *py, CLIENT, ip, str(size)],
                check=True, timeout=900,
            )  # fmt: skip
        finally:
            done.set()
            forcer.join()
        got = server.stdout.readline().split()
        assert got == [str(size), want]
        assert len(seen) >= 2, "the transfer ended before k moved twice: make it longer"
    finally:
        server.kill()
        server.wait()
        _scale(lab, lab.k)


def _uplink_queue(lab: Lab, host: str) -> tuple[int, int]:
    """host's plane-0 uplink shaper: its rate (bytes/s) and queue (bytes)."""
    from dataplane.lab import kernel

    port = next(p for p in lab.nodes[host]["ports"] if p["plane"] == 0)
    with kernel.ns_ipr(lab.rec["namespaces"][host]) as ipr:
        index = ipr.link_lookup(ifname=port["ifname"])[0]
        q = next(m for m in ipr.get_qdiscs(index=index) if m.get_attr("TCA_KIND") == "tbf")
        parms = q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
        return parms["rate"], parms["limit"]


def test_a_hosts_uplink_queue_holds_the_same_frames_at_any_k(erack):
    """The rate follows k; the queue (bytes) does not: a NIC's queue holds
    frames.  (It held 100 ms of real time once: at a large k kernel TCP
    overflowed it and timed out where it did not at a small k.)"""
    lab = erack
    rate0, limit0 = _uplink_queue(lab, "h3")
    try:
        _scale(lab, lab.k * 8)
        rate1, limit1 = _uplink_queue(lab, "h3")
    finally:
        _scale(lab, lab.k)
    assert rate1 == pytest.approx(rate0 / 8, rel=0.01)
    assert limit1 == limit0 >= 1000 * 1500


def test_frames_a_host_sends_beyond_its_queue_are_counted(erack):
    """A burst of UDP far beyond the uplink's rate and queue: the shaper drops
    the excess in the host, and the fabric's stats count it for that host
    (the fidelity report shows them as `host uplinks`)."""
    import subprocess
    import sys

    from dataplane.run.job import fabric_stats

    lab = erack
    before = fabric_stats(lab.name)["hosts"]["h4"]["uplink_drops"]
    ip = next(p["ip"] for p in lab.nodes["h5"]["ports"] if p["plane"] == 0)
    blast = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.setsockopt(socket.SOL_SOCKET, 32, 64 << 20)  # SO_SNDBUFFORCE: past the queue\n"
        "for _ in range(3000):\n"
        "    try:\n"
        "        s.sendto(bytes(4000), (sys.argv[1], 5302))\n"
        "    except OSError:\n"
        "        pass\n"
    )
    ns = lab.rec["namespaces"]["h4"].rsplit("/", 1)[1]
    subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-I", "-c", blast, ip],
                   check=True, timeout=60)  # fmt: skip
    after = fabric_stats(lab.name)["hosts"]["h4"]["uplink_drops"]
    assert after - before > 0


FROZEN_RECEIVER = """
import sys
import numpy as np
from dataplane.lab.nic import Endpoint
ep = Endpoint(sys.argv[1], sys.argv[2])
dst = np.zeros(int(sys.argv[4]), dtype=np.uint8)
h = ep.post_recv(int(sys.argv[3]), 7, dst)
print("ready", flush=True)
n = ep.wait(h, 120)
print(n, int(dst.astype(np.uint64).sum()), flush=True)
ep.close()
"""


def test_an_engine_frozen_with_nothing_due_counts_as_behind_while_frames_wait(erack):
    """A receiver's process frozen (SIGSTOP) for a second with a receive
    posted and nothing of its own due: no timer of its engine ran late, but
    the frames sent to it meanwhile waited in its RX ring, and that second
    is in the lab's union of stalls (a bench's `some NIC engine was behind`).
    Before, the engine woke with nothing due and counted nothing (CI saw a
    frozen rank counted 0.39 s of its second)."""
    import signal
    import subprocess
    import sys

    lab, size = erack, 256 * 1024
    src = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
    with Endpoint(lab.name, "h6") as a:
        rx = subprocess.Popen(
            [sys.executable, "-c", FROZEN_RECEIVER, lab.name, "h7", str(a.rank), str(size)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        clk = Clock(lab.name)
        try:
            assert rx.stdout.readline().strip() == "ready"
            time.sleep(0.2)  # into its idle wait
            late0 = clk.reports()["any_late_ns"]
            rx.send_signal(signal.SIGSTOP)
            h = a.post_send(int(lab.nodes["h7"]["index"]), 7, src)
            time.sleep(1.0)
            rx.send_signal(signal.SIGCONT)
            assert a.wait(h, 120) == size
            n, total = map(int, rx.stdout.readline().split())
            late_s = (clk.reports()["any_late_ns"] - late0) / 1e9
        finally:
            rx.kill()
            rx.wait()
            clk.close()
    assert n == size and total == int(src.astype(np.uint64).sum())
    assert 0.7 < late_s < 1.5, late_s
