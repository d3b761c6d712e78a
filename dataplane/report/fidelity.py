"""Did the emulation keep up?  Measured from the fabric's counters, sampled
while a job ran (dataplane/run/job.py), never assumed.

Per row (one size), over that row's window, a row is marked as fallen behind
when the switches could not give the links their configured rate (a pacer
woke so late that it lost more than LOST_SHARE_MAX of a link's time beyond
what its bounded catch-up recovers), when frames left their delay lines so
late that the emulated path delay grew by more than ADDED_DELAY_MAX of the
lab's base RTT, or when a NIC engine ran so late that its ports lost more
than LOST_SHARE_MAX of the window beyond the catch-up, or its RX ring
overflowed (the endpoints fell behind: links go under-used with no switch
late, which the pacers alone cannot see), or when a rank's threads waited
for a CPU for more than WAITED_SHARE_MAX of the window.  Per run: configured
against achieved rate of the busiest links, pacer lateness, each NIC
engine's lateness, CPU used by the fabric and the workers and how busy the
whole machine was, drops by switch and reason, the time scale, and
what is not time-scaled.
"""

from __future__ import annotations

import dataclasses
import itertools
from array import array
from collections.abc import Mapping

from dataplane.report import stats
from dataplane.scale import Scale
from dataplane.units import rate_text

LOST_SHARE_MAX = 0.05  # a link lost more than 5% of its time: the rate was not honoured
# A governed run's sizes are run again at K_CHECK_FACTOR x their k
# (trials.check_k); a nominal time that moves by more than K_MOVED_MAX then
# held the host's own latencies.
K_CHECK_FACTOR = 4.0
K_MOVED_MAX = 0.05
ADDED_DELAY_MAX = 0.10  # mean lateness above 10% of the base RTT: the delay was not honoured
BUSY_MAX = 0.97  # the machine's CPUs busier than this during a run: saturated
# What a round trip adds unscaled where only the switches' rings do (1 ms
# retire timers, each way): kernel TCP's; a NIC transport states its own.
SWITCH_RINGS_RTT_NS = 2_000_000
# (a NIC engine that runs behind its schedule delays its packets and acks as
# a late delay line does: judged as ADDED_DELAY_MAX of the real base RTT,
# from its share of time behind and how late it ran, engine_added_delay)
# a rank's dataplane threads (its NIC engine's; a kernel TCP rank's, all of
# them: cpu.waited_s) were ready to run but not scheduled for more than this
# share of the window: the machine, not the fabric, set the pace (measured:
# kernel TCP's 16 MiB all-reduce on erack-8x4 waited 0.87 of the window at
# k=6400, 151 GB/s, and 0.19 at k=25600, 183)
WAITED_SHARE_MAX = 0.25
# some NIC engine of the lab was behind its schedule (by more than a
# hundredth of the real base RTT: nic.c, NIC_STALL_RTT_DIV) for more than
# this share of the window: the union of every engine's late spans (the
# clock's any_late_ns), since a collective waits for its slowest rank.
# Measured (erack-8x4, 16 MiB all-reduce, k pinned): RoCE lost 16-23% of its
# busbw with a share of 0.074-0.37 (receivers posting late: RNR and
# go-back-N), and none at 0.051 or under; ethplus lost none at up to 0.18
ANY_BEHIND_MAX = 0.05
# The ranks leave the same barrier together; what parts them before their
# first post is their processes' CPU (real time, not scaled): past this share
# of the timed runs, the time measured is partly theirs.  Seen: upn-512's
# rank hosts, every one of 256 ranks reading all 257 threads' /proc files
# at that barrier, measured a 1 MiB all-reduce at 249 GB/s (286 at twice k)
# with every other check clean; reading once a process: 322-329 at three k.
START_SKEW_MAX = 0.05
# Frames a switch lost before reading them (stats.LOST_BEFORE_READ but a
# foreign frame's): its RX ring overflowed or it had no buffer to take one
# into; the host's losses, not the emulated fabric's.  Any in a row's window
# makes it `behind` (an upn-512 all-to-all job at k 3.3e6 lost 50,723 so,
# its row otherwise clean at 13.82 us; 4.2 us in runs without them).
HOST_DROPS = tuple(k for k in stats.LOST_BEFORE_READ if k != "drop_foreign")
# A job's samples of the fabric (Fabric.sample): these counters of every
# switch port, several times a second
SAMPLE_FIELDS = ("tx_bytes", "q_bytes", "late_frames", "late_sum_ns", "tx_frames", "lost_link_ns")
_TX_BYTES, _Q_BYTES, _LATE_FRAMES, _LATE_SUM_NS, _TX_FRAMES, _LOST_NS = range(len(SAMPLE_FIELDS))
SAMPLE_S = 0.2  # how often a job samples a lab of up to SAMPLE_PORTS switch ports ...
SAMPLE_PORTS = 512  # ... and a larger lab less often, in proportion (upn-512: 4096, 1.6 s)


