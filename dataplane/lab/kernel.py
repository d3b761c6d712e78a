"""Kernel objects of a lab: namespaces, veth pairs, addresses, routes.

pyroute2 does the netlink work, always through its synchronous API on worker
threads (its asyncio sockets do not run on uvloop).  Sockets inside a lab
namespace are opened by the C core, which enters the namespace on the calling
thread only and comes back, so no process is forked per namespace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from dataplane.lab import core
from dataplane.scale import Scale

IFF_UP = 0x1
MARKER_PREFIX = "ethplus:"  # alias of `lo` in every namespace a lab made


def marker(lab: str) -> str:
    return f"{MARKER_PREFIX}{lab}"


@dataclass(frozen=True)
class VethSpec:
    """One veth pair, both ends created directly in their namespaces."""

    a_ns: str
    a_if: str
    a_mac: str
    b_ns: str
    b_if: str
    b_mac: str
    mtu_bytes: int


@dataclass(frozen=True)
class HostPortSpec:
    """Addressing of one accelerator port: /32, permanent gateway, plane route."""

    ifname: str
    ip: str
    gateway: str
    gateway_mac: str
    subnet: str


def ns_ipr(path: str) -> IPRoute:
    """A pyroute2 IPRoute whose netlink socket lives in the namespace at path."""
    fd = core.netns_socket(path, socket.AF_NETLINK, socket.SOCK_DGRAM, 0)
    return IPRoute(fileno=fd)


def create_namespaces(paths: Iterable[str], rundir: str) -> None:
    core.netns_rundir_init(rundir)
    for p in paths:
        core.netns_create(p)
        # Before any interface exists: no IPv6 (no DAD, no router solicitations
        # adding stray frames to the lab's counters).
        core.netns_sysctl(p, "net/ipv6/conf/default/disable_ipv6", "1")
        core.netns_sysctl(p, "net/ipv6/conf/all/disable_ipv6", "1")
        # A connection's SYNs back off from the first retry, as Linux's did
        # before 6.7, not after 4 more at a fixed 1 s (its default since).
        # Those run on real time: at a large k a handshake's round trip
        # nears 1 s, and each SYN still in a queue is sent again, where on
        # the fabric it stands for (microseconds) none would be.
        with contextlib.suppress(OSError):  # (before 6.7: always backed off)
            core.netns_sysctl(p, "net/ipv4/tcp_syn_linear_timeouts", "0")


def create_veths(veths: Iterable[VethSpec]) -> None:
    """Create veth pairs from the root namespace, each end straight into its own."""
    fds: dict[str, int] = {}
    try:
        with IPRoute() as ipr:
            for v in veths:
                for ns in (v.a_ns, v.b_ns):
                    if ns not in fds:
                        fds[ns] = os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
                ipr.link(
                    "add",
                    ifname=v.a_if,
                    kind="veth",
                    net_ns_fd=fds[v.a_ns],
                    address=v.a_mac,
                    mtu=v.mtu_bytes,
                    state="up",  # the peer end comes up in configure_namespace
                    peer={
                        "ifname": v.b_if,
                        "net_ns_fd": fds[v.b_ns],
                        "address": v.b_mac,
                        "mtu": v.mtu_bytes,
                    },
                )
    finally:
        for fd in fds.values():
            os.close(fd)


def configure_namespace(
    path: str, lab: str, ifnames: list[str], host_ports: list[HostPortSpec]
) -> None:
    """Offloads off and links up on every lab interface; addressing on hosts."""
    sock = core.netns_socket(path, socket.AF_INET, socket.SOCK_DGRAM, 0)
    try:
        for ifname in ifnames:
            core.if_offloads_off(sock, ifname)
    finally:
        os.close(sock)
    with ns_ipr(path) as ipr:
        links = {x.get("IFLA_IFNAME"): x for x in ipr.link("dump")}
        ipr.link("set", index=links["lo"]["index"], state="up", ifalias=marker(lab))
        index = {}
        for ifname in ifnames:
            index[ifname] = links[ifname]["index"]
            if not links[ifname]["flags"] & IFF_UP:
                ipr.link("set", index=index[ifname], state="up")
        for hp in host_ports:
            i = index[hp.ifname]
            ipr.addr("add", index=i, address=hp.ip, prefixlen=32)
            ipr.neigh("add", dst=hp.gateway, lladdr=hp.gateway_mac, ifindex=i, state="permanent")
            ipr.route("add", dst=hp.subnet, gateway=hp.gateway, oif=i, prefsrc=hp.ip, flags=4)


def read_marker(path: str) -> str | None:
    """The alias on `lo` in a namespace: how clean recognises what it made."""
    try:
        with ns_ipr(path) as ipr:
            links = ipr.link("get", ifname="lo")
            return links[0].get("IFLA_IFALIAS") if links else None
    except (OSError, NetlinkError):
        return None


def _ns_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
        return st.st_dev, st.st_ino
    except OSError:
        return None


def pids_in(paths: Iterable[str]) -> list[int]:
    """Processes whose network namespace is one of paths."""
    wanted = {i for i in (_ns_id(p) for p in paths) if i}
    if not wanted:
        return []
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        if _ns_id(f"/proc/{entry.name}/ns/net") in wanted:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting for a parent (init, often) to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_all(pids: list[int], grace_s: float = 1.0) -> None:
    """TERM, a grace period, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if sig == signal.SIGKILL or not alive:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            alive = [p for p in alive if _alive(p)]
            if not alive:
                return
            time.sleep(0.02)
        pids = alive


