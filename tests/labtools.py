"""Helpers for tests that drive real frames through a running lab.

Ground truth comes from the kernel (interface statistics over netlink) and
from frames captured with AF_PACKET in the hosts' namespaces, never from the
switch's own bookkeeping alone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import RUN_ID, ethplus

from dataplane.lab import core, kernel
from dataplane.lab.nic import Endpoint
from dataplane.report import stats
from dataplane.run import job

MiB = 1 << 20


@dataclass
class HostPort:
    ns: str
    ifname: str
    mac: bytes
    ip: int
    gw_mac: bytes
    ep: int


class Lab:
    """A running lab seen from outside: its record, its hosts' ports, its counters."""

    def __init__(self, name: str):
        self.name = name
        self.rec = json.loads(ethplus("lab", "show", name, "--json", check=True).stdout)
        self.nodes = {n["name"]: n for n in self.rec["topology"]["nodes"]}
        self.links = {lk["name"]: lk for lk in self.rec["topology"]["links"]}
        self.k = self.rec["time_scale"]

    def port(self, host: str, peer: str | None = None, plane: int = 0) -> HostPort:
        node = self.nodes[host]
        p = next(
            p for p in node["ports"] if (peer is None and p["plane"] == plane) or p["peer"] == peer
        )
        sw = self.nodes[p["peer"]]
        gw = next(q for q in sw["ports"] if q["link"] == p["link"])
        return HostPort(
            ns=self.rec["namespaces"][host],
            ifname=p["ifname"],
            mac=bytes.fromhex(p["mac"].replace(":", "")),
            ip=int(ipaddress.IPv4Address(p["ip"])),
            gw_mac=bytes.fromhex(gw["mac"].replace(":", "")),
            ep=node["index"],
        )

    def stats(self) -> dict:
        return json.loads(ethplus("lab", "stats", self.name, "--json", check=True).stdout)

    def totals(self) -> dict[str, int]:
        return stats.totals(self.stats())

    def quiesce(self, timeout_s: float = 20.0) -> dict:
        """Wait until no frame is queued or on a wire inside any switch."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.stats()
            t = stats.totals(st)
            if t.get("q_frames", 0) + t.get("wire_frames", 0) == 0 or time.monotonic() > deadline:
                time.sleep(0.05)
                return self.stats()
            time.sleep(0.05)

    def link_set(self, link: str, *change: str) -> None:
        ethplus("link", "set", self.name, link, *change, check=True)

    def sh(self, host: str, *cmd: str, timeout: float = 60, check: bool = True):
        return subprocess.run(
            ["ip", "netns", "exec", self.rec["namespaces"][host].rsplit("/", 1)[1], *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )


def if_stats(ns: str, ifname: str) -> dict[str, int]:
    """The kernel's counters of an interface (IFLA_STATS64)."""
    with kernel.ns_ipr(ns) as ipr:
        link = ipr.link("get", ifname=ifname)[0]
        return dict(link.get("IFLA_STATS64"))