def sample_interval_s(rec: dict) -> float:
    """How often a job on this lab samples the fabric: a sample's cost
    (the fabric reads and sends, the job keeps) grows with the ports."""
    ports = sum(len(n["ports"]) for n in rec["topology"]["nodes"] if n["role"] == "switch")
    return SAMPLE_S * max(1.0, ports / SAMPLE_PORTS)


class PortRows(Mapping):
    """One sample's SAMPLE_FIELDS per switch port ("switch:peer" -> a tuple
    of ints).  The names are shared by a job's samples and the values packed
    (a 4096-port lab's sample: 200 KB, not 1.6 MB of Python objects; a long
    job keeps thousands)."""

    __slots__ = ("_index", "_values")

    def __init__(self, ports: dict[str, list[int]], prev: PortRows | None = None):
        same = prev is not None and prev._index.keys() == ports.keys()
        self._index = prev._index if same else {name: i for i, name in enumerate(ports)}
        self._values = array("q", itertools.chain.from_iterable(ports.values()))

    def __getitem__(self, name: str) -> tuple[int, ...]:
        i = self._index[name] * len(SAMPLE_FIELDS)
        return tuple(self._values[i : i + len(SAMPLE_FIELDS)])

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self):
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def _around(samples: list[dict], t0: float, t1: float) -> tuple[dict, dict] | None:
    """The last sample at or before t0 and the first at or after t1 (or the
    nearest ones there are)."""
    if len(samples) < 2:
        return None
    before = [s for s in samples if s["t"] <= t0] or samples[:1]
    after = [s for s in samples if s["t"] >= t1] or samples[-1:]
    a, b = before[-1], after[0]
    return (a, b) if b["t"] > a["t"] else None


def _delta(a: dict, b: dict, field: int) -> int:
    return sum(b["ports"][p][field] - a["ports"][p][field] for p in b["ports"] if p in a["ports"])


def window(samples: list[dict], t0: float, t1: float, base_rtt_real_ns: float) -> dict | None:
    """Pacing fidelity over [t0, t1], or None without samples around it."""
    ab = _around(samples, t0, t1)
    if ab is None:
        return None
    a, b = ab
    span_ns = (b["t"] - a["t"]) * 1e9
    tx = _delta(a, b, _TX_FRAMES)
    lost = max(
        (b["ports"][p][_LOST_NS] - a["ports"][p][_LOST_NS] for p in b["ports"] if p in a["ports"]),
        default=0,
    )
    added = _delta(a, b, _LATE_SUM_NS) / tx if tx else 0.0
    out = {
        "late_share": _delta(a, b, _LATE_FRAMES) / tx if tx else 0.0,
        "lost_link_share": lost / span_ns,
        "added_delay_share": added / base_rtt_real_ns,
        "ring_drops": b.get("ring_drops", 0) - a.get("ring_drops", 0),
    }
    out["fell_behind"] = bool(why("pacing", out))
    return out


def engine_added_delay(behind_share: float, late_sum_ns: float, late_wakeups: float) -> float:
    """The delay an engine running behind adds to a packet, on average (real
    ns): it is behind behind_share of the time, by half its mean lateness."""
    if not late_wakeups:
        return 0.0
    return behind_share * late_sum_ns / late_wakeups / 2


def rx_wait_ns(rx_wait_sum_ns: float, rx_wait_frames: float) -> float:
    """How long a frame waited in an engine's RX ring before the engine read
    it, on average (real ns): the delay an engine kept from running adds to
    every frame it receives, acks included, even when nothing it had to send
    was late."""
    return rx_wait_sum_ns / rx_wait_frames if rx_wait_frames else 0.0