@dataclass
class Removed:
    """What taking a lab's namespaces down removed."""

    namespaces: int = 0
    tcp_sockets: int = 0  # kernel TCP sockets destroyed first (a killed job's connections)

    def __iadd__(self, other: Removed) -> Removed:
        self.namespaces += other.namespaces
        self.tcp_sockets += other.tcp_sockets
        return self

    def __str__(self) -> str:
        socks = f", {self.tcp_sockets} TCP sockets destroyed" if self.tcp_sockets else ""
        return f"{self.namespaces} namespaces{socks}"


def delete_namespaces(paths: Iterable[str]) -> Removed:
    """Kill what runs inside, destroy the TCP sockets left, then unmount;
    the kernel frees the veths."""
    present = [p for p in paths if os.path.exists(p)]
    kill_all(pids_in(present))
    out = Removed(namespaces=len(present))
    for p in present:
        with contextlib.suppress(OSError):  # (a kernel without sock_diag's destroy)
            out.tcp_sockets += destroy_tcp_sockets(p)
        core.netns_delete(p)
    return out


# sock_diag (linux/sock_diag.h, linux/inet_diag.h): the kernel's TCP sockets
# of a namespace, listed and destroyed (what `ss -K` does)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY, _SOCK_DESTROY = 20, 21
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG = struct.Struct("=IHHII")  # length, type, flags, sequence, port
_DIAG_REQ = struct.Struct("=BBBBI48s")  # family, protocol, ext, pad, states, socket id
_DIAG_ID_AT = 4  # inet_diag_msg: family, state, timer, retrans, then the socket id
_DIAG_ID_BYTES = 48
_DESTROY_BATCH = 400  # requests a write (72 bytes each)
_DESTROY_ROUNDS = 4


def _diag_request(kind: int, flags: int, sock_id: bytes = bytes(_DIAG_ID_BYTES)) -> bytes:
    body = _DIAG_REQ.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF, sock_id)
    return _NLMSG.pack(_NLMSG.size + len(body), kind, flags, 0, 0) + body


def _tcp_socket_ids(nl: socket.socket) -> list[bytes]:
    """The socket ids of every TCP socket of nl's namespace, in any state
    (listening, half-open, set up, orphaned, TIME-WAIT)."""
    nl.send(_diag_request(_SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP))
    ids: list[bytes] = []
    while True:
        data = nl.recv(1 << 16)
        at = 0
        while at + _NLMSG.size <= len(data):
            length, kind, _f, _s, _p = _NLMSG.unpack_from(data, at)
            if kind in (_NLMSG_DONE, _NLMSG_ERROR) or length < _NLMSG.size:
                return ids
            lo = at + _NLMSG.size + _DIAG_ID_AT
            ids.append(data[lo : lo + _DIAG_ID_BYTES])
            at += (length + 3) & ~3
        if not data:
            return ids


