"""Did the emulation keep up?  Measured from the fabric's counters, sampled
while a job ran (dataplane/job.py), never assumed.

Per row (one size), over that row's window, a row is marked as fallen behind
when the switches could not give the links their configured rate (a pacer
woke so late that it lost more than LOST_SHARE_MAX of a link's time beyond
what its bounded catch-up recovers), or when frames left their delay lines so
late that the emulated path delay grew by more than ADDED_DELAY_MAX of the
lab's base RTT.  Per run: configured against achieved rate of the
busiest links, pacer lateness, CPU used by the fabric and the workers and how
busy the whole machine was, drops by switch and reason, the time scale, and
what is not time-scaled.
"""

from __future__ import annotations

from dataplane import stats

LOST_SHARE_MAX = 0.05  # a link lost more than 5% of its time: the rate was not honoured
ADDED_DELAY_MAX = 0.10  # mean lateness above 10% of the base RTT: the delay was not honoured
BUSY_MAX = 0.97  # the machine's CPUs busier than this during a run: saturated
_TX_BYTES, _Q_BYTES, _LATE_FRAMES, _LATE_SUM_NS, _TX_FRAMES, _LOST_NS = range(6)


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
    }
    out["fell_behind"] = (
        out["lost_link_share"] > LOST_SHARE_MAX or out["added_delay_share"] > ADDED_DELAY_MAX
    )
    return out


def base_rtt_real_ns(rec: dict) -> float:
    return rec["topology"]["base_rtt_ns"] * float(rec["time_scale"])


def mark_row(row: dict, samples: list[dict], rec: dict) -> None:
    """Add the window's fidelity (and fell_behind) to a job's row."""
    w = window(samples, row["t0"], row["t1"], base_rtt_real_ns(rec))
    row["pacing"] = w
    row["fell_behind"] = bool(w and w["fell_behind"])


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
        real_bps = nominal_bps / k
        busy = [r for r in rates if r > 0.5 * real_bps]
        out.append({
            "port": port, "link": link, "configured_nominal_bps": nominal_bps,
            "configured_real_bps": real_bps, "peak_real_bps": max(rates),
            "busy_mean_real_bps": sum(busy) / len(busy) if busy else 0.0,
            "peak_share": max(rates) / real_bps,
        })  # fmt: skip
    out.sort(key=lambda x: x["peak_real_bps"], reverse=True)
    return out[:top]


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
    return out


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
    worker_cpu = sum(r.get("cpu_s", 0.0) for r in result["ranks"])
    transport = result["ranks"][0].get("transport", {}) if result["ranks"] else {}
    fell = [r["size"] for r in result["rows"] if r.get("fell_behind")]
    busy = result["machine_busy_frac"]
    k = float(rec["time_scale"])
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
            "fabric_cores": (after["cpu_s"] - before["cpu_s"]) / wall,
            "workers_cores": worker_cpu / wall,
            "machine_busy_share": busy,
            "saturated": busy > BUSY_MAX,
        },
        "drops": drops(before, after),
        # packets resent: messages' and in-network all-reduce chunks'
        "nic_retransmissions": sum(
            r.get("counters", {}).get(k, 0)
            for r in result["ranks"]
            for k in ("retx_pkts", "inc_retx_pkts")
        ),
        "fell_behind_sizes": fell,
        "clean": not fell and busy <= BUSY_MAX,
        "not_time_scaled": [
            *transport.get("notes", []),
            "up to about 2 ms of real time per round trip (RX ring block timers while traffic"
            " runs, scheduling) is not scaled: up to"
            f" {2e6 / k:.0f} ns nominal at k={k:g}",
            "CPU time of reductions and copies in the workers (numpy) is real time",
        ],
    }


def render(f: dict) -> str:
    """A few lines for a terminal."""
    lines = [f"fidelity (time scale k={f['time_scale']:g}; rates real = nominal / k):"]
    for ln in f["links"]:
        lines.append(
            f"  link {ln['port']}: configured {ln['configured_real_bps'] / 1e6:.1f} Mbit/s real"
            f" ({ln['configured_nominal_bps'] / 1e9:g} Gbit/s nominal), peak achieved"
            f" {ln['peak_real_bps'] / 1e6:.1f} Mbit/s ({ln['peak_share']:.0%})"
        )
    p, c = f["pacer"], f["cpu"]
    lines.append(
        f"  pacer: {p['late_frames']} of {p['tx_frames']} frames >100 us late"
        f" ({p['late_share']:.2%}), mean lateness {p['late_mean_ns'] / 1e3:.0f} us;"
        f" link time lost beyond catch-up {p['lost_link_ns'] / 1e6:.1f} ms"
    )
    lines.append(
        f"  cpu: fabric {c['fabric_cores']:.2f} cores, workers {c['workers_cores']:.2f} cores,"
        f" machine {c['machine_busy_share']:.0%} busy{' (SATURATED)' if c['saturated'] else ''}"
    )
    if f["drops"]:
        for sw, d in f["drops"].items():
            lines.append(f"  {sw}: " + " ".join(f"{k}={v}" for k, v in d.items()))
    else:
        lines.append("  switches: no drops, marks, trims or pauses")
    if f["fell_behind_sizes"]:
        lines.append(
            f"  PACING FELL BEHIND at sizes {f['fell_behind_sizes']} (pacing 'behind' in the table)"
        )
    lines.append("  not time-scaled: " + "; ".join(f["not_time_scaled"]))
    return "\n".join(lines)
