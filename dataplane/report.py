"""`ethplus compare`'s outputs: report.md, results.json and three plots.

Input: bench results (dataplane/bench.py), one per (collective, transport),
all on the same lab.  The report has a table per collective (busbw per size
per transport and each one's ratio to the best at that size, sizes whose
pacing fell behind marked), then the fidelity report of every run.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

from dataplane import transport  # noqa: E402

PLOT_WIDTH_IN, PLOT_DPI = 12, 100  # every plot is 1200 pixels wide
PLOTS = ("busbw.png", "link-utilisation.png", "queue-depth.png")


def human_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n} B"


def by_collective(results: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in results:
        out.setdefault(r["collective"], []).append(r)
    return out


def comparison(runs: list[dict]) -> list[dict]:
    """Per size: each transport's busbw, its ratio to the best, and whether
    its pacing fell behind."""
    sizes = sorted({row["size_bytes"] for r in runs for row in r["rows"]})
    out = []
    for size in sizes:
        cells = {}
        for r in runs:
            row = next((x for x in r["rows"] if x["size_bytes"] == size), None)
            if row is not None:
                cells[r["transport"]] = row
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
        f" rank's nominal capacity over all planes: {first['ideal_busbw_GBps']:.1f} GB/s.",
        "",
        "Transports: "
        + "; ".join(
            f"**{t}** = {transport.LABELS.get(t, t)}"
            for t in dict.fromkeys(r["transport"] for r in results)
        )
        + ".",
        "",
    ]
    for coll, runs in by_collective(results).items():
        names = [r["transport"] for r in runs]
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
            rows.append([human_size(c["size_bytes"]), *bw, *ratio])
        lines += _md_table(header, rows)
        lines += [
            "",
            "Average busbw: "
            + ", ".join(
                f"{r['transport']} {r['avg_busbw_GBps']:.2f} GB/s"
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
        " (real) time, one panel per run.",
        "- `queue-depth.png`: the deepest egress queue of each switch over (real) time,"
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


def _fidelity_md(r: dict) -> list[str]:
    f = r["fidelity"]
    p, c = f["pacer"], f["cpu"]
    out = [
        f"### {r['collective']} over {r['transport']}"
        + ("" if f["clean"] else " — NOT CLEAN, read with care"),
        "",
    ]
    rows = [
        [
            ln["port"],
            f"{ln['configured_nominal_bps'] / 1e9:g} Gbit/s",
            f"{ln['configured_real_bps'] / 1e6:.2f} Mbit/s",
            f"{ln['peak_real_bps'] / 1e6:.2f} Mbit/s ({ln['peak_share']:.0%})",
            f"{ln['busy_mean_real_bps'] / 1e6:.2f} Mbit/s",
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
    behind = ", ".join(human_size(s) for s in f["fell_behind_sizes"])
    out += [
        "",
        f"- Pacer: {p['late_frames']} of {p['tx_frames']} frames left more than 100 us (real) late"
        f" ({p['late_share']:.1%}); link time lost beyond catch-up"
        f" {p['lost_link_ns'] / 1e6:.1f} ms.",
        f"- CPU: fabric {c['fabric_cores']:.2f} cores, workers {c['workers_cores']:.2f} cores,"
        f" machine {c['machine_busy_share']:.0%} busy"
        + (" (saturated)." if c["saturated"] else "."),
        f"- Switch drops and marks: {drops or 'none'};"
        f" NIC retransmissions: {f['nic_retransmissions']}.",
        f"- Sizes whose pacing fell behind: {behind or 'none'}.",
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
            ax.plot(xs, ys, marker="o", label=transport.LABELS.get(r["transport"], r["transport"]))
            late = [
                (x, y) for x, y, row in zip(xs, ys, r["rows"], strict=True) if row["fell_behind"]
            ]
            if late:
                ax.scatter(*zip(*late, strict=True), marker="x", color="red", zorder=3)
        ax.axhline(runs[0]["ideal_busbw_GBps"], color="grey", linestyle="--", label="ideal")
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
        for i, (size, a, b) in enumerate(s.get("windows", [])):
            ax.axvspan(a, b, color="grey", alpha=0.12 if i % 2 else 0.22, linewidth=0)
            ax.text((a + b) / 2, 1.0, human_size(size), transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7)  # fmt: skip
        for name, ys in sorted(s.get(key, {}).items()):
            ax.plot(s["t_s"][: len(ys)], [y * scale for y in ys], label=name, linewidth=1)
        ax.set_title(f"{r['collective']} over {r['transport']} (shaded: timed part of each size)",
                     pad=14)  # fmt: skip
        ax.set_xlabel("time since the run started (s, real)")
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
