"""Switch counters: totals, the conservation check, and a text rendering."""

from __future__ import annotations

from dataplane.scale import Scale

DROP_REASONS = (
    "drop_queue_full", "drop_shared_full", "drop_headroom", "drop_loss", "drop_corrupt",
    "drop_link_down", "drop_node_down", "drop_malformed", "drop_spoofed", "drop_no_route",
    "drop_tx_error", "drop_agg_full", "drop_agg_stale", "drop_agg_foreign",
)  # fmt: skip
# Lost before any port read them: counted per switch, on its one RX ring.
LOST_BEFORE_READ = ("drop_ring", "drop_no_buf", "drop_foreign")
# In-network aggregation, per switch: contributions taken, results sent.
AGG_COUNTERS = ("agg_consumed", "agg_dup", "agg_results", "agg_replies")
# Frames still inside a switch: queued, or on a delay line.
IN_FLIGHT = ("q_frames", "wire_frames")


def totals(st: dict) -> dict[str, int]:
    """Sum of every counter over every port of every switch (gauges included)."""
    out: dict[str, int] = {}
    for sw in st["switches"].values():
        for k, v in sw["ring"].items():
            out[k] = out.get(k, 0) + v
        for port in sw["ports"].values():
            for k, v in port.items():
                if isinstance(v, int) and not k.endswith(("_max_ns", "hwm_bytes")):
                    out[k] = out.get(k, 0) + v
    return out


def conservation(t: dict[str, int]) -> dict[str, int]:
    """Every frame a switch read is forwarded, consumed, dropped for one reason,
    or still inside: the difference must be zero.  An aggregator consumes
    contributions and originates results, which are then forwarded, dropped
    or inside like any frame."""
    accounted = (
        t.get("tx_frames", 0)
        + t.get("ctl_consumed", 0)
        + t.get("agg_consumed", 0)
        - t.get("agg_results", 0)
        + sum(t.get(k, 0) for k in DROP_REASONS)
        + sum(t.get(k, 0) for k in IN_FLIGHT)
    )
    return {
        "rx_frames": t.get("rx_frames", 0),
        "accounted": accounted,
        "difference": t.get("rx_frames", 0) - accounted,
    }


def switch_drops(sw: dict) -> int:
    """Every frame one switch dropped, for any reason, ring included."""
    return sum(sw["ring"].values()) + sum(p[k] for p in sw["ports"].values() for k in DROP_REASONS)


def _row(name: str, c: dict) -> list[str]:
    drops = {k.removeprefix("drop_"): c[k] for k in DROP_REASONS if c.get(k)}
    return [
        name,
        str(c["rx_frames"]),
        str(c["tx_frames"]),
        " ".join(f"{k}={v}" for k, v in drops.items()) or "-",
        str(c["ecn_marked"]),
        str(c["trimmed"]),
        str(c.get("llr_replays", 0)),
        f"{c['pause_tx']}/{c['pause_rx']}",
        str(c["q_bytes"]),
        str(c["q_hwm_bytes"]),
        f"{c['late_max_ns'] / 1000:.0f}",
    ]