def engines_window(row: dict, base_rtt_real_ns: float) -> dict | None:
    """The endpoints over a row's timed window: did any fall behind?  A NIC
    engine that ran later than its pacers' catch-up allows lost link time
    (LOST_SHARE_MAX of the window, as a switch port), one that ran behind its
    schedule delayed its packets and acks (by more than ADDED_DELAY_MAX of the
    real base RTT on average, as a late delay line; engine_added_delay), one
    whose RX ring overflowed lost frames a NIC would not have; a rank whose
    threads waited for a CPU for WAITED_SHARE_MAX of it was paced by the
    machine (kernel TCP's ranks too); one whose frames waited in its RX ring
    (rx_wait_ns) for more than ADDED_DELAY_MAX of the base RTT on average
    delayed every frame it received; and the lab's engines together were
    behind (some engine, any_late_ns) for more than ANY_BEHIND_MAX of it;
    and the ranks, released by one barrier, began their runs more than
    START_SKEW_MAX of the runs' span apart (their processes' real time in
    the nominal result).  None without the ranks' figures."""
    engines = row.get("engines") or []
    if not engines:
        return None
    span_ns = max((row["t1"] - row["t0"]) * 1e9, 1.0)
    runs_s = row.get("n1", 0.0) - row.get("n0", 0.0)  # nominal: first start to last end
    worst = max(engines, key=lambda e: e.get("eng_lost_ns", 0))
    behind = max(engines, key=lambda e: e.get("eng_late_sum_ns", 0))
    added = max(
        engine_added_delay(
            e.get("eng_late_sum_ns", 0) / span_ns, e.get("eng_late_sum_ns", 0),
            e.get("eng_late_wakeups", 0),
        )
        for e in engines
    )  # fmt: skip
    waited = max(engines, key=lambda e: e.get("waited_s", 0.0))
    rx_wait = max(rx_wait_ns(e.get("rx_wait_sum_ns", 0), e.get("rx_wait_frames", 0))
                  for e in engines)  # fmt: skip
    out = {
        "late_wakeups": sum(e.get("eng_late_wakeups", 0) for e in engines),
        "late_sum_ns": sum(e.get("eng_late_sum_ns", 0) for e in engines),
        "behind_share_max": behind.get("eng_late_sum_ns", 0) / span_ns,
        "added_delay_share": added / base_rtt_real_ns,
        "lost_share_max": worst.get("eng_lost_ns", 0) / span_ns,
        "lost_share_rank": worst["rank"],
        "waited_share_max": waited.get("waited_s", 0.0) * 1e9 / span_ns,
        "any_behind_share": max(e.get("any_late_ns", 0) for e in engines) / span_ns,
        "rx_ring_drops": sum(e.get("rx_ring_drops", 0) for e in engines),
        "rx_delay_share": rx_wait / base_rtt_real_ns,
        "start_skew_share": row.get("start_skew_s", 0.0) / runs_s if runs_s > 0 else 0.0,
    }
    out["why"] = why("endpoints", out)
    out["fell_behind"] = bool(out["why"])
    return out


@dataclasses.dataclass(frozen=True)
class Check:
    """One way a part of the emulation falls behind: the figure that shows it,
    in a part's window (window() for "pacing", engines_window() for
    "endpoints") and in the governor's observations (governor.Observation),
    the value past which a size is `behind`, and how a report says it.  The
    verdicts and the governor (at RAISE_AT of it) read this one table."""

    part: str  # "pacing" or "endpoints"
    figure: str  # its key in that part's window
    observed: str  # its field in governor.Observation
    limit: float
    says: str  # str.format, {v}: the figure
    who: str | None = None  # a window's key naming the worst rank, if any
    severe_at: float = 1.0  # the governor raises k faster past this many limits