def destroy_tcp_sockets(path: str) -> int:
    """Destroy every TCP socket of the namespace at path.  A worker killed
    mid-job leaves its connections to the kernel, which keeps sending their
    FINs and data for many minutes at a large k (their RTO follows it, up to
    120 s) after the lab is gone, holding its namespace and counting against
    the host's orphan limit, which the next job's connections share.
    (Listing them walks the kernel's whole table: about 1 ms a namespace;
    the namespace's own counts leave orphans out.)  Returns how many it
    asked the kernel to destroy."""
    nl = socket.socket(
        fileno=core.netns_socket(path, socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
    )
    n = 0
    with nl:
        for _ in range(_DESTROY_ROUNDS):  # (a listener's queued children surface after it)
            ids = _tcp_socket_ids(nl)
            if not ids:
                break
            n += len(ids)
            for i in range(0, len(ids), _DESTROY_BATCH):
                batch = ids[i : i + _DESTROY_BATCH]
                nl.send(b"".join(_diag_request(_SOCK_DESTROY, _NLM_F_REQUEST, x) for x in batch))
                with contextlib.suppress(BlockingIOError):  # errors (a socket gone since): unread
                    while nl.recv(1 << 16, socket.MSG_DONTWAIT):
                        pass
    return n


# tbf's rate field is 32-bit bytes/s in pyroute2 (no TCA_TBF_RATE64): above
# this a veth is the bottleneck anyway, and the uplink is left unshaped.
TBF_MAX_RATE_BPS = 32_000_000_000


# The queue before an accelerator's uplink holds Linux's default txqueuelen
# of full frames, in bytes, at every k: a NIC's queue holds frames, not real
# time.  (It held 100 ms of real time until session 31: 781 KB at k 6400,
# 45 KB at 110592, so at a large k kernel TCP's incast lost frames in its own
# host and timed out where it had not at a small one.)
HOST_TXQ_FRAMES = 1000


def shape(path: str, ifname: str, rate_bps: int, mtu_bytes: int) -> None:
    """Shape an accelerator's uplink to the link's real rate with tc tbf.

    The bucket holds two full frames: enough for tbf to reach the rate,
    too little to let a host burst far beyond it.  The queue holds
    HOST_TXQ_FRAMES full frames, whatever the rate."""
    with ns_ipr(path) as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        if rate_bps > TBF_MAX_RATE_BPS:
            with contextlib.suppress(NetlinkError):
                ipr.tc("del", index=index)
            return
        burst = 2 * (mtu_bytes + 14)
        limit = HOST_TXQ_FRAMES * (mtu_bytes + 14)
        ipr.tc("replace", "tbf", index, rate=f"{rate_bps}bit", burst=burst, limit=limit)


def uplink_drops(path: str) -> int:
    """Frames the shapers (tbf) of the namespace at path dropped, their queue
    full: an accelerator's own NIC queue overflowing, before the fabric."""
    with ns_ipr(path) as ipr:
        return sum(
            (m.get_attr("TCA_STATS") or {}).get("drop", 0)
            for m in ipr.get_qdiscs()
            if m.get_attr("TCA_KIND") == "tbf"
        )


# Kernel TCP on a lab's routes.  A route can set the minimum retransmit
# timeout (RTAX_RTO_MIN, in ms, honoured only when locked), the congestion
# control (RTAX_CC_ALGO: a lab's TCP is Linux's default, cubic, not whatever
# the host's sysctl chose; a namespace may not set that sysctl to a module
# the host has not allowed, a route may) and ECN (RTAX_FEATURES).  The other
# timers are fixed in the kernel, in real time, and so do not dilate with k
# (listed in every report: tcp_timer_notes).
RTAX_RTO_MIN = 13
RTAX_FEATURE_ECN = 1
TCP_RTO_MAX_MS = 120_000  # the kernel caps every RTO here


def tcp_rto_min_ms(rto_min_us: float, k: float) -> int:
    """The real rto_min a route gets for a nominal one at time scale k."""
    return max(1, min(TCP_RTO_MAX_MS, round(Scale(k).real_ns(rto_min_us * 1000) / 1e6)))


def tcp_rto_min_capped(rto_min_us: float, k: float) -> bool:
    """Does the kernel's 120 s cap cut a nominal rto_min at time scale k
    (the route gets a shorter minimum, in nominal time, than the lab's)?"""
    return tcp_rto_min_ms(rto_min_us, k) >= TCP_RTO_MAX_MS


def tcp_rto_min_k_cap(rto_min_us: float) -> float:
    """The time scale at which the kernel's 120 s cap reaches a nominal
    rto_min: from there on the route's minimum RTO is shorter, in nominal
    time, than the lab's."""
    return TCP_RTO_MAX_MS * 1000 / rto_min_us


def tcp_rto_capped_note(rec: dict, k: float) -> str:
    """Why kernel TCP at k is not the lab's TCP ('' if it is): past
    tcp_rto_min_k_cap the route gets the cap, a shorter minimum RTO in
    nominal time, and a retransmit timeout (or a lone tail's probe, timed
    by it) costs the job less nominal time than at a smaller k."""
    rto_min_us = tcp_settings(rec)[0]
    if not tcp_rto_min_capped(rto_min_us, k):
        return ""
    nominal_us = TCP_RTO_MAX_MS * 1000 / k
    return (
        f"at k={k:g} the kernel's 120 s cap makes its minimum RTO {nominal_us:.0f} us nominal,"
        f" not the lab's {rto_min_us:g} us (the same only up to k="
        f"{tcp_rto_min_k_cap(rto_min_us):g}): each retransmit timeout costs less"
        " nominal time than at a smaller k"
    )


def rto_backoff_doublings(rto_min_real_ms: int) -> int:
    """How often an RTO can double from the minimum before the kernel's
    120 s cap (real time, so fewer at a larger k)."""
    n = 0
    while rto_min_real_ms << (n + 1) <= TCP_RTO_MAX_MS:
        n += 1
    return n


def rto_backoff_note(rto_min_real_ms: int, k: float) -> str:
    n = rto_backoff_doublings(rto_min_real_ms)
    cap_us = Scale(float(k)).nominal_ns(TCP_RTO_MAX_MS * 1e6) / 1e3
    return (
        f"its backoff stops at the kernel's 120 s (real) cap, {cap_us:g} us nominal at this k:"
        f" {n} doubling{'' if n == 1 else 's'} of the minimum, fewer at a larger k (repeated"
        " timeouts, as in an incast, come sooner in nominal time there)"
    )


# Linux's cubic (net/ipv4/tcp_cubic.c): a window cut to beta = 717/1024 of
# its maximum W regrows on W(t) = C (t - K)^3 + W, t in real seconds since
# the cut, C = 41 x 10 / 1024, K = cbrt(W (1 - beta) / C); unless its
# reno-friendly estimate, which grows 3 (1 - beta) / (1 + beta) segments per
# round trip, is larger.  That estimate is back at W after (1 + beta) / 3 x
# W round trips.
CUBIC_BETA = 717 / 1024
CUBIC_C = 41 * 10 / 1024
TCP_IP_HEADERS_BYTES = 52  # IPv4 20 + TCP 20 + timestamps 12


def cubic_window_segments(rec: dict) -> float:
    """The window (segments) one kernel TCP flow filling a host link of the
    lab reaches before it is cut: the link's bandwidth-delay product at the
    base RTT, and the queue where the switches start marking CE (ECN asked
    for) or the port's buffer (a loss)."""
    link = next(x for x in rec["topology"]["links"] if x["tier"] == "host")["params"]
    bdp_bytes = link["rate_bps"] * rec["topology"]["base_rtt_ns"] / 8e9
    ecn = tcp_settings(rec)[2] and rec["switch"].get("ecn", True)
    queue_bytes = rec["switch"]["ecn_kmin_bytes"] if ecn else link["buffer_bytes"]
    return (bdp_bytes + queue_bytes) / (link["mtu_bytes"] - TCP_IP_HEADERS_BYTES)


def cubic_k_max(rec: dict) -> float:
    """The largest time scale at which Linux's cubic, in this lab, regrows as
    it would on the real fabric: by its reno-friendly estimate, per round
    trip.  Its curve runs on real seconds, so at a time scale k the round
    trip is k times longer against it; past this k the curve is back at the
    last maximum before the estimate is, and cubic pushes harder (more so at
    a larger k) than on a fabric of the lab's round trip, where it never
    does.  The window: cubic_window_segments (one flow filling a link; n
    flows sharing it have 1/n of it each, a limit n^(2/3) times higher)."""
    w = cubic_window_segments(rec)
    k_real_s = ((1 - CUBIC_BETA) * w / CUBIC_C) ** (1 / 3)
    estimate_rtts = (1 + CUBIC_BETA) / 3 * w
    return k_real_s / (estimate_rtts * rec["topology"]["base_rtt_ns"] / 1e9)


def tcp_settings(rec: dict) -> tuple[float, str, bool, bool]:
    """A lab's [tcp]: nominal rto_min in us, congestion control, ECN asked,
    quick acks."""
    tcp = rec.get("tcp", {})
    return (
        tcp.get("rto_min_us", 200_000.0),
        tcp.get("congestion_control", "cubic"),
        tcp.get("ecn", False),
        tcp.get("quickack", False),
    )


def tcp_routes(rec: dict, k: float) -> None:
    """Set every accelerator's routes from the lab's [tcp] at k: the
    congestion control, ECN, and rto_min (nominal x k).  Connections pick a
    change up at their next route lookup (a replaced route invalidates the
    cached one)."""
    from dataplane.model.topology import gateway_ip, plane_subnet

    rto_min_us, cc, ecn, quickack = tcp_settings(rec)
    metrics = {
        "RTAX_LOCK": 1 << RTAX_RTO_MIN,
        "RTAX_RTO_MIN": tcp_rto_min_ms(rto_min_us, k),
        "RTAX_CC_ALGO": cc,
        "RTAX_FEATURES": RTAX_FEATURE_ECN if ecn else 0,
        "RTAX_QUICKACK": int(quickack),
    }
    for node in rec["topology"]["nodes"]:
        if node["role"] != "host":
            continue
        with ns_ipr(rec["namespaces"][node["name"]]) as ipr:
            for p in node["ports"]:
                index = ipr.link_lookup(ifname=p["ifname"])[0]
                ipr.route(
                    "replace", dst=plane_subnet(p["plane"]), gateway=gateway_ip(p["plane"]),
                    oif=index, prefsrc=p["ip"], flags=4, metrics=metrics,
                )  # fmt: skip


def tcp_congestion_controls() -> list[str]:
    """The congestion controls this kernel has now (built in or loaded)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
            return f.read().split()
    except OSError:
        return []


def check_tcp(spec) -> None:
    """Before lab up builds anything: this kernel has the lab file's
    [tcp] congestion_control (a LabFileError naming file and key if not)."""
    from dataplane.model.labfile import LabFileError

    cc = spec.tcp.get("congestion_control", "cubic")
    have = tcp_congestion_controls()
    if cc not in have:
        raise LabFileError(
            spec.path, "[tcp] congestion_control",
            f"one this kernel has ({', '.join(have) or 'none listed'})", cc,
            detail=f"a module may add it: modprobe tcp_{cc}",
        )  # fmt: skip


# struct tcp_info (linux/tcp.h): the fields a run counts, by offset (named
# tcp_*: the fidelity report sums every rank's counters of that name).  The
# RTO counts came in Linux 6.7 (the struct grew to 248 bytes); an older
# kernel gives a shorter struct and those counters are left out.
_TCPI_FIELDS = (  # counter, offset, struct format
    ("tcp_retx_segs", 100, "I"),  # tcpi_total_retrans: segments resent
    ("tcp_rwnd_limited_us", 176, "Q"),  # tcpi_rwnd_limited: real us held by the peer's window
    ("tcp_retx_bytes", 208, "Q"),  # tcpi_bytes_retrans
    ("tcp_rtos", 240, "H"),  # tcpi_total_rto: retransmit timeouts, repeats included
    ("tcp_rto_recoveries", 242, "H"),  # tcpi_total_rto_recoveries
    ("tcp_rto_time_ms", 244, "I"),  # tcpi_total_rto_time: real ms in RTO recovery
)
TCP_INFO_BYTES = 248
# tcpi_state (TCP_INFO's first byte): a connection the handshake set up,
# open at this end (ESTABLISHED, or CLOSE_WAIT once the peer has closed)
_TCP_CONNECTED_STATES = (1, 8)


def tcp_connected(sock: socket.socket) -> bool:
    """Whether the kernel holds sock as a set-up connection, still open here."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] in _TCP_CONNECTED_STATES
    except OSError:
        return False


def tcp_info(sock: socket.socket) -> dict[str, int]:
    """A connection's retransmissions, retransmit timeouts and time held
    back by its peer's receive window, from the kernel (what ``ss -ti``
    shows); {} for a socket that is gone."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    except OSError:
        return {}
    return {
        name: struct.unpack_from(fmt, raw, off)[0]
        for name, off, fmt in _TCPI_FIELDS
        if off + struct.calcsize(fmt) <= len(raw)
    }


# A namespace's own TCP counters (/proc/net/netstat, TcpExt; what `nstat`
# shows): the timer-driven events tcp_info does not count.  Named tcp_* as
# _TCPI_FIELDS' are (the fidelity report sums them over the ranks).
_NETSTAT_FIELDS = (  # counter, TcpExt name
    ("tcp_win_probes", "TCPWinProbe"),  # zero-window probes sent (timed by the RTO)
    ("tcp_zero_window_adv", "TCPToZeroWindowAdv"),  # windows closed to zero by a receiver
    ("tcp_loss_probes", "TCPLossProbes"),  # tail-loss probes sent
    # ... that repaired a lost tail: each one waited its probe timeout, which
    # with one segment in flight is 2 RTT + rto_min (Linux adds rto_min for a
    # delayed ack), cut to the RTO's deadline: a tail loss then stalls the
    # connection about an RTO and counts as a probe, not a timeout
    ("tcp_loss_probe_recoveries", "TCPLossProbeRecovery"),
    ("tcp_delayed_acks", "DelayedACKs"),  # acks sent by the delayed-ACK timer
    # segments the receiver got CE-marked (a switch's ECN mark), counted by
    # the sender from the echo it acted on: none unless [tcp] ecn
    ("tcp_delivered_ce", "TCPDeliveredCE"),
)


def netstat_counts(text: str) -> dict[str, int]:
    """_NETSTAT_FIELDS' counters from a /proc/net/netstat text (those this
    kernel has)."""
    rows: dict[str, dict[str, int]] = {}
    lines = text.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        head, _, names = names.partition(":")
        head2, _, values = values.partition(":")
        if head == head2:
            rows[head] = dict(zip(names.split(), map(int, values.split()), strict=False))
    ext = rows.get("TcpExt", {})
    return {name: ext[key] for name, key in _NETSTAT_FIELDS if key in ext}


def netns_tcp_counts(netns_path: str) -> dict[str, int]:
    """netstat_counts() of the namespace at netns_path ({} if unreadable)."""
    try:
        return netstat_counts(core.netns_proc_net(netns_path, "netstat"))
    except OSError:
        return {}


def syn_rto_note(rec: dict) -> str:
    """What a lab's handshakes wait before a SYN (SYN-ACK) goes again
    (cgroup.py)."""
    from dataplane.lab import cgroup

    why = rec.get("tcp_syn_rto", "not set by this lab's ethplus")
    backoff = "; a SYN's retries back off from the first, as Linux's did before 6.7"
    if why == cgroup.SYN_RTO_MAX:
        return (
            "kernel TCP's handshake waits the kernel's largest RTO (120 s real) before a SYN or"
            " SYN-ACK goes again, not Linux's fixed second, for the processes ethplus starts in"
            " the lab (a BPF program on its cgroup): as a 1 s timeout would at any k over 120"
            + backoff
        )
    return (
        "kernel TCP's handshake waits Linux's fixed 1 s (real) before a SYN goes again: where a"
        " handshake takes longer than that in real time (a large k), SYNs go again while the"
        f" first is still on its way ({why})" + backoff
    )


def tcp_timer_notes(rec: dict) -> list[str]:
    """What a report says of kernel TCP (its routes' settings, its timers)
    at the lab's k now."""
    nominal_us, cc, ecn, quickack = tcp_settings(rec)
    k = rec.get("time_scale")
    if k is None:
        now = ""
    else:
        real_ms = tcp_rto_min_ms(nominal_us, float(k))
        capped = (
            " (the kernel's cap: less than nominal x k)"
            if tcp_rto_min_capped(nominal_us, float(k))
            else ""
        )
        now = f", {real_ms} ms real at k={float(k):g}{capped}; " + rto_backoff_note(real_ms, k)
    notes = [
        f"kernel TCP: congestion control {cc} and ECN "
        + ("asked for" if ecn else "only answered (Linux's default)")
        + " on every connection, set on every host route (the host's sysctls do not count)",
        f"kernel TCP's minimum RTO follows k: {nominal_us:g} us nominal{now},"
        " set on every host route",
        syn_rto_note(rec),
        "kernel TCP timers fixed in the kernel, in real time, not time-scaled: "
        + ("" if quickack else "the delayed-ACK timer (40 ms at least), ")
        + "the tail-loss probe's 2 ms floor (with one segment in flight it waits 2 RTT + the"
        " minimum RTO, which follows k), the 120 s RTO cap, keepalive and TIME-WAIT;"
        " its RTT-driven timers follow the scaled RTT by themselves; a change of k reaches a"
        " connection at its next route lookup",
        "kernel TCP acks every segment at once (route quickack): no delayed-ACK timer"
        if quickack
        else "kernel TCP delays acks as Linux does: where its 40 ms (real) timer fires, it is"
        " 40 ms / k nominal, shorter than a real one and shorter at a larger k (`[tcp]"
        " quickack = true` removes it)",
    ]
    if cc == "cubic":
        # measured (performance.md, sessions 37-38): uneven all-to-all, 20
        # iterations, segments resent at k 14,400 and 57,600: cubic 2,823 and
        # 11,510, reno 5,127 and 5,402; with ECN, cubic 5 and 4
        growth = (
            "cubic's window growth runs on real time (its curve's time since the last loss, in"
            " seconds): it regrows to its last maximum in k times fewer round trips at k times"
            " the time scale, so it pushes harder at a larger k"
        )
        if "links" in rec.get("topology", {}) and "switch" in rec:  # (a lab's, not loopback's)
            w = cubic_window_segments(rec)
            growth += (
                f"; on a real fabric of this lab's {rec['topology']['base_rtt_ns'] / 1e3:g} us"
                " round trip it regrows by its reno-friendly estimate, per round trip, which a"
                f" time scale keeps; here that holds up to k={cubic_k_max(rec):.3g} only (one"
                f" flow filling a host link, {w:.0f} segments; n flows sharing one, n^(2/3)"
                " times higher): above it cubic is more aggressive than on the fabric it stands"
                " for"
            )
        notes.append(
            growth + "; ECN (asked for) stops it at the switches' marks before a queue"
            " overflows, so its losses hardly move with k, but its marks and its share of a"
            " congested link do (an incast: 4.5x the CE marks at 4x the k); reno grows per"
            ' round trip, the same at any k (`congestion_control = "reno"`, as the shipped'
            " labs whose k passes cubic's have)"
            if ecn
            else growth + ", and loses more (`[tcp] ecn = true` lets the switches' marks stop"
            ' it; reno grows per round trip, the same at any k: `congestion_control = "reno"`)'
        )
    if cc == "reno":
        notes.append(
            "reno grows its window per round trip, which follows the scaled RTT: the same"
            " at any k (Linux's default, cubic, regrows on a curve of real time)"
        )
    if cc == "bbr":
        notes.append(
            "bbr's own timers are real time, not time-scaled: its min-RTT window (10 s) and"
            " ProbeRTT (every 10 s, 200 ms at least) come k times as often in nominal time"
        )
    return notes