def table(rows: list[list], header: list[str], indent: str = "") -> str:
    """Columns aligned on the widest cell, a header line first."""
    cells = [[str(c) for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join(
        (indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
        for r in cells
    )


def render(st: dict, show_all: bool = False) -> str:
    header = [
        "PORT",
        "RX",
        "TX",
        "DROPS",
        "ECN",
        "TRIM",
        "LLR",
        "PFC TX/RX",
        "QUEUE B",
        "HWM B",
        "LATE MAX us",
    ]
    lines = [
        f"lab {st['lab']}: time scale {st['time_scale']:g}, fabric up {st['uptime_s']:.1f} s, "
        f"fabric CPU {st['cpu_s']:.2f} s"
    ]
    for name, sw in st["switches"].items():
        rows = [
            _row(ifname, c)
            for ifname, c in sw["ports"].items()
            if show_all or c["rx_frames"] or c["tx_frames"]
        ]
        state = "" if sw["up"] else "  (DOWN)"
        buf = sw.get("buffer")
        rx = sw.get("rx")
        lost = " ".join(f"{k.removeprefix('drop_')}={v}" for k, v in sw["ring"].items() if v)
        if rx and rx.get("one_by_one_drops"):
            lost += f" ({rx['one_by_one_drops']} of them came frame by frame)"
        agg = {k: sum(c.get(k, 0) for c in sw["ports"].values()) for k in AGG_COUNTERS}
        lines.append(
            f"\n{name}{state}: {len(sw['ports'])} ports, {len(rows)} shown"
            + (f"; queued {buf['used_bytes']} B, high-water {buf['hwm_bytes']} B" if buf else "")
            + (f"; lost before a port read them: {lost}" if lost else "")
            + (
                f"; receiving {'through its RX ring' if rx['ring_up'] else 'frame by frame'}"
                f" (RX ring set up {rx['ring_builds']} times, taken down {rx['ring_parks']},"
                f" {rx.get('ring_backoffs', 0)} of them for a trickle)"
                if rx
                else ""
            )
            + (
                f"; aggregated {agg['agg_consumed']} contributions ({agg['agg_dup']} resent),"
                f" sent {agg['agg_results']} results ({agg['agg_replies']} again)"
                if agg["agg_consumed"]
                else ""
            )
        )
        if rows:
            lines.append(table(rows, header, "  "))
    c = conservation(totals(st))
    lines.append(
        f"\nconservation: {c['rx_frames']} frames read = {c['accounted']} forwarded, consumed, "
        f"dropped or in flight (difference {c['difference']})"
    )
    return "\n".join(lines)


RATE_KEYS = ("ecn_marked", "trimmed", "llr_replays", "pause_tx", "agg_consumed")


def rates(before: dict, after: dict, dt_s: float) -> dict[str, dict[str, dict]]:
    """What each switch port did between two stats snapshots dt_s apart
    (real seconds): rates in nominal bit/s (real x the time scale), link
    utilisation of what it sent, counts of drops, marks, trims, replays,
    pauses and frames its aggregator took in (in-network all-reduce), and its
    queue now.  Ports that did nothing are left out."""
    scale = Scale.of(after)
    link_bps = {name: lk["rate_bps"] for name, lk in after["links"].items()}
    out: dict[str, dict[str, dict]] = {}
    for sw, s1 in after["switches"].items():
        s0 = before["switches"].get(sw)
        if s0 is None:
            continue
        for ifname, c1 in s1["ports"].items():
            c0 = s0["ports"].get(ifname, {})

            def d(key: str, c0=c0, c1=c1) -> int:
                return c1.get(key, 0) - c0.get(key, 0)

            row = {
                "peer": c1["peer"],
                "link": c1["link"],
                "rx_bps": scale.nominal_bps(d("rx_bytes") * 8 / dt_s),
                "tx_bps": scale.nominal_bps(d("tx_bytes") * 8 / dt_s),
                "drops": sum(d(r) for r in DROP_REASONS),
                **{key: d(key) for key in RATE_KEYS},
                "q_bytes": c1["q_bytes"],
            }
            cap = link_bps.get(c1["link"], 0)
            row["tx_util"] = row["tx_bps"] / cap if cap else 0.0
            if row["rx_bps"] or row["tx_bps"] or row["drops"] or row["q_bytes"]:
                out.setdefault(sw, {})[ifname] = row
    return out


def render_rates(r: dict[str, dict[str, dict]], t_s: float) -> str:
    """One interval of `lab stats --watch` as text."""
    header = ["PORT", "PEER", "RX Gb/s", "TX Gb/s", "TX UTIL", "DROPS", "ECN", "TRIM", "LLR",
              "PAUSE", "AGG", "QUEUE B"]  # fmt: skip
    title = f"-- {t_s:7.1f} s (nominal rates)"
    rows = [
        [
            f"{sw}:{ifname}",
            c["peer"],
            f"{c['rx_bps'] / 1e9:.1f}",
            f"{c['tx_bps'] / 1e9:.1f}",
            f"{100 * c['tx_util']:.0f}%",
            c["drops"],
            c["ecn_marked"],
            c["trimmed"],
            c["llr_replays"],
            c["pause_tx"],
            c["agg_consumed"],
            c["q_bytes"],
        ]  # fmt: skip
        for sw, ports in r.items()
        for ifname, c in ports.items()
    ]
    return title + ("\n" + table(rows, header, "  ") if rows else "  no traffic")