CHECKS = (
    Check("pacing", "lost_link_share", "lost_link_share", LOST_SHARE_MAX,
          "a switch port lost {v:.1%} of its link time"),
    Check("pacing", "added_delay_share", "added_delay_share", ADDED_DELAY_MAX,
          "switch delay lines ran {v:.1%} of a base RTT late"),
    Check("pacing", "ring_drops", "switch_ring_drops", 0,
          "the switches' RX rings dropped {v} frames"),
    Check("endpoints", "lost_share_max", "engine_lost_share", LOST_SHARE_MAX,
          "a NIC engine lost {v:.1%} of its link time", who="lost_share_rank"),
    Check("endpoints", "added_delay_share", "engine_added_delay_share", ADDED_DELAY_MAX,
          "a NIC engine ran late by {v:.1%} of a base RTT"),
    Check("endpoints", "rx_ring_drops", "ring_drops", 0,
          "NIC engines' RX rings dropped {v} frames"),
    Check("endpoints", "rx_delay_share", "engine_rx_delay_share", ADDED_DELAY_MAX,
          "frames waited in NIC engines' rings {v:.1%} of a base RTT"),
    Check("endpoints", "any_behind_share", "any_behind_share", ANY_BEHIND_MAX,
          "some NIC engine was behind {v:.1%} of the time"),
    Check("endpoints", "waited_share_max", "waited_share", WAITED_SHARE_MAX,
          "a rank waited for a CPU {v:.0%} of the time", severe_at=2.0),
    Check("endpoints", "start_skew_share", "start_skew_share", START_SKEW_MAX,
          "the ranks began their timed runs {v:.1%} of those runs apart (their"
          " processes' CPU, not the fabric)"),
)  # fmt: skip


def says(check: Check, figures: dict, v: float) -> str:
    text = check.says.format(v=v)
    if check.who and figures.get(check.who) is not None:
        text += f" (rank {figures[check.who]})"
    return text


def why(part: str, figures: dict, at: float = 1.0) -> list[str]:
    """Why a part's window is behind ([] if it is not): each check of the
    part whose figure passes `at` times its limit."""
    return [says(c, figures, figures[c.figure]) for c in CHECKS
            if c.part == part and figures[c.figure] > c.limit * at]  # fmt: skip


def k_text(k_range) -> str:
    """A k range as a run's lines give it: "6400", "6400..9600", "?" if none."""
    if not k_range:
        return "?"
    lo, hi = k_range
    return f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g}"


def k_range(samples: list[dict], t0: float, t1: float) -> list[float] | None:
    """The lowest and highest time scale the fabric ran at over [t0, t1]
    (the governor may move it), from the samples in it and the one before."""
    before = [s["k"] for s in samples if s["t"] <= t0 and "k" in s][-1:]
    ks = before + [s["k"] for s in samples if t0 < s["t"] <= t1 and "k" in s]
    return [min(ks), max(ks)] if ks else None


def mark_row(row: dict, samples: list[dict], rec: dict) -> None:
    """Add the window's fidelity (and fell_behind) to a job's row: the
    switches' pacing and the NIC engines (every part must have kept up),
    and the range of k it ran at."""
    row["k_range"] = k_range(samples, row["t0"], row["t1"])
    k = row["k_range"][0] if row["k_range"] else float(rec["time_scale"])
    base_rtt_real_ns = Scale(k).real_ns(rec["topology"]["base_rtt_ns"])
    w = window(samples, row["t0"], row["t1"], base_rtt_real_ns)
    e = engines_window(row, base_rtt_real_ns)
    row["pacing"] = w
    row["endpoints"] = e
    row["behind_why"] = (why("pacing", w) if w else []) + (e["why"] if e else [])
    row["fell_behind"] = bool(row["behind_why"])


def link_rates(result: dict, rec: dict, top: int = 4) -> list[dict]:
    """Configured against achieved real rate of the busiest switch egress
    ports: the peak over any sampling interval, and the mean while busy."""
    k = float(rec["time_scale"])
    configured = {}
    for n in rec["topology"]["nodes"]:
        if n["role"] != "switch":
            continue
        for p in n["ports"]:
            lk = next(x for x in rec["topology"]["links"] if x["name"] == p["link"])
            configured[f"{n['name']}:{p['peer']}"] = (lk["params"]["rate_bps"], lk["name"])
    samples = result["samples"]
    out = []
    for port, (nominal_bps, link) in configured.items():
        rates = []
        for a, b in zip(samples, samples[1:], strict=False):
            if port in a["ports"] and port in b["ports"]:
                dt = b["t"] - a["t"]
                rates.append((b["ports"][port][_TX_BYTES] - a["ports"][port][_TX_BYTES]) * 8 / dt)
        if not rates:
            continue
        real_bps = Scale(k).real_bps(nominal_bps)
        busy = [r for r in rates if r > 0.5 * real_bps]
        out.append({
            "port": port, "link": link, "configured_nominal_bps": nominal_bps,
            "configured_real_bps": real_bps, "peak_real_bps": max(rates),
            "busy_mean_real_bps": sum(busy) / len(busy) if busy else 0.0,
            "peak_share": max(rates) / real_bps,
        })  # fmt: skip
    out.sort(key=lambda x: x["peak_real_bps"], reverse=True)
    return out[:top]


