"""`ethplus compare`'s outputs: report.md, results.json and three plots.

Input: bench results (dataplane/run/bench.py), one per (collective, transport),
all on the same lab.  The report has a table per collective (busbw per size
per transport and each one's ratio to the best at that size, sizes whose
a size where the emulation fell behind marked), then the fidelity report of every run.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

from dataplane.model import (
    catalog,  # noqa: E402
    scenario_file,  # noqa: E402
)
from dataplane.report import timeline
from dataplane.report.fidelity import K_CHECK_FACTOR, K_MOVED_MAX, cpu_text, k_text, kernel_tcp_text
from dataplane.scale import Scale
from dataplane.units import rate_text, size_text  # noqa: E402

PLOT_WIDTH_IN, PLOT_DPI = 12, 100  # every plot is 1200 pixels wide
PLOTS = ("busbw.png", "link-utilisation.png", "queue-depth.png")


def _us(k: float, real_s: float) -> str:
    """Real seconds as nominal microseconds at time scale k."""
    return f"{Scale(k).nominal_s(real_s) * 1e6:.1f} us"


def _nominal_us(d: dict, key: str, k: float) -> str:
    """d's time `key` in nominal us: its fabric clock reading (key_nominal_us)
    if the run had one, else its real seconds (key_s) at time scale k."""
    v = d.get(f"{key}_nominal_us")
    return f"{v:.1f} us" if v is not None else _us(k, d[f"{key}_s"])


def run_name(r: dict) -> str:
    """A run's name in tables and plots (bench.run_name): the transport, and
    the algorithm when it is not the ring."""
    return r.get("name") or r["transport"]


def label(r: dict) -> str:
    return r.get("transport_label") or catalog.TRANSPORT_LABELS.get(r["transport"], r["transport"])


def by_collective(results: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in results:
        out.setdefault(r["collective"], []).append(r)
    return out


def comparison(runs: list[dict]) -> list[dict]:
    """Per size: each transport's busbw, its ratio to the best, and whether
    the emulation fell behind (a switch's pacer or an endpoint)."""
    sizes = sorted({row["size_bytes"] for r in runs for row in r["rows"]})
    out = []
    for size in sizes:
        cells = {}
        for r in runs:
            row = next((x for x in r["rows"] if x["size_bytes"] == size), None)
            if row is not None:
                cells[run_name(r)] = row
        best = max((c["busbw_GBps"] for c in cells.values()), default=0.0)
        per = {
            t: {
                "busbw_GBps": c["busbw_GBps"],
                "ratio_to_best": c["busbw_GBps"] / best if best else 0.0,
                "fell_behind": c["fell_behind"],
                "wrong": c["wrong"],
            }
            for t, c in cells.items()
        }
        out.append({"size_bytes": size, "transports": per})
    return out


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def markdown(results: list[dict], rec: dict) -> str:
    first = results[0]
    k = first["lab"]["time_scale"]
    lines = [
        f"# ethplus compare on lab {rec['name']}",
        "",
        f"Lab `{rec['name']}` ({rec['family']}, {first['world']} ranks) from `{rec['file']}`;"
        f" time scale k = {k:g} (real rate = nominal / k, real delay = nominal x k)."
        f" Fabric {'lossless (PFC)' if first['lab']['fabric_lossless'] else 'lossy (no PFC)'}."
        f" Data type {first['dtype']}, operator {first['op']}, {first['iters']} timed"
        f" iterations after {first['warmup']} warm-up. Times and bandwidths are nominal;"
        " GB/s = 1e9 bytes/s; busbw as nccl-tests defines it. The ideal busbw is one"
        f" rank's nominal capacity over all planes: {first['ideal_busbw_GBps']:.1f} GB/s"
        + (
            " (for an in-network all-reduce, that x 2(n-1)/n: each byte crosses a rank's"
            " links once each way)."
            if any(r.get("algo") == "in-network" for r in results)
            else "."
        ),
        "",
        "Transports: "
        + "; ".join(
            f"**{t}** = {lb}" for t, lb in dict.fromkeys((run_name(r), label(r)) for r in results)
        )
        + ".",
        "",
    ]
    for coll, runs in by_collective(results).items():
        names = [run_name(r) for r in runs]
        lines += [f"## {coll}", ""]
        header = ["size", *(f"{t} busbw (GB/s)" for t in names), *(f"{t} / best" for t in names)]
        rows = []
        for c in comparison(runs):
            cells = [c["transports"].get(t) for t in names]
            bw = [
                "-"
                if x is None
                else f"{x['busbw_GBps']:.2f}"
                + (" (behind)" if x["fell_behind"] else "")
                + (f" ({x['wrong']} wrong)" if x["wrong"] else "")
                for x in cells
            ]
            ratio = ["-" if x is None else f"{x['ratio_to_best']:.2f}" for x in cells]
            rows.append([size_text(c["size_bytes"]), *bw, *ratio])
        lines += _md_table(header, rows)
        lines += [
            "",
            "Average busbw: "
            + ", ".join(
                f"{run_name(r)} {r['avg_busbw_GBps']:.2f} GB/s"
                f" ({r['avg_busbw_GBps'] / r['ideal_busbw_GBps']:.0%} of ideal)"
                for r in runs
            )
            + ".",
            "",
        ]
    lines += [
        "## Plots",
        "",
        "- `busbw.png`: busbw against size, per transport, one panel per collective.",
        "- `link-utilisation.png`: utilisation of each plane's switch egress links over"
        " (nominal) time, one panel per run.",
        "- `queue-depth.png`: the deepest egress queue of each switch over (nominal) time,"
        " one panel per run.",
        "",
        "## Fidelity",
        "",
        "A size is marked *(behind)* when, during it, a switch pacer lost more than 5% of"
        " a link's time beyond its bounded catch-up, or frames left their delay lines late"
        " by more than 10% of the base RTT on average.",
        "",
    ]
    for r in results:
        lines += _fidelity_md(r)
    return "\n".join(lines) + "\n"


def _k_checks_md(f: dict) -> list[str]:
    """The sizes checked at a larger k (trials.check_k): each one's nominal
    time against that k's, and which moved (their rows are the larger k's)."""
    if not f.get("k_checks"):
        return []
    return [
        f"- Checked at {K_CHECK_FACTOR:g}x their k (a size that moved past {K_MOVED_MAX:.0%}"
        " held the host's latency, and its row is the larger k's run): "
        + ", ".join(
            f"{size_text(c['size_bytes'])} k {c['k_range'][1]:g} -> {c['k']:g}:"
            f" {c['ratio']:.3f}{' moved' if c['moved'] else ''}"
            for c in f["k_checks"]
        )
        + "."
    ]


def _fidelity_md(r: dict) -> list[str]:
    f = r["fidelity"]
    p, c = f["pacer"], f["cpu"]
    out = [
        f"### {r['collective']} over {run_name(r)}"
        + ("" if f["clean"] else " — NOT CLEAN, read with care"),
        "",
    ]
    rows = [
        [
            ln["port"],
            rate_text(ln["configured_nominal_bps"], "Gbit/s", "g"),
            rate_text(ln["configured_real_bps"], "Mbit/s", ".2f"),
            f"{rate_text(ln['peak_real_bps'], 'Mbit/s', '.2f')} ({ln['peak_share']:.0%})",
            rate_text(ln["busy_mean_real_bps"], "Mbit/s", ".2f"),
        ]
        for ln in f["links"]
    ]
    out += _md_table(
        [
            "busiest link",
            "configured (nominal)",
            "configured (real)",
            "peak achieved",
            "mean while busy",
        ],
        rows,
    )
    drops = "; ".join(
        f"{sw}: " + ", ".join(f"{k} {v}" for k, v in d.items()) for sw, d in f["drops"].items()
    )
    behind = ", ".join(size_text(s) for s in f["fell_behind_sizes"])
    out += [
        "",
        f"- Pacer: {p['late_frames']} of {p['tx_frames']} frames left more than 100 us (real) late"
        f" ({p['late_share']:.1%}); link time lost beyond catch-up"
        f" {p['lost_link_ns'] / 1e6:.1f} ms.",
        f"- CPU: {cpu_text(c)}, machine {c['machine_busy_share']:.0%} busy"
        + (" (saturated)." if c["saturated"] else "."),
        f"- Switch drops and marks: {drops or 'none'};"
        f" NIC retransmissions: {f['nic_retransmissions']}"
        + (f"; kernel TCP: {kernel_tcp_text(f['kernel_tcp'])}." if f.get("kernel_tcp") else "."),
        f"- Sizes where the emulation fell behind (switches or endpoints): {behind or 'none'}.",
        *_k_checks_md(f),
        f"- Time scale {f['time_scale']:g}. Not time-scaled: "
        + "; ".join(f["not_time_scaled"])
        + ".",
        "",
    ]
    return out


def _fig(rows: int):
    fig, axes = plt.subplots(rows, 1, figsize=(PLOT_WIDTH_IN, 3.2 * rows + 0.8), squeeze=False)
    return fig, [a[0] for a in axes]


def plot_busbw(results: list[dict], path: Path) -> None:
    groups = by_collective(results)
    fig, axes = _fig(len(groups))
    for ax, (coll, runs) in zip(axes, groups.items(), strict=True):
        for r in runs:
            xs = [row["size_bytes"] for row in r["rows"]]
            ys = [row["busbw_GBps"] for row in r["rows"]]
            ax.plot(xs, ys, marker="o", label=label(r))
            late = [
                (x, y) for x, y, row in zip(xs, ys, r["rows"], strict=True) if row["fell_behind"]
            ]
            if late:
                ax.scatter(*zip(*late, strict=True), marker="x", color="red", zorder=3)
        for i, ideal in enumerate(sorted({r["ideal_busbw_GBps"] for r in runs})):
            ax.axhline(ideal, color="grey", linestyle="--" if i == 0 else ":",
                       label="ideal" if i == 0 else "ideal, in-network")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes per rank)")
        ax.set_ylabel("busbw (GB/s, nominal)")
        ax.set_title(f"{coll} on {runs[0]['lab']['name']} (k={runs[0]['lab']['time_scale']:g})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def _plot_series(results: list[dict], path: Path, key: str, ylabel: str, scale: float) -> None:
    fig, axes = _fig(len(results))
    for ax, r in zip(axes, results, strict=True):
        s = r.get("series", {})
        ms = Scale.of(r["lab"]).nominal_s(1e3)  # real s -> nominal ms
        for i, (size, a, b) in enumerate(s.get("windows", [])):
            ax.axvspan(a * ms, b * ms, color="grey", alpha=0.12 if i % 2 else 0.22, linewidth=0)
            ax.text((a + b) / 2 * ms, 1.0, size_text(size), transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7)  # fmt: skip
        for name, ys in sorted(s.get(key, {}).items()):
            xs = [t * ms for t in s["t_s"][: len(ys)]]
            ax.plot(xs, [y * scale for y in ys], label=name, linewidth=1)
        ax.set_title(f"{r['collective']} over {run_name(r)} (shaded: timed part of each size)",
                     pad=14)  # fmt: skip
        ax.set_xlabel("time since the run started (ms, nominal)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if s.get(key):
            ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def write(out_dir: str, results: list[dict], rec: dict) -> dict[str, str]:
    """Write report.md, results.json and the plots; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "report": out / "report.md",
        "results": out / "results.json",
        **{p.removesuffix(".png"): out / p for p in PLOTS},
    }
    doc = {
        "schema": "ethplus-compare/1",
        "lab": results[0]["lab"],
        "runs": results,
        "comparison": {c: comparison(runs) for c, runs in by_collective(results).items()},
    }
    paths["results"].write_text(json.dumps(doc, indent=1) + "\n")
    paths["report"].write_text(markdown(results, rec))
    plot_busbw(results, paths["busbw"])
    _plot_series(results, paths["link-utilisation"], "plane_util", "egress utilisation (%)", 100)
    _plot_series(results, paths["queue-depth"], "queue_bytes", "deepest queue (KB)", 1e-3)
    return {k: str(v) for k, v in paths.items()}


# ---------------------------------------------------------------- scenarios


def plot_timeline(result: dict, path: Path, k: float) -> None:
    """Per-job busbw of every timed iteration over nominal time (k: the
    lab's time scale), one panel per transport, the fault events as
    vertical lines."""
    ts = result["transports"]
    ms = Scale(k).nominal_s(1e3)  # real s -> nominal ms, for a run without the fabric clock

    def at_ms(d: dict, key: str) -> float:  # on the fabric clock: right when k moved
        v = d.get(f"{key}_nominal_us")
        return v / 1e3 if v is not None else d[f"{key}_s"] * ms

    fig, axes = _fig(len(ts))
    for ax, r in zip(axes, ts.values(), strict=True):
        for jname, j in r["jobs"].items():
            its = j.get("iterations", [])
            if its:
                xs = [at_ms(x, key) for x in its for key in ("start", "end")]
                ys = [x["busbw_GBps"] for x in its for _ in (0, 1)]
                ax.plot(xs, ys, label=jname, linewidth=1.2)
        for f in r["faults_applied"]:
            ax.axvline(at_ms(f, "at"), color="red", linestyle="--", linewidth=1)
            ax.text(
                at_ms(f, "at"),
                1.0,
                f" {f['name']} {f['set']}",
                transform=ax.get_xaxis_transform(),
                color="red",
                fontsize=7,
                va="top",
                rotation=90,
            )
        stalled = f" (stalled: {', '.join(r['stalled'])})" if r["stalled"] else ""
        ax.set_title(f"{result['scenario']} over {r['label']}{stalled}")
        ax.set_xlabel("time since the timed phase started (ms, nominal)")
        ax.set_ylabel("busbw per iteration (GB/s, nominal)")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a stalled job may have no iteration to plot
            ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def scenario_markdown(result: dict, rec: dict) -> str:
    s = result["summary"]
    k = float(rec["time_scale"])
    lines = [
        f"# Scenario {result['scenario']}" + (" (short form)" if result["short"] else ""),
        "",
        result["description"],
        "",
        result["explain"],
        "",
        f"Lab `{rec['name']}` ({rec['family']}) from `{rec['file']}`, time scale k = {k:g}"
        + (
            " (governed: its floor; each transport's section gives the k it ran at)"
            if rec.get("time_scale_setting") == "auto"
            else ""
        )
        + f"; seed {result['seed']}. Times and bandwidths are nominal (the fabric's time: real"
        " time / k); times marked real are wall-clock on this machine, for reference only.",
        "",
        "## Result",
        "",
    ]
    unit = scenario_file.METRIC_UNITS[s["metric"]]
    spread = s.get("spread", {})
    bound = plane_bound(result, rec)
    rows = [
        [
            t,
            figure_text(result["transports"].get(t, {}), v),
            f"{spread[t][0]:.3f}-{spread[t][1]:.3f}" if spread.get(t) else "-",
            stalled_text(result["transports"].get(t, {})),
            *([f"{bound:.3f}"] if bound else []),
            f"{s['ethplus_advantage'][t]:.2f}x" if t in s["ethplus_advantage"] else "-",
        ]
        for t, v in s["figures"].items()
    ]
    ref = s.get("reference") or "ethplus"
    lines += _md_table(
        ["transport", unit, "iterations' range", "stalled (nominal us)",
         *(["bound P/(P-1)"] if bound else []), f"{ref}'s advantage"],
        rows,
    )  # fmt: skip
    if s["metric"] == "slowdown" and not result.get("alone"):
        lines += [
            "",
            "Slowdown: the nominal time the iterations that met the fault window (from the"
            " first fault to the next, its restore) took, first start to last end, against as"
            " many clean iterations (the median of those wholly outside the window); an"
            " iteration that straddles the window counts whole. Stalled: the time iterations"
            f" over {timeline.STALL_FACTOR:g}x the job's median took beyond the median.",
        ]
    lines += [
        "",
        "The range is the figure had every timed iteration been the job's best, or its"
        " worst: a wide one says the figure moves from run to run (more iterations,"
        " `--iters`, narrow what a run's figure stands for).",
        "",
    ]
    if result.get("repeat", 1) > 1:
        lines += [
            f"Each figure is the median of {result['repeat']} runs of its transport (`--repeat`);"
            " each run's figure is in the transport's section, whose tables are the median"
            " run's.",
            "",
        ]
    if s.get("fell_behind"):
        lines += [
            f"**Fell behind** in {', '.join(s['fell_behind'])}: some part of the emulation (a"
            " switch's pacer or an endpoint) could not keep up during a size of a job, so those"
            " figures are partly the machine's; rerun at a larger time scale.",
            "",
        ]
    if bound:
        p = round(bound / (bound - 1))
        lines += [f"With one of its {p} planes gone, the best a transport can do is"
                  f" P/(P-1) = {p}/{p - 1} = {bound:.2f} of its time per iteration.",
                  ""]  # fmt: skip
    for tname, r in result["transports"].items():
        lines += [f"## {r['label']}", ""]
        if r.get("k_range"):
            lines += [f"Time scale during the run: k = {k_text(r['k_range'])}.", ""]
        if r.get("reruns"):
            lines += [
                "The run fell behind at k = "
                + ", ".join(k_text(x["k_range"]) for x in r["reruns"])
                + f" and ran again at a larger k ({len(r['reruns'])} time(s)): the figures are"
                " the last run's.",
                "",
            ]
        if r.get("repeats"):
            lines += [repeats_line(r["repeats"], r["figure_median"], unit), ""]
        rows = []
        for jname, j in r["jobs"].items():
            if j["status"] == "failed":
                rows.append([jname, "FAILED", "-", "-", "-", "-", "-", j["error"]])
                continue
            rows.append(
                [
                    jname,
                    j["collective"],
                    f"{j['jct_nominal_us']:.1f}",
                    f"{j['jct_real_s']:.2f}",
                    f"{j['busbw_GBps']:.2f}",
                    str(j["wrong"]),
                    f"{j['slowdown_vs_alone']:.2f}x" if j["slowdown_vs_alone"] else "-",
                    "behind" if j.get("fell_behind") else "ok",
                ]
            )
        lines += _md_table(
            ["job", "collective", "JCT (nominal us)", "JCT (real s, this machine)",
             "busbw (GB/s)", "#wrong", "slowdown vs alone", "fidelity"],
            rows,
        ) + [""]  # fmt: skip
        lines += _stall_lines(r, k)
        for jname, j in r["jobs"].items():
            if len(j.get("phases", [])) > 1:
                lines.append(
                    f"Phases of {jname} (busbw of the iterations wholly inside each): "
                    + "; ".join(
                        (f"{p['phase']}: {p['busbw_GBps']:.2f} GB/s ({p['iterations']} iterations"
                         if p["busbw_GBps"] is not None else
                         f"{p['phase']}: too few whole iterations to tell ({p['iterations']}"
                         f" whole, {p['met']} met it")
                        + f", the longest {_nominal_us(p, 'longest_iteration', k)} nominal)"
                        for p in j["phases"]
                    )
                    + "."
                )
        if r["faults_applied"]:
            lines += [
                "",
                "Faults applied (nominal time after the timed phase began, on the fabric's"
                " clock: planned, and when it took effect; real seconds for reference): "
                + "; ".join(
                    f"{f['name']} {f['set']} at {f['planned_us']:.1f} us"
                    f" ({f['at_nominal_us']:.1f} us, {f['late_us']:.1f} us late;"
                    f" {f['at_s']:.3f} s real)"
                    for f in r["faults_applied"]
                )
                + ".",
            ]
        lines.append("")
        if r["fidelity"]:
            fake = {"collective": "the first job", "transport": tname, "fidelity": r["fidelity"]}
            lines += _fidelity_md(fake)
    lines += ["## At a larger time scale", "", *scenario_k_check_lines(result), ""]
    lines += [
        "## Plots",
        "",
        "- `timeline.png`: each job's busbw per iteration over time, faults marked.",
        "- `busbw.png`, `link-utilisation.png`, `queue-depth.png`: as `compare`"
        " writes them (utilisation and queues sampled during the first job).",
    ]
    return "\n".join(lines) + "\n"


def repeats_line(repeats: list[dict], median: float | None, unit: str) -> str:
    """A transport's runs (scenario --repeat): each one's figure, k and verdict."""
    runs = "; ".join(
        ("stalled or failed" if x["figure"] is None else f"{x['figure']:.4g}")
        + f" at k={k_text(x['k_range'])}"
        + (", behind" if x["fell_behind"] else "")
        + (f", ran again {x['reruns']}x" if x["reruns"] else "")
        for x in repeats
    )
    shown = "none (a run stalled or failed)" if median is None else f"{median:.4g}"
    unit = f" ({unit})" if unit else ""
    return f"Runs{unit}: {runs}. Median {shown}; the tables are the median run's."


def scenario_k_check_lines(result: dict) -> list[str]:
    """What `scenario run --check-k` found (scenario.check_k), a line per
    transport; or, unchecked, what the check would cost."""
    check = result.get("k_check")
    if not check:
        real_s = sum(r.get("real_s", 0.0) for r in result["transports"].values())
        return [
            f"k check: not run (`--check-k` runs each transport again at {K_CHECK_FACTOR:g}x the"
            f" highest k of this run, about {K_CHECK_FACTOR * real_s:.0f} s of real time here,"
            " and says whether each figure held)"
        ]
    unit = scenario_file.METRIC_UNITS[result["summary"]["metric"]]
    out = [
        f"k check: each transport again at {check['factor']:g}x the highest k of the run"
        f" ({check['k_top']:g})"
        + (f", {check['repeat']} runs each, medians" if check.get("repeat", 1) > 1 else "")
        + f"; a figure that is the fabric's holds ({unit}):"
    ]
    for t, c in check["transports"].items():
        fig = "stalled or failed" if c["figure"] is None else f"{c['figure']:.4g}"
        fig_k = "stalled or failed" if c["figure_at_k"] is None else f"{c['figure_at_k']:.4g}"
        if c["held"] is None:
            verdict = "no verdict: " + (
                "a run fell behind" if any(c["fell_behind"]) else "a run stalled or failed"
            )
        else:
            verdict = "held" if c["held"] else "MOVED"
        ratio = "-" if c["ratio"] is None else f"{c['ratio']:.3f}"
        out.append(
            f"{t}: {fig} at k={k_text(c['k_range'])}, {fig_k} at k={c['k']:g}: {ratio}"
            f" ({verdict}, band +-{c['band'] * 100:.0f}%; {c['real_s']:.0f} s real)"
            + (f"; #wrong {c['wrong']}" if c["wrong"] else "")
            + (f"; {c['note']}" if c["note"] else "")
        )
    for t, r in check.get("runs", {}).items():
        if r.get("repeats"):
            out.append(f"{t} at k={check['transports'][t]['k']:g}: "
                       + repeats_line(r["repeats"], r["figure_median"], ""))  # fmt: skip
    adv = check.get("ethplus_advantage_at_k") or {}
    if adv:
        out.append(
            "advantage at the larger k: " + ", ".join(f"{t} {v:.2f}x" for t, v in adv.items())
        )
    return out


def plane_bound(result: dict, rec: dict) -> float | None:
    """P/(P-1), the best slowdown a transport can have with one of P planes
    gone: for a scenario that takes a plane's switch down, else None."""
    planes = {n["name"]: n.get("plane") for n in rec["topology"]["nodes"]
              if n["role"] == "switch" and n.get("plane") is not None}  # fmt: skip
    p = len(set(planes.values()))
    down = any(f.get("target") == "node" and f.get("name") in planes and f.get("words") == ["down"]
               for f in result.get("planned_faults", []))  # fmt: skip
    return p / (p - 1) if down and p > 1 else None


def figure_text(r: dict, v: float | None) -> str:
    """A headline figure, or why there is none."""
    if v is not None:
        return f"{v:.3f}"
    whys = []
    for j in r.get("jobs", {}).values():
        whys.append(j.get("fault_slowdown", {}).get("why"))
        ph = j.get("phases", [])
        for p in (ph[0], ph[-1]) if len(ph) > 1 else ():  # what the phases metric compares
            if p["busbw_GBps"] is None:
                whys.append(f"{p['phase']}: {p['iterations']} whole iteration(s), fewer than"
                            f" {timeline.MIN_CLEAN}")  # fmt: skip
    why = next((w for w in whys if w), None)
    return f"none: {why}" if why else "stalled or failed"


def stalled_text(r: dict) -> str:
    """The longest a transport's jobs stalled (nominal us), or '-'."""
    st = [j.get("stalled_nominal_us") or 0.0 for j in r.get("jobs", {}).values()]
    return f"{max(st):.1f}" if st and max(st) > 0 else "-"


STALL_COUNTERS = (  # what a job's counters say about a stall: (key, words)
    ("retx_timeout", "NIC retransmit timeouts"),
    ("tx_rnrs", "receiver-not-ready answers"),
    ("peer_resets", "peer restarts"),
)


def stall_counters(res: dict) -> str:
    """A job's run in counters that explain a stall: the transport's
    timeouts (the NIC's, or kernel TCP's), and the switches' drops by reason
    and pauses (fidelity.drops), nonzero only."""
    said = []
    nic = res.get("nic_counters") or {}
    said += [f"{nic[key]} {words}" for key, words in STALL_COUNTERS if nic.get(key)]
    tcp = (res.get("fidelity") or {}).get("kernel_tcp") or {}
    if tcp.get("tcp_rtos"):
        said.append(f"{tcp['tcp_rtos']} kernel TCP retransmit timeouts"
                    f" ({tcp.get('tcp_rto_time_ms', 0)} ms real in RTO recovery)")  # fmt: skip
    by_reason: dict[str, int] = {}
    for counts in ((res.get("fidelity") or {}).get("drops") or {}).values():
        for why, n in counts.items():
            by_reason[why] = by_reason.get(why, 0) + n
    said += [f"{n} {why}" for why, n in sorted(by_reason.items()) if n]
    return ", ".join(said)


def _stall_lines(r: dict, k: float) -> list[str]:
    """Whether each job stalled (timeline.stalls: an iteration over
    STALL_FACTOR times the job's median, nominal), what the counters say
    happened over its run, and the deepest queues sampled."""
    out = []
    for jname, j in r["jobs"].items():
        if j["status"] == "failed" or "iterations" not in j:
            continue
        median = j.get("median_iteration_nominal_us")
        if median is None:
            if r["faults_applied"]:
                out.append(f"{jname}: {len(j['iterations'])} timed iteration(s), too few to tell"
                           " a stall by.")  # fmt: skip
            continue
        if j.get("stalls"):
            each = "; ".join(
                f"iteration {x['iteration'] + 1} took {x['time_nominal_us']:.1f} us"
                f" ({x['times_median']:.1f}x), from {x['start_nominal_us']:.1f} us"
                for x in j["stalls"]
            )
            out.append(
                f"**{jname} stalled** {j['stalled_nominal_us']:.1f} us nominal in all (iterations"
                f" over {timeline.STALL_FACTOR:g}x its median of {median:.1f} us): {each}."
            )
            said = stall_counters(r["results"].get(jname, {}))
            if said:
                out.append(f"Over {jname}'s run (counters are the run's, not an iteration's):"
                           f" {said}.")  # fmt: skip
        elif r["faults_applied"]:
            out.append(
                f"{jname} did not stall (longest iteration"
                f" {j['longest_iteration_nominal_us']:.1f} us, median {median:.1f} us, nominal)."
            )
    sampled = r["results"].get(next(iter(r["jobs"])), {}).get("series", {})
    deepest = {sw: max(q) for sw, q in sampled.get("queue_bytes", {}).items() if q}
    if deepest:
        shown = ", ".join(
            f"{sw} {size_text(q, binary=False, unit='KB', spec='.0f')}"
            for sw, q in sorted(deepest.items())
        )
        out.append(f"Deepest egress queue sampled per switch (every 0.2 s): {shown}.")
    return [*out, ""] if out else []


def write_scenario(out_dir: str, result: dict, rec: dict) -> dict[str, str]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "report": out / "report.md",
        "results": out / "results.json",
        "timeline": out / "timeline.png",
        **{p.removesuffix(".png"): out / p for p in PLOTS},
    }
    paths["results"].write_text(json.dumps(result, indent=1) + "\n")
    paths["report"].write_text(scenario_markdown(result, rec))
    plot_timeline(result, paths["timeline"], float(rec["time_scale"]))
    runs = []
    for r in result["transports"].values():
        for jname, res in r["results"].items():
            runs.append({**res, "label": f"{jname} / {r['label']}"})
    sampled = [
        r["results"][next(iter(r["jobs"]))]
        for r in result["transports"].values()
        if next(iter(r["jobs"])) in r["results"]
    ]
    if runs:
        plot_busbw(runs, paths["busbw"])
    if sampled:
        _plot_series(
            sampled, paths["link-utilisation"], "plane_util", "egress utilisation (%)", 100
        )
        _plot_series(sampled, paths["queue-depth"], "queue_bytes", "deepest queue (KB)", 1e-3)
    return {k: str(v) for k, v in paths.items() if v.exists()}