def ethp_frame(
    src: HostPort,
    dst: HostPort,
    *,
    size: int = 1000,
    entropy: int = 0,
    psn: int = 0,
    flags: int = 0,
    tos: int = 0,
    compact: bool = False,
    dst_port: int = core.UDP_PORT,
    src_port: int | None = None,
) -> bytes:
    """An ETH+ data frame from src to dst, addressed as a host NIC would."""
    addr = core.Addr(
        dst_mac=src.gw_mac,
        src_mac=src.mac,
        src_ip=src.ip,
        dst_ip=dst.ip,
        src_port=entropy if src_port is None else src_port,
        dst_port=dst_port,
        tos=tos,
    )
    hdr = core.Header(
        flags=flags,
        entropy=entropy,
        src_ep=src.ep,
        dst_ep=dst.ep,
        psn=psn,
        len_bytes=size,
        tos=tos,
    )
    payload = (bytes(range(256)) * (size // 256 + 2))[psn & 0xFF : (psn & 0xFF) + size]
    return core.build_frame(addr, hdr, payload, compact=compact)


def send_paced(
    port: core.Port, pool: core.Pool, frames: list[bytes], rate_bps: float, burst: int = 16
) -> None:
    """Send frames in bursts, no faster than rate_bps on average (so the host's
    own qdisc never drops: the test measures the switch, not tc)."""
    t0 = time.monotonic()
    sent_bytes = 0
    for i in range(0, len(frames), burst):
        chunk = frames[i : i + burst]
        n = 0
        while n < len(chunk):
            n += port.send(chunk[n:], pool)
            if n < len(chunk):
                time.sleep(0.001)
        sent_bytes += sum(map(len, chunk))
        ahead = sent_bytes * 8 / rate_bps - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)


def assert_missed_only_by_ring(missing: int, ring_drops: int, why: object = None) -> None:
    """A count that fell short of the frames sent, by no more than a receive
    ring dropped: such a frame never reached what counts (its reader was
    kept off the CPU by the machine), and none is counted twice."""
    assert 0 <= missing <= ring_drops, why if why is not None else (missing, ring_drops)


class Capture:
    """Frames arriving at a host port, read from an AF_PACKET ring by a thread
    from the moment it is made (a TPACKET_V3 ring retires a block per timeout,
    so a trickle of frames fills the ring unless someone keeps reading)."""

    def __init__(self, hp: HostPort):
        self.pool = core.Pool(8192, 9300)
        self.port = core.Port(hp.ifname, hp.ns, core.PortConfig(block_bytes=1 << 16, n_blocks=1024))
        self.frames: list[bytes] = []
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.port.wait(10):
                got = self.port.recv(self.pool, 256)
                if got:
                    self.frames += got
                    self.last = time.monotonic()

    def drain(self, quiet_s: float = 0.3, timeout_s: float = 30.0) -> list[bytes]:
        """Wait until nothing arrived for quiet_s, then stop reading."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and time.monotonic() - self.last < quiet_s:
            time.sleep(0.02)
        self._stop.set()
        self._thread.join()
        assert self.port.counters()["rx_ring_drops"] == 0, "the capture itself lost frames"
        return self.frames

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.port.close()


@contextlib.contextmanager
def lab_up_down(name: str, file: str, *extra: str):
    """Lab `name` from `file` for a with block (a module fixture's body),
    removed after it even when a test failed.  Gives the name."""
    ethplus("lab", "up", file, "--name", name, *extra, check=True)
    try:
        yield name
    finally:
        ethplus("lab", "down", name)


@contextlib.contextmanager
def shipped_lab(tag: str, file: str):
    """Shipped lab `file` (e.g. "erack-8x4") for a with block, under a name
    unique to this run and to the module's `tag`.  Gives the name."""
    with lab_up_down(f"{RUN_ID}-{tag}-{file.split('-')[0]}", file) as name:
        yield name


def running_lab(tag: str, file: str):
    """The body of a module fixture: shipped lab `file` as a Lab, removed
    afterwards (see shipped_lab)."""
    with shipped_lab(tag, file) as name:
        yield Lab(name)


def module_lab(tag: str, file: str, *, name_only: bool = False):
    """A module-scoped fixture (assign it to the fixture's name): shipped lab
    `file` for the whole module, as a Lab (or its name, name_only), removed
    afterwards whatever happens (see shipped_lab)."""

    @pytest.fixture(scope="module")
    def fixture():
        if name_only:
            with shipped_lab(tag, file) as name:
                yield name
        else:
            yield from running_lab(tag, file)

    return fixture


def shared_lab(fixture_name: str, *, name_only: bool = False):
    """A module's name for one of conftest's session-wide labs (assign it to
    the fixture's name), as a Lab or its name (name_only)."""

    @pytest.fixture(scope="module")
    def fixture(request):
        lab = request.getfixturevalue(fixture_name)
        return lab.name if name_only else lab

    return fixture


def ethp_frames(frames: list[bytes]) -> list[core.Parsed]:
    """The ETH+ frames among frames (captured, say), parsed; the rest left out."""
    out = []
    for f in frames:
        try:
            p = core.parse_frame(f)
        except core.WireError:
            continue
        if p.header is not None:
            out.append(p)
    return out


def capture_cli(lab: Lab, link: str, *extra: str) -> subprocess.Popen:
    """`ethplus capture` running, its rings open (it said so on stderr)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "capture", lab.name, link, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert p.stderr.readline().startswith(f"capturing {link}"), p.communicate()
    return p


def incast(lab: Lab, cc: str, size: int = 16 * MiB) -> dict:
    """Four senders into one receiver's four planes, byte exact; the deepest
    egress queue of the lab, the receiver's count of its senders and the
    first sender's credit, sampled every 20 ms while it runs."""
    dst = Endpoint(lab.name, "h7", cc=cc)
    senders = [Endpoint(lab.name, h, cc=cc) for h in ("h0", "h2", "h4", "h6")]
    try:
        st0 = job.fabric_stats(lab.name)
        srcs = {s.rank: np.full(size, s.rank + 1, dtype=np.uint8) for s in senders}
        bufs = {s.rank: np.zeros(size, dtype=np.uint8) for s in senders}
        t0 = time.perf_counter()
        hr = {s.rank: dst.post_recv(s.rank, 900, bufs[s.rank]) for s in senders}
        hs = {s.rank: s.post_send(dst.rank, 900, srcs[s.rank]) for s in senders}
        depths, rx_senders, credit, done = [], [], [], threading.Event()

        def sample():
            while not done.is_set():
                st = job.fabric_stats(lab.name)
                depths.append(max(p["q_bytes"] for w in st["switches"].values()
                                  for p in w["ports"].values()))  # fmt: skip
                rx_senders.append(dst.counters()["rx_senders"])
                credit.append(senders[0].counters(dst.rank)["credit_bytes"])
                time.sleep(0.02)

        t = threading.Thread(target=sample)
        t.start()
        try:
            for s in senders:
                assert s.wait(hs[s.rank], 120) == size
                assert dst.wait(hr[s.rank], 120) == size
        finally:
            done.set()
            t.join()
        goodput = 4 * size * 8 / (time.perf_counter() - t0)
        for s in senders:
            assert np.array_equal(bufs[s.rank], srcs[s.rank])
        st1 = job.fabric_stats(lab.name)

        def moved(key):
            return sum(p[key] for w in st1["switches"].values() for p in w["ports"].values()) - sum(
                p[key] for w in st0["switches"].values() for p in w["ports"].values()
            )

        c = [s.counters(dst.rank) for s in senders]
        return {
            "goodput_bps": goodput,
            "queue_mean_bytes": statistics.mean(depths),
            "rx_senders_mode": statistics.mode(rx_senders),
            "credit_mode_bytes": statistics.mode(credit),
            "bdp_bytes": senders[0].config["bdp_bytes"],
            "retx_nack": sum(x["retx_nack"] for x in c),
            "trimmed": moved("trimmed"),
            "int_stamped": moved("int_stamped"),
            "int_acks": sum(x["int_acks"] for x in c),
            "int_hops_max": max(x["int_hops_max"] for x in c),
        }
    finally:
        for e in (*senders, dst):
            e.close()