def kernel_tcp(result: dict) -> dict[str, int]:
    """Kernel TCP's retransmissions and retransmit timeouts over the run,
    every rank's connections summed ({} when no rank ran kernel TCP)."""
    out: dict[str, int] = {}
    for r in result["ranks"]:
        for name, v in r.get("counters", {}).items():
            if name.startswith("tcp_"):  # lab.kernel.tcp_info's
                out[name] = out.get(name, 0) + v
    return out


def kernel_tcp_text(t: dict[str, int]) -> str:
    """kernel_tcp() in a line."""
    line = f"{t['tcp_retx_segs']} segments resent"
    if "tcp_peers" in t:  # (both ends of a pair count it)
        line += (
            f" over {t['tcp_streams']} streams to {t['tcp_peers']} peers (every rank's added:"
            " each to the peers its collective used)"
        )
    if "tcp_rtos" in t:
        line += (
            f", {t['tcp_rtos']} retransmit timeouts ({t['tcp_rto_time_ms']} ms real in RTO"
            " recovery, every connection added)"
        )
    if t.get("tcp_rwnd_limited_us"):
        # a receiver that reads late, or a lost window update that only the
        # zero-window probe (timed by the RTO, so by k) recovers
        line += (
            f"; {t['tcp_rwnd_limited_us'] / 1000:.0f} ms real held back by the receivers'"
            " windows (every connection added)"
        )
    probes = [
        f"{t[name]} {what}"
        for name, what in (
            ("tcp_win_probes", "zero-window probes (each waited an RTO: a window update lost,"
             " or a receiver that read late)"),
            ("tcp_loss_probes", "tail-loss probes"),
            ("tcp_loss_probe_recoveries", "tail losses the probes repaired (with one segment"
             " in flight each waited 2 RTT + the minimum RTO, about an RTO, as an RTO"
             " would: Linux allows for a delayed ack)"),
            ("tcp_delayed_acks", "delayed acks (the 40 ms real timer)"),
            ("tcp_delivered_ce", "segments delivered CE-marked (the switches' ECN marks,"
             " echoed to the senders, which cut their windows: once a round trip at most)"),
        )
        if t.get(name)
    ]  # fmt: skip
    if probes:
        line += "; the hosts' namespaces counted " + ", ".join(probes)
    if t.get("tcp_setup_rtos"):
        line += (
            f"; of those, {t['tcp_setup_rtos']} timeouts and {t.get('tcp_setup_retx_segs', 0)}"
            " segments in the connections' set-up, before any message (the kernel's 1 s initial"
            " RTO is real time: a handshake whose round trip at this k takes longer times out"
            " with nothing lost)"
        )
    return line


def engines(result: dict) -> list[dict]:
    """Each rank's NIC engine over the whole run: how late it ran, the link
    time its ports lost beyond the pacers' catch-up, its RX ring's drops
    (none for kernel TCP)."""
    out = []
    for r in result["ranks"]:
        c = r.get("counters", {})
        if "eng_late_wakeups" not in c:
            continue
        out.append({
            "rank": r["rank"], "node": r["node"], "late_wakeups": c["eng_late_wakeups"],
            "late_sum_ns": c["eng_late_sum_ns"], "late_max_ns": c["eng_late_max_ns"],
            "lost_ns": c["eng_lost_ns"], "rx_ring_drops": c.get("rx_ring_drops", 0),
            "rx_wait_ns": rx_wait_ns(c.get("rx_wait_sum_ns", 0), c.get("rx_wait_frames", 0)),
            "rx_wait_max_ns": c.get("rx_wait_max_ns", 0),
        })  # fmt: skip
    return out


# What a switch did to frames besides forwarding them, reported with its drops.
EVENTS = ("ecn_marked", "trimmed", "pause_tx", "llr_replays", "agg_consumed", "agg_replies")


def drops(before: dict, after: dict) -> dict[str, dict[str, int]]:
    """Frames each switch dropped during the run, by reason, and what else it
    did to them (EVENTS: marks, trims, pauses, replays, aggregation), nonzero
    only."""
    out: dict[str, dict[str, int]] = {}
    for sw, s1 in after["switches"].items():
        s0 = before["switches"].get(sw)
        if s0 is None:
            continue
        reasons: dict[str, int] = {}
        for k in stats.LOST_BEFORE_READ:
            reasons[k] = s1["ring"].get(k, 0) - s0["ring"].get(k, 0)
        for ifname, c1 in s1["ports"].items():
            c0 = s0["ports"][ifname]
            for k in (*stats.DROP_REASONS, *EVENTS):
                reasons[k] = reasons.get(k, 0) + c1.get(k, 0) - c0.get(k, 0)
        nonzero = {k: v for k, v in reasons.items() if v}
        if nonzero:
            out[sw] = nonzero
    # the accelerators' own queues, before any switch (tbf; the host's kernel
    # fills them: kernel TCP can overflow its own, a paced NIC engine not)
    host = sum(
        h1["uplink_drops"] - before.get("hosts", {}).get(name, h1)["uplink_drops"]
        for name, h1 in after.get("hosts", {}).items()
    )
    if host:
        out["host uplinks"] = {"drop_host_queue": host}
    return out


def per_process(ranks: list[dict], key: str) -> float:
    """A figure each rank reports for its whole process (its CPU seconds, its
    peak memory), summed over a job's worker processes: each process once
    (its latest report), however many of the ranks it ran."""
    per_pid: dict = {}
    for i, r in enumerate(ranks):
        pid = r.get("pid", f"rank {i}")
        per_pid[pid] = max(per_pid.get(pid, 0), r.get(key, 0))
    return sum(per_pid.values())


def workers_cpu_s(ranks: list[dict]) -> float:
    """CPU seconds of a job's worker processes (per_process)."""
    return float(per_process(ranks, "cpu_s"))


def report(result: dict, rec: dict) -> dict:
    """The fidelity report of one job."""
    before, after = result["fabric_before"], result["fabric_after"]
    wall = max(result["wall_s"], 1e-9)
    t0 = stats.totals(before)
    t1 = stats.totals(after)
    late = t1.get("late_frames", 0) - t0.get("late_frames", 0)
    tx = t1.get("tx_frames", 0) - t0.get("tx_frames", 0)
    late_max = max(
        (c["late_max_ns"] for s in after["switches"].values() for c in s["ports"].values()),
        default=0,
    )
    worker_cpu = workers_cpu_s(result["ranks"])
    fabric_frames_s = after.get("frames_cpu_s", 0.0) - before.get("frames_cpu_s", 0.0)
    transport = result["ranks"][0].get("transport", {}) if result["ranks"] else {}
    fell = [r["size"] for r in result["rows"] if r.get("fell_behind")]
    busy = result["machine_busy_frac"]
    k = float(rec["time_scale"])
    # a NIC transport's engines say what their rings add (nic.rings_unscaled_rtt_ns)
    unscaled_ns = transport.get("unscaled_rtt_ns", SWITCH_RINGS_RTT_NS)
    ring_ms = transport.get("rx_ring_timeout_ms")
    ring_text = f"the NICs' {ring_ms} ms" if ring_ms else "no NIC rings"
    return {
        "time_scale": k,
        "links": link_rates(result, rec),
        "pacer": {
            "late_frames": late,
            "tx_frames": tx,
            "late_share": late / tx if tx else 0.0,
            "late_mean_ns": (t1.get("late_sum_ns", 0) - t0.get("late_sum_ns", 0)) / late
            if late
            else 0,
            "lost_link_ns": t1.get("lost_link_ns", 0) - t0.get("lost_link_ns", 0),
            "late_max_ns_since_lab_up": late_max,
        },
        "cpu": {
            # between the job's two stats requests, neither counted (older
            # fabrics: from the end of one to the end of the other)
            "fabric_cores": (after["cpu_s"] - before.get("cpu_s_done", before["cpu_s"])) / wall,
            "workers_cores": worker_cpu / wall,
            # of which the threads that move frames (cpu.FRAME_THREADS): the
            # switches', the NIC engines' (none for kernel TCP, whose frames
            # are the kernel's work in the ranks' own threads)
            "fabric_frames_cores": fabric_frames_s / wall,
            "workers_frames_cores": float(per_process(result["ranks"], "frames_cpu_s")) / wall,
            # and what their processes took before their ranks were ready
            # (start-up: Python, imports, the transports' set-up), which a
            # job of more processes pays more of whatever it moves: each
            # process's CPU when its last rank was ready (in a rank host, the
            # ranks ready before it may have begun filling their buffers)
            "workers_startup_cores": float(per_process(result["ranks"], "ready_cpu_s")) / wall,
            "machine_busy_share": busy,
            "saturated": busy > BUSY_MAX,
        },
        "drops": drops(before, after),
        "engines": engines(result),
        # packets resent: messages' and in-network all-reduce chunks'
        "nic_retransmissions": sum(
            r.get("counters", {}).get(k, 0)
            for r in result["ranks"]
            for k in ("retx_pkts", "inc_retx_pkts")
        ),
        # kernel TCP's, over every connection (kernel.tcp_info; {} for the NIC)
        "kernel_tcp": kernel_tcp(result),
        "fell_behind_sizes": fell,
        # each size behind, and why (fidelity.why)
        "behind_why": [
            [r["size"], r.get("behind_why", [])] for r in result["rows"] if r.get("fell_behind")
        ],  # fmt: skip
        # the most of a size's timed window some NIC engine was behind
        "any_behind_share_max": max(
            ((r.get("endpoints") or {}).get("any_behind_share", 0.0) for r in result["rows"]),
            default=0.0,
        ),
        # the k each size's timed runs ran at (a governed lab's may move)
        "k_per_size": [[r["size"], r.get("k_range")] for r in result["rows"]],
        "clean": not fell and busy <= BUSY_MAX,
        "not_time_scaled": [
            *transport.get("notes", []),
            f"up to about {unscaled_ns / 1e6:g} ms of real time per round trip (RX ring block"
            f" timers while traffic runs: the switches' 1 ms, {ring_text}; scheduling) is not"
            f" scaled: up to {Scale(k).nominal_ns(unscaled_ns):.0f} ns nominal at k={k:g}",
            "CPU time of reductions and copies in the workers (numpy) is real time",
        ],
    }


def after_reruns(f: dict, rows: list[dict], reruns: list[dict], checks=()) -> None:
    """A report f of a run whose sizes that fell behind ran again, or that
    were checked at a larger k (trials.py): the verdicts and the k per size
    become those of the rows kept (bench rows), and the sizes run again are
    named, with the k their behind runs had, and each check."""
    behind = [r for r in rows if r["fell_behind"]]
    f["fell_behind_sizes"] = [r["size_bytes"] for r in behind]
    f["behind_why"] = [[r["size_bytes"], r.get("behind_why", [])] for r in behind]
    f["clean"] = not behind and not f["cpu"]["saturated"]
    f["ran_again"] = [[r["size_bytes"], r.get("k_range")] for r in reruns]
    f["k_per_size"] = [[r["size_bytes"], r.get("k_range")] for r in rows]
    f["k_checks"] = list(checks)


def cpu_text(c: dict) -> str:
    """The fabric's and the workers' cores, and of them what the threads
    that move frames took and the workers' start-up (results from before
    they were counted: left out)."""

    def part(name: str, who: str) -> str:
        frames, startup = c.get(f"{name}_frames_cores"), c.get(f"{name}_startup_cores")
        of = [f"{who} {frames:.2f}"] if frames else []
        of += [f"start-up {startup:.2f}"] if startup else []
        return f"{name} {c[f'{name}_cores']:.2f} cores" + (f" ({', '.join(of)})" if of else "")

    return f"{part('fabric', 'switch threads')}, {part('workers', 'NIC engines')}"


def render(f: dict) -> str:
    """A few lines for a terminal."""
    lines = [f"fidelity (time scale k={f['time_scale']:g} at the start; real rate = nominal / k):"]
    for ln in f["links"]:
        lines.append(
            f"  link {ln['port']}: configured"
            f" {rate_text(ln['configured_real_bps'], 'Mbit/s', '.1f')} real"
            f" ({rate_text(ln['configured_nominal_bps'], 'Gbit/s', 'g')} nominal), peak"
            f" achieved {rate_text(ln['peak_real_bps'], 'Mbit/s', '.1f')} ({ln['peak_share']:.0%})"
        )
    ks = [(size, kr) for size, kr in f.get("k_per_size", []) if kr]
    if any(kr != [f["time_scale"]] * 2 for _, kr in ks):
        lines.append(
            "  time scale per size: "
            + ", ".join(
                f"{size} B k={kr[0]:g}" + (f"-{kr[1]:g}" if kr[1] != kr[0] else "")
                for size, kr in ks
            )
        )
    p, c = f["pacer"], f["cpu"]
    lines.append(
        f"  pacer: {p['late_frames']} of {p['tx_frames']} frames >100 us late"
        f" ({p['late_share']:.2%}), mean lateness {p['late_mean_ns'] / 1e3:.0f} us;"
        f" link time lost beyond catch-up {p['lost_link_ns'] / 1e6:.1f} ms"
    )
    lines.append(
        f"  cpu: {cpu_text(c)},"
        f" machine {c['machine_busy_share']:.0%} busy{' (SATURATED)' if c['saturated'] else ''}"
    )
    engs = f.get("engines") or []
    if engs:
        worst = max(engs, key=lambda e: e["late_max_ns"])
        lost = [e for e in engs if e["lost_ns"] or e["rx_ring_drops"]]
        lines.append(
            f"  endpoints: {len(engs)} NIC engines; worst lateness {worst['late_max_ns'] / 1e6:.1f}"
            f" ms ({worst['node']}); {sum(e['late_wakeups'] for e in engs)} late passes;"
            f" {len(lost)} lost link time beyond catch-up or RX frames; some engine behind"
            f" {f.get('any_behind_share_max', 0.0):.1%} of a size's timed runs at most"
        )
        slow = max(engs, key=lambda e: e.get("rx_wait_ns", 0))
        lines.append(
            f"  RX backlog: frames waited {slow.get('rx_wait_ns', 0) / 1e6:.2f} ms in"
            f" {slow['node']}'s ring on average (the most of any engine; longest"
            f" {slow.get('rx_wait_max_ns', 0) / 1e6:.1f} ms), real time"
        )
        for e in lost[:8]:
            lines.append(
                f"    {e['node']}: link time lost {e['lost_ns'] / 1e6:.1f} ms,"
                f" RX ring drops {e['rx_ring_drops']}, late passes {e['late_wakeups']}"
            )
    if f.get("kernel_tcp"):
        lines.append("  kernel TCP: " + kernel_tcp_text(f["kernel_tcp"]))
    if f["drops"]:
        for sw, d in f["drops"].items():
            lines.append(f"  {sw}: " + " ".join(f"{k}={v}" for k, v in d.items()))
    else:
        lines.append("  switches: no drops, marks, trims or pauses")
    if f["fell_behind_sizes"]:
        lines.append(
            f"  FELL BEHIND at sizes {f['fell_behind_sizes']} (a switch's pacer or a NIC engine"
            " could not keep up: 'behind' in the table)"
        )
        for size, why in f.get("behind_why", []):
            if why:  # never a line that starts with a number, as the table's rows do
                lines.append(f"    at {size} B: " + "; ".join(why))
    if f.get("ran_again"):
        lines.append(
            "  ran again at a larger k (the figures above are of the whole first run; the"
            " table's row is the last run's): "
            + ", ".join(
                f"{size} B" + (f" (behind at k={kr[0]:g}-{kr[1]:g})" if kr else "")
                for size, kr in f["ran_again"]
            )
        )
    if f.get("k_checks"):
        lines.append(
            f"  checked at {K_CHECK_FACTOR:g}x the k (the run's nominal time against that"
            f" k's; past {K_MOVED_MAX:.0%} the host's latency was in it, and the table's row is"
            " the larger k's): "
            + ", ".join(
                f"{c['size_bytes']} B k={c['k_range'][1]:g}->{c['k']:g} {c['ratio'] - 1:+.1%}"
                + (" moved" if c["moved"] else "")
                for c in f["k_checks"]
            )
        )
    lines.append("  not time-scaled: " + "; ".join(f["not_time_scaled"]))
    return "\n".join(lines)
