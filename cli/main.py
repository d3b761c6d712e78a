"""The `ethplus` command: argument parsing and printing only."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time

from dataplane.errors import EthplusError, UsageError
from dataplane.lab.labs import LabError
from dataplane.report.stats import table
from dataplane.run.bench import BenchError
from dataplane.scale import Scale
from dataplane.units import rate_text, size_text

# ---------------------------------------------------------------- lab


def cmd_lab_up(args) -> int:
    from dataplane.lab import cgroup, labs
    from dataplane.model import labfile

    spec = labfile.load(args.file, name=args.name)
    if args.time_scale is not None:
        spec.pin_time_scale(args.time_scale)
    elif args.pin:
        spec.time_scale_raw = spec.time_scale  # the auto choice, as a number: not governed
    rec = labs.up(spec)
    if args.json:
        print(json.dumps(rec, indent=1))
        return 0
    t = spec.topology
    print(
        f"lab {spec.name} is up: {len(t.nodes)} namespaces, {len(t.links)} veth pairs, "
        f"{len(t.switches())} switches ({rec['timings_s']['total_s']:.2f} s)"
    )
    print(f"  time scale {spec.time_scale:g}: {_scale_reason(spec)}")
    for note in rec.get("rootless_notes", []):
        print(f"  rootless: {note}")
    why = rec.get("tcp_syn_rto")
    if why not in (cgroup.SYN_RTO_MAX, cgroup.SYN_RTO_LINUX):
        print(f"  kernel TCP: a SYN goes again after Linux's 1 s of real time ({why})")
    print(f"  ethplus lab show {spec.name}    ethplus exec {spec.name} h0 -- ip addr")
    print(f"  ethplus lab down {spec.name}")
    return 0


def _scale_reason(spec) -> str:
    from dataplane.model.topology import AUTO_REAL_BUDGET_BPS

    total = spec.topology.total_link_rate_bps()
    how = (
        f"auto, the smallest k that fits {len(spec.topology.links)} links, "
        f"{rate_text(total)} nominal, into this machine's {rate_text(AUTO_REAL_BUDGET_BPS)} "
        "real budget"
        if spec.time_scale_raw == "auto"
        else f"set by {'--time-scale' if isinstance(spec.time_scale_raw, float) else 'the file'}"
    )
    return (
        f"{how}; real rate = nominal / {spec.time_scale:g}, real delay = nominal x "
        f"{spec.time_scale:g} ({rate_text(total / spec.time_scale)} real in all)"
    )


def cmd_lab_down(args) -> int:
    from dataplane.lab import labs

    if args.all == bool(args.name):
        raise LabError("give a lab name or --all (not both)")
    if args.all:
        names = labs.down_all()
        print(f"removed {len(names)} lab(s)" + (": " + ", ".join(names) if names else ""))
        return 0
    print(f"lab {args.name} removed ({labs.down(args.name)})")
    return 0


def cmd_lab_ls(args) -> int:
    from dataplane.lab import labs

    labs = labs.listing()
    if args.json:
        print(json.dumps(labs, indent=1))
        return 0
    if not labs:
        print("no labs are running")
        return 0
    rows = [
        [
            x["name"],
            x["status"],
            x["family"],
            x["nodes"],
            x["links"],
            f"{x['time_scale']:g}" if x["time_scale"] else "-",
            x["file"],
        ]
        for x in labs
    ]
    print(table(rows, ["NAME", "STATUS", "FAMILY", "NODES", "LINKS", "SCALE", "FILE"]))
    return 0


# The lab-wide tables of a lab file (links are shown per link by `lab show`).


def _toml_text(v) -> str:
    return json.dumps(v) if not isinstance(v, float) else f"{v:g}"


def _settings_table(family: str, rec: dict | None = None) -> str:
    """Every lab-wide key a lab file of this family takes, from its
    declaration (labfile.schema): default, meaning and, for a lab, its
    value there."""
    from dataplane.model import labfile

    rows = []
    for sec, fields in labfile.schema(family).items():
        for key, f in fields.items():
            default = "(required)" if f.default is None else _toml_text(f.default)
            row = [f"{sec}.{key}", default, f.help or f.expected]
            if rec is not None:
                # as read from the file, defaults filled in (a lab's name and
                # k are its own: --name, and the k it runs at)
                read = rec.get("settings", {}).get(sec) or rec.get(sec, {})
                v = read.get(key, f.default) if sec != "lab" else rec.get(key)
                row.insert(1, _toml_text(v))
            rows.append(row)
    head = ["KEY", "DEFAULT", "MEANING"]
    return table(rows, head if rec is None else head[:1] + ["VALUE"] + head[1:])


def cmd_lab_keys(args) -> int:
    from dataplane.model import labfile

    for family in [args.family] if args.family else labfile.FAMILIES:
        print(f"# {family}")
        print(_settings_table(family))
        print()
    return 0


def cmd_lab_show(args) -> int:
    from dataplane.lab import labs

    rec = labs.get(args.name)
    if args.json:
        print(json.dumps(rec, indent=1))
        return 0
    if args.settings:
        print(_settings_table(rec["family"], rec))
        return 0
    k = rec["time_scale"]
    topo = rec["topology"]
    setting = rec["time_scale_setting"]
    print(f"lab {rec['name']}  ({rec['family']}, {rec['description']})")
    print(f"  file        {rec['file']}")
    gov = None
    if setting == "auto":
        try:
            gov = labs.control(args.name, {"op": "governor"})["governor"]
        except LabError:
            gov = None  # the fabric does not answer: the record's k
    if gov is None:
        print(
            f"  time scale  {k:g}"
            + (
                " (auto: total nominal link rate / 2 Gbit/s real budget)"
                if setting == "auto"
                else ""
            )
        )
    else:
        state = "governed" if gov["on"] else "pinned by `lab scale`"
        print(
            f"  time scale  {gov['k']:g} now ({state}; floor {gov['floor_k']:g}, the auto choice)"
        )
        if gov["events"]:
            e = gov["events"][-1]
            ago = time.monotonic() - e["t_real"]
            change = f"{e['k_from']:g} -> {e['k_to']:g}"
            print(f"              last change {ago:.0f} s ago: {change}, {e['why']}")
    print(f"  nodes       {len(topo['nodes'])}   links {len(topo['links'])}   tag {rec['tag']}")
    sw = rec["switch"]
    shared = sw.get("shared_buffer_bytes", 0)
    buffers = (
        f"shared buffer {size_text(shared, binary=False)} (alpha {sw.get('dt_alpha', 1.0):g})"
        if shared
        else "per-port buffers"
    )
    headroom = sw.get("pfc_headroom_bytes", 0)
    lossless = (
        f"lossless (PFC: XOFF {size_text(sw['pfc_xoff_bytes'], binary=False)},"
        f" XON {size_text(sw['pfc_xon_bytes'], binary=False)}, headroom"
        f" {size_text(headroom, binary=False) if headroom else 'from each link'})"
        if sw["lossless"]
        else "lossy"
    )
    print(
        f"  switch      forwarding {sw['forwarding']}, ecn {sw['ecn']}, trimming {sw['trimming']}, "
        f"{lossless}, {buffers}, "
        + (
            f"in-network computing ({sw.get('inc_slots', 1024)} slots per switch)"
            if sw.get("inc")
            else "no in-network computing"
        )
        + f"; nic encapsulation {rec['nic']['encapsulation']},"
        f" congestion control {rec['nic'].get('cc', 'nscc')}"
    )
    print()
    rows = []
    for n in topo["nodes"]:
        where = []
        if n.get("plane") is not None:
            where.append(f"plane {n['plane']}")
        if n.get("rail") is not None:
            where.append(f"rail {n['rail']}")
        addrs = ",".join(p["ip"] for p in n["ports"] if p.get("ip"))
        rows.append([n["name"], n["kind"], len(n["ports"]), " ".join(where), addrs])
    print(table(rows, ["NODE", "KIND", "PORTS", "WHERE", "ADDRESSES"]))
    print()
    ifname = {(n["name"], p["index"]): p["ifname"] for n in topo["nodes"] for p in n["ports"]}
    rows = []
    for link in topo["links"]:
        prm = link["params"]
        rows.append(
            [
                link["name"],
                ifname[link["a"], link["a_port"]],
                ifname[link["b"], link["b_port"]],
                rate_text(prm["rate_bps"]),
                rate_text(Scale(k).real_bps(prm["rate_bps"])),
                f"{prm['delay_ns']} ns"
                + (f" + 0-{prm['jitter_ns']} ns" if prm.get("jitter_ns") else ""),
                size_text(prm["buffer_bytes"], binary=False),
                prm["mtu_bytes"],
                "on" if prm.get("llr") else "off",
            ]
        )
    print(
        table(
            rows,
            ["LINK", "A", "B", "RATE", "REAL RATE", "DELAY", "BUFFER", "MTU", "LLR"],
        )
    )
    return 0


def cmd_link_set(args) -> int:
    from dataplane.lab import labs
    from dataplane.model import changes

    try:
        change = changes.link_change(args.change)
    except ValueError as exc:
        raise LabError(str(exc)) from None
    resp = labs.control(args.lab, {"op": "link", "link": args.link, "set": change})
    st = resp["link"]
    print(
        f"{args.link}: {'up' if st['up'] else 'DOWN'}, rate {rate_text(st['rate_bps'])}, "
        f"delay {st['delay_ns']} ns"
        + (f" + 0-{st['jitter_ns']} ns jitter" if st.get("jitter_ns") else "")
        + f", loss {st['loss']:g}, corrupt {st['corrupt']:g}, "
        f"llr {'on' if st.get('llr') else 'off'} (nominal)"
    )
    return 0


def cmd_node_set(args) -> int:
    from dataplane.lab import labs

    resp = labs.control(args.lab, {"op": "node", "node": args.node, "up": args.state == "up"})
    print(f"{resp['node']}: {'up' if resp['up'] else 'DOWN'}")
    return 0


def cmd_lab_scale(args) -> int:
    from dataplane.lab import labs

    rec = labs.get(args.name)
    if args.k == "auto":
        if args.floor is not None and not 1 <= args.floor <= 1e9:
            raise LabError(f"lab scale: --floor is a time scale from 1 to 1e9, not {args.floor:g}")
        resp = labs.control(args.name, {"op": "scale", "k": "auto", "floor": args.floor})
        floor = "" if args.floor is None else f", never under {args.floor:g}"
        print(f"{args.name}: time scale governed again, from k={resp['time_scale']:g}{floor}")
        return 0
    if args.floor is not None:
        raise LabError("lab scale: --floor goes with auto (a number pins k; there is no governor)")
    try:
        k = float(args.k)
    except ValueError:
        k = float("nan")
    if not 1 <= k <= 1e9:
        raise LabError(
            f"lab scale: K is the new time scale, a number from 1 to 1e9 or auto, not {args.k!r}"
        )
    before = float(rec["time_scale"])
    labs.rescale(rec, k)
    print(
        f"{args.name}: time scale {before:g} -> {k:g}, pinned (the fabric, its host shapers and"
        " every NIC engine follow; nominal results are unchanged, real time is k times nominal;"
        f" `ethplus lab scale {args.name} auto` hands k back to the governor)"
    )
    return 0


def cmd_lab_stats(args) -> int:
    from dataplane.lab import labs
    from dataplane.report import stats

    if args.count < 0 or (args.watch is not None and args.watch <= 0):
        raise LabError("lab stats: --watch takes seconds > 0 and --count a number >= 0")
    st = labs.control(args.name, {"op": "stats"})["stats"]
    if args.watch is None:
        if args.json:
            print(json.dumps(st, indent=1))
            return 0
        print(stats.render(st, show_all=args.all))
        return 0
    # Every interval: what each busy port did in it (JSON: one object a line).
    t0 = prev_t = time.monotonic()
    n = 0
    while not args.count or n < args.count:
        time.sleep(max(0.0, prev_t + args.watch - time.monotonic()))
        cur, now = labs.control(args.name, {"op": "stats"})["stats"], time.monotonic()
        r = stats.rates(st, cur, now - prev_t)
        if args.json:
            print(json.dumps({"t_s": round(now - t0, 3), "switches": r}), flush=True)
        else:
            print(stats.render_rates(r, now - t0), flush=True)
        st, prev_t, n = cur, now, n + 1
    return 0


def cmd_wireshark(args) -> int:
    from pathlib import Path

    from dataplane.report import wireshark

    if args.plugin_dir and not args.install:
        raise UsageError("wireshark: --plugin-dir goes with --install")
    if not args.install:
        print(wireshark.usage())
        return 0
    try:
        dest = wireshark.install(Path(args.plugin_dir) if args.plugin_dir else None)
    except OSError as exc:
        raise UsageError(f"wireshark --install: cannot write the dissector: {exc}") from None
    print(f"installed {dest}; Wireshark loads it at its next start")
    return 0


def cmd_capture(args) -> int:
    from dataplane.lab import capture, labs

    if args.count < 0 or args.seconds < 0:
        raise LabError("capture: -c/--count and --seconds take a number >= 0")
    labs.require_root("ethplus capture")
    # "Ctrl-C stops" whatever its parent left: SIGINT ignored or blocked is
    # inherited across exec.  (A capture started from the test suite did not
    # stop on SIGINT, twice in full runs; whether this was why is not known.)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    cap = capture.LinkCapture(args.lab, args.link)
    (a, _, _), (b, _, _) = cap.ends
    print(f"capturing {args.link} ({a} <-> {b}); Ctrl-C stops", file=sys.stderr, flush=True)
    writer = capture.PcapWriter(args.write) if args.write else None
    t0: list[int] = []

    def show(fr: capture.Frame) -> None:
        if writer:
            writer.write(fr)
            return
        t0 or t0.append(fr.t_ns)
        print(
            f"{(fr.t_ns - t0[0]) / 1e9:10.6f}  {fr.src} > {fr.dst}  {len(fr.data):5d} B  "
            f"{capture.describe(fr.data, cap.switches)}",
            flush=True,
        )

    try:
        seen = cap.run(show, count=args.count, seconds=args.seconds)
    except KeyboardInterrupt:
        seen = None
    finally:
        if writer:
            writer.close()
        drops = cap.drops()
        cap.close()
    if cap.gone:
        print(f"ethplus: error: lab {args.lab} went down; the capture stopped", file=sys.stderr)
    if seen is not None:
        parts = ", ".join(f"{d}: {n}" for d, n in seen.items())
        where = f" into {args.write}" if args.write else ""
        print(
            f"{sum(seen.values())} frames{where} ({parts})"
            + (f"; the capture's ring lost {drops}" if drops else ""),
            file=sys.stderr,
        )
    return 1 if cap.gone else 0


def cmd_exec(args) -> int:
    from dataplane.lab import cgroup, core, labs

    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        raise LabError("nothing to run: ethplus exec LAB NODE -- CMD [ARGS...]")
    labs.require_root("ethplus exec")
    rec = labs.get(args.lab)
    ns = labs.node_ns(rec, args.node)
    cgroup.join(rec)
    core.netns_join(ns)
    try:
        os.execvp(cmd[0], cmd)
    except FileNotFoundError:
        print(f"ethplus: error: command not found: {cmd[0]}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return


def cmd_run(args) -> int:
    from dataplane.lab import labs
    from dataplane.report import fidelity
    from dataplane.report.fidelity import K_CHECK_FACTOR, K_MOVED_MAX
    from dataplane.run import bench, launcher

    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    launcher.command(cmd)  # nothing to run: said before a lab is touched
    launcher.check_options(args.transport, args.backend, args.algo, args.master_port)
    labs.require_root("ethplus run")
    with labs.session(args.lab, args.time_scale, announce=_announce) as rec:
        nodes = bench.check_nodes(args.nodes, rec) or [
            n["name"] for n in sorted(rec["topology"]["nodes"], key=lambda n: n["index"])
            if n["role"] == "host"
        ]  # fmt: skip
        run = launcher.Launch(rec, nodes, cmd, transport=args.transport, backend=args.backend,
                              master_port=args.master_port, timeout_s=args.timeout,
                              algo=args.algo,
                              say=lambda m: print(m, flush=True))  # fmt: skip
        t0, k_start = time.monotonic(), _governed_k(args, rec)
        result = run.run()
        rows = launcher.summary(result)
        result["k_checks"] = _check_calls_k(args, rec, rows, result, nodes, t0, k_start)
        label = "gloo (kernel TCP)" if args.backend == "gloo" else f"ethplus over {args.transport}"
        if args.backend == "ethplus":
            label += (", all-reduce in the switches" if result["algo"] == "in-network"
                      else f", all-reduce {result['algo']}")  # fmt: skip
        if rows:
            print(f"\ncommunication, {label}, {len(nodes)} ranks (nominal; each call from"
                  " the last rank in to the last rank out):")  # fmt: skip
            print(table(
                [[r["collective"], _size_range(r["min_bytes"], r["size_bytes"]),
                  str(r["calls"]), size_text(r["bytes"]), f"{r['time_s'] * 1e3:.3f}",
                  f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}", _call_check_text(r)]
                 for r in rows],
                ["COLLECTIVE", "SIZE", "CALLS", "BYTES", "TIME_MS", "ALGBW_GBps", "BUSBW_GBps",
                 "AT_4X_K"],
            ))  # fmt: skip
            if result["k_checks"]:
                print(f"AT_4X_K: bench's same collective and size at {K_CHECK_FACTOR:g}x the"
                      " lowest k the program ran at, against at that k (+x%: slower at that k; past"
                      f" {K_MOVED_MAX:.0%}, 'moved': calls of that size carried the host's"
                      " latency by about as much; '(behind)': a run of the check fell behind;"
                      " '-': not checked)")  # fmt: skip
            total = sum(r["time_s"] for r in rows if r["collective"] not in ("send", "recv"))
            print(f"total collective time (nominal): {total * 1e3:.3f} ms")
        else:
            print("\nno collective was timed (the program did not use the ethplus backend:"
                  f" init_process_group(os.environ['{launcher.ENV_BACKEND}']))")  # fmt: skip
        result["summary"] = rows
        result["fidelity"] = fidelity.report(result, rec)
    print(fidelity.render(result["fidelity"]))
    if args.json:
        bench.write_json(result, args.json)
    return 0


def _governed_k(args, rec: dict) -> float | None:
    """The k of a lab whose governor is on, for a run whose calls are to be
    checked (not gloo's, not with --no-k-check); else None."""
    from dataplane.lab.governor import governed
    from dataplane.run import trials

    if args.no_k_check or args.backend != "ethplus" or not governed(rec):
        return None
    g = trials.fabric_governor(rec)
    return g["k"] if g["on"] else None


def _check_calls_k(args, rec: dict, rows: list[dict], result: dict, nodes, t0: float,
                   k_start: float | None) -> list[dict]:  # fmt: skip
    """A governed run's calls checked at 4x the lowest k the program ran at
    (trials.check_calls_k), within half the program's real time (10 s at
    least); [] when _governed_k said None."""
    from dataplane.run import trials

    if k_start is None:
        return []
    k_lo, k_hi = trials.k_range_since(rec, t0, k_start)
    result["k_range"] = [k_lo, k_hi]
    budget_s = max(trials.K_CHECK_MIN_S, trials.K_CHECK_SHARE * result["wall_s"])
    return trials.check_calls_k(rec, rows, args.transport, result.get("algo", "auto"), nodes,
                                budget_s, k_lo, log=lambda m: print(m, flush=True))  # fmt: skip


def _call_check_text(row: dict) -> str:
    c = row.get("k_check")
    if not c:
        return "-"
    behind = " (behind)" if any(c["fell_behind"]) else ""
    return f"{c['ratio'] - 1:+.1%}" + (" moved" if c["moved"] else "") + behind


def _size_range(lo: int, hi: int) -> str:
    if not hi:
        return "-"
    return size_text(hi) if lo == hi else f"{size_text(lo)}-{size_text(hi)}"


def cmd_clean(args) -> int:
    from dataplane.lab import labs

    removed = labs.clean(args.names or None)
    print(
        f"removed {removed['namespaces']} namespaces of {removed['labs']} dead lab(s)"
        + (f" ({removed['tcp_sockets']} TCP sockets destroyed)" if removed["tcp_sockets"] else "")
        + "; objects ethplus did not make were left alone"
    )
    if removed["live"]:
        print(
            f"left {len(removed['live'])} live lab(s) alone: {', '.join(removed['live'])} "
            "(`ethplus lab down NAME` removes one)"
        )
    for why in removed["refused"]:
        print(f"ethplus: warning: {why}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- bench


def _bench_spec(args, transport: str, cc: str | None = None):
    from dataplane.run import bench

    return bench.Spec(
        collective=args.collective,
        transport=transport,
        sizes=bench.parse_sizes(args.sizes, args.factor),
        dtype=args.dtype,
        op=args.op,
        algo=args.algo,
        iters=args.iters,
        warmup=args.warmup,
        root=args.root,
        uneven=args.uneven,
        tcp_streams=args.tcp_streams,
        qps=args.qps,
        adaptive=args.adaptive,
        cc=cc,
        ranks_per_host=args.ranks_per_host,
        shared_engine=not args.engine_per_rank,
        check=not args.no_check and args.check != "none",
        check_all=args.check == "all" and not args.no_check,
        seed=args.seed,
    ).validate()


def _announce(rec: dict) -> None:
    print(
        f"# lab {rec['name']} is up (time scale {rec['time_scale']:g}); it is removed afterwards",
        file=sys.stderr,
    )


def _run_one(
    spec, rec: dict, nodes=None, echo_rows: bool = True, govern: bool = True,
    k_check: bool = True,
) -> dict:  # fmt: skip
    from cli.progress import Reporter
    from dataplane.lab import governor
    from dataplane.run import bench, trials

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with Reporter(spec.sizes, f"{spec.collective} over {bench.run_name(spec)}", echo_rows) as rep:
        if not govern:
            hold = trials.held(rec) if governor.governed(rec) else contextlib.nullcontext()
            with hold:
                return bench.run(spec, rec, on_row=rep.on_row, on_progress=rep.on_progress,
                                 nodes=nodes)  # fmt: skip
        return trials.run(spec, rec, on_row=rep.on_row, on_progress=rep.on_progress,
                          nodes=nodes, log=log, k_check=k_check)  # fmt: skip


def _governs(args, rec: dict) -> bool:
    from dataplane.lab import governor
    from dataplane.run import trials

    return governor.governed(rec) and not args.no_govern and trials.fabric_governor(rec)["on"]


def _governor_line(result: dict) -> str | None:
    from dataplane.report.fidelity import K_CHECK_FACTOR, K_MOVED_MAX
    from dataplane.run.trials import k_text

    g = result.get("governor")
    if not g:
        return None
    tried = ", ".join(
        f"k={k_text(t['k_range'])} {'behind' if t['fell_behind'] else 'ok'}" for t in g["trials"]
    )
    again = "".join(
        f"; {r['size_bytes']} B fell behind at k={k_text(r['k_range'])} and ran again"
        for r in g.get("reruns", [])
    )
    checks = g.get("k_checks", [])
    moved = "".join(
        f"; {c['size_bytes']} B moved {c['ratio'] - 1:+.1%} at k={c['k']:g}, its row is that k's"
        for c in checks
        if c["moved"]
    )
    held = len({c["size_bytes"] for c in checks if not c["moved"]})
    held_text = (
        f"; {held} size(s) held within {K_MOVED_MAX:.0%} at {K_CHECK_FACTOR:g}x their k"
        if held
        else ""
    )
    return (
        f"# governed time scale: k={k_text([g['k'], g['k_max']])} over the timed runs"
        f" (floor {g['floor_k']:g}; the largest size tried first at {tried}{again}{moved}"
        f"{held_text})"
    )


def cmd_bench(args) -> int:
    from dataplane.lab import labs
    from dataplane.report import fidelity
    from dataplane.run import bench

    spec = _bench_spec(args, args.transport, args.cc)
    labs.require_root("ethplus bench")
    with labs.session(args.lab, args.time_scale, announce=_announce) as rec:
        nodes = bench.check_nodes(args.nodes, rec)
        print(bench.header(bench.meta(spec, rec, nodes), _governs(args, rec)), flush=True)
        result = _run_one(spec, rec, nodes, govern=not args.no_govern, k_check=not args.no_k_check)
    print(bench.footer(result))
    if _governor_line(result):
        print(_governor_line(result))
    print(fidelity.render(result["fidelity"]))
    if args.json:
        bench.write_json(result, args.json)
    if args.csv:
        bench.write_csv(result, args.csv)
    return 1 if any(r["wrong"] for r in result["rows"]) else 0


def _compare(args, collectives: list[str], transports: list[str], in_network: bool = False) -> int:
    """in_network: all-reduce also as the switches reduce it (ethplus), if
    the lab can."""
    from dataplane.lab import labs
    from dataplane.report import fidelity, reports
    from dataplane.run import bench, compare

    def make(collective: str, transport: str, cc: str | None):
        return _bench_spec(argparse.Namespace(**{**vars(args), "collective": collective}),
                           transport, cc)  # fmt: skip

    def run_one(spec, rec: dict, nodes) -> dict:
        print(bench.header(bench.meta(spec, rec, nodes), _governs(args, rec)), flush=True)
        res = _run_one(spec, rec, nodes, govern=not args.no_govern, k_check=not args.no_k_check)
        if _governor_line(res):
            print(_governor_line(res), file=sys.stderr)
        print(bench.footer(res))
        if not res["fidelity"]["clean"]:
            print(fidelity.render(res["fidelity"]))
        print(flush=True)
        return res

    runs = compare.specs(collectives, transports, make, _split(args.cc or ""), in_network,
                         args.algo)  # fmt: skip
    labs.require_root(f"ethplus {args.command}")
    results, paths = compare.run(
        runs, args.lab, args.time_scale, args.out, run_one=run_one,
        nodes=getattr(args, "nodes", None), skip_in_network=args.command == "demo",
        announce=_announce, say=lambda m: print(m, flush=True),
    )  # fmt: skip
    _print_comparison(results)
    print(f"\nreport: {paths['report']}")
    print(f"data:   {paths['results']}")
    print("plots:  " + "  ".join(paths[p.removesuffix(".png")] for p in reports.PLOTS))
    return 1 if compare.wrong(results) else 0


def _print_comparison(results: list[dict]) -> None:
    from dataplane.report import reports

    for coll, runs in reports.by_collective(results).items():
        names = [reports.run_name(r) for r in runs]
        rows = []
        for c in reports.comparison(runs):
            cells = [c["transports"].get(t) for t in names]
            rows.append(
                [size_text(c["size_bytes"])]
                + [
                    "-"
                    if x is None
                    else f"{x['busbw_GBps']:.2f}" + ("*" if x["fell_behind"] else "")
                    for x in cells
                ]
                + ["-" if x is None else f"{x['ratio_to_best']:.2f}" for x in cells]
            )
        print(f"\n{coll}: busbw (GB/s, nominal; * = the emulation fell behind) and ratio to best")
        print(table(rows, ["SIZE", *(t.upper() for t in names), *(f"{t}/BEST" for t in names)]))


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def cmd_compare(args) -> int:
    return _compare(args, _split(args.collective), _split(args.transports), args.in_network)


def cmd_demo(args) -> int:
    from dataplane.model import catalog

    print(
        f"ethplus demo: builds {args.lab}, runs all-reduce and all-to-all over "
        f"{', '.join(catalog.available())} (and all-reduce in the network: the switches"
        f" reduce) at {args.sizes}, writes a report to {args.out}",
        flush=True,
    )
    return _compare(args, ["all-reduce", "all-to-all"], catalog.available(), in_network=True)


def cmd_scenario_list(args) -> int:
    from dataplane.model import scenario_file

    rows = []
    scenarios = scenario_file.listing()
    for sc in scenarios:
        jobs = ", ".join(f"{j.name}: {j.collective}" for j in sc.jobs[:3])
        more = f" (+{len(sc.jobs) - 3})" if len(sc.jobs) > 3 else ""
        rows.append([sc.name, sc.lab, ",".join(sc.transports), len(sc.faults), jobs + more])
    print(table(rows, ["NAME", "LAB", "TRANSPORTS", "FAULTS", "JOBS"]))
    for sc in scenarios:
        print(f"\n{sc.name}: {sc.description}")
    return 0


def _check_factor(text: str) -> float:
    try:
        f = float(text)
    except ValueError:
        f = 0.0
    if not 1.0 < f < float("inf"):  # (NaN too)
        raise argparse.ArgumentTypeError(f"expected a number above 1, got {text!r}")
    return f


def cmd_scenario_run(args) -> int:
    from dataplane.lab import labs
    from dataplane.report import reports
    from dataplane.run import scenario

    sc = scenario.load(args.scenario, short=args.short)
    if args.transports:
        sc.transports = _split(args.transports)
        bad = [t for t in sc.transports if not scenario.valid_run_name(t)]
        if bad:
            raise BenchError(
                f"--transports: unknown transport {bad[0]!r}"
                f" (expected one of {scenario.run_names()})"
            )
    if args.iters is not None:
        if args.iters < 1:
            raise BenchError(f"--iters: expected a positive number of iterations, got {args.iters}")
        sc.set_iters(args.iters)
    if args.check_factor is not None and not args.check_k:
        raise BenchError("--check-factor: only with --check-k")
    if args.repeat < 1:
        raise BenchError(f"--repeat: expected a positive number of runs, got {args.repeat}")
    labs.require_root("ethplus scenario run")
    out_dir = args.out or f"results/{sc.name}"
    with labs.session(args.lab or sc.lab, announce=_announce) as rec:
        log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        res = scenario.run(sc, rec, log=log, repeat=args.repeat)
        if args.check_k:
            factor = args.check_factor or scenario.K_CHECK_FACTOR
            scenario.check_k(sc, rec, res, factor=factor, log=log)
        paths = reports.write_scenario(out_dir, res, rec)
    s = res["summary"]
    bound = reports.plane_bound(res, rec)
    print(f"scenario {sc.name}{' (short form)' if sc.short else ''}: {s['unit']}"
          + (f" (bound P/(P-1) {bound:.3f})" if bound else ""))  # fmt: skip
    for t, v in s["figures"].items():
        adv = s["ethplus_advantage"].get(t)
        wrong = scenario.wrong(res["transports"][t])
        spread = s["spread"].get(t)
        stalled = reports.stalled_text(res["transports"][t])
        print(
            f"  {t:12s} {reports.figure_text(res['transports'][t], v)}"
            + (f" (iterations {spread[0]:.3f}-{spread[1]:.3f})" if spread else "")
            + (f"   stalled {stalled} us nominal" if stalled != "-" else "")
            + (f"   {s['reference']}'s advantage {adv:.2f}x" if adv else "")
            + f"   #wrong {wrong}"
            + ("   (fell behind: rerun at a larger time scale)" if t in s["fell_behind"] else "")
            + (f"   (median of {args.repeat} runs)" if args.repeat > 1 else "")
        )
    for line in reports.scenario_k_check_lines(res):
        print(f"  {line}")
    print(f"report: {paths['report']}")
    runs = list(res["transports"].values())
    checked = res.get("k_check", {}).get("transports", {}).values()
    failed = (
        any(j["status"] != "ok" for r in runs for j in r["jobs"].values())
        or any(scenario.wrong(r) for r in runs)
        or any(c["wrong"] for c in checked)
    )
    return 1 if failed else 0


def _add_bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "collective",
        metavar="COLLECTIVE",
        help="all-reduce, reduce-scatter, all-gather, all-to-all or broadcast",
    )
    p.add_argument(
        "--lab",
        required=True,
        metavar="FILE|NAME",
        help="a running lab, or a lab file brought up (and down) for the run",
    )
    p.add_argument(
        "--sizes",
        default="8K:64M",
        metavar="MIN:MAX",
        help="bytes per rank, e.g. 8K:256M, 64M or 1K,4K,1M (default 8K:64M)",
    )
    p.add_argument("--factor", type=float, default=2.0, help="growth factor between sizes (2)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per size (5)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up iterations per size (2)")
    p.add_argument("--dtype", default="float32", help="float32, float16, bfloat16 or int32")
    p.add_argument("--op", default="sum", help="sum, max or min")
    p.add_argument(
        "--algo",
        default="ring",
        help="all-reduce: ring (default), halving-doubling, hierarchical (rings inside"
        " groups of ranks and across them), tree (NCCL's double binary tree: half the"
        " buffer up and down each of two trees), in-network (the switches aggregate;"
        " labs with [switch] inc = true, transport ethplus) or auto (chosen per size"
        " and rank count, as libraries do at scale; stated above each row);"
        " broadcast: ring (the pipelined chain, default), tree (half the buffer down"
        " each of two binary trees) or auto (the chain up to 7 ranks, the trees beyond)",
    )
    p.add_argument("--root", type=int, default=0, help="broadcast root rank (0)")
    p.add_argument(
        "--nodes",
        metavar="h0,h3,...",
        help="run on these accelerators only, ranks in this order (default: all of the lab's)",
    )
    p.add_argument("--uneven", action="store_true", help="all-to-all with MoE-like uneven sizes")
    p.add_argument(
        "--tcp-streams",
        type=int,
        metavar="N",
        help="tcp: connections per pair of ranks (default: one per plane)",
    )
    p.add_argument(
        "--qps", type=int, metavar="N", help="roce: queue pairs per pair of ranks (one per plane)"
    )
    p.add_argument("--adaptive", action="store_true", help="ethplus: adaptive spraying")
    p.add_argument(
        "--ranks-per-host",
        type=int,
        metavar="N",
        help="ranks per worker process, each in a thread of its own (default: the ranks spread"
        " over as many processes as CPUs; 1: a process per rank)",
    )
    p.add_argument(
        "--engine-per-rank",
        action="store_true",
        help="ethplus, roce: in a process of several ranks, each rank's NIC engine in a thread"
        " of its own (default: one thread runs them all)",
    )
    p.add_argument(
        "--cc",
        metavar="NAME",
        help="ethplus: congestion control, nscc (ECN and delay), hpcc (INT from each switch)"
        " or rccc (receiver credits over nscc);"
        " compare takes a comma list and runs ethplus once per name (default: the lab file's)",
    )
    p.add_argument(
        "--check",
        choices=("first", "all", "none"),
        default="first",
        help="check results against numpy: the first run of each size (first, default),"
        " every warm-up and timed run too (all: #wrong counts them all), or none",
    )
    p.add_argument("--no-check", action="store_true", help="skip the check (= --check none)")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the test data and of the flows' paths: kernel TCP's source"
                   " ports, the NICs' entropy values (1)")  # fmt: skip
    p.add_argument("--time-scale", type=float, help="time scale for a lab brought up from a file"
                   " (pins it: no governor)")  # fmt: skip
    p.add_argument("--no-govern", action="store_true",
                   help="on a lab whose time scale is auto, run at its k as it is, without the"
                   " governor (default: the smallest k at which every part keeps up)")  # fmt: skip
    p.add_argument("--no-k-check", action="store_true",
                   help="governed: do not run the sizes again at 4x their k (default: the"
                   " smallest ones, within half the run's real time or 10 s; a size whose"
                   " nominal time moved by more than 5%% is then reported at the larger"
                   " k)")  # fmt: skip


# ---------------------------------------------------------------- parser


def _available() -> list[str]:
    from dataplane.model import catalog

    return catalog.available()


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ethplus")
    except metadata.PackageNotFoundError:  # a checkout run without an install
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ethplus",
        description="ETH+ lab: AI-cluster fabrics in network namespaces on one machine",
    )
    p.add_argument("--version", action="version", version=f"ethplus {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    lab = sub.add_parser("lab", help="build, list, show and remove labs")
    lsub = lab.add_subparsers(dest="lab_command", required=True, metavar="LAB_COMMAND")

    up = lsub.add_parser(
        "up",
        help="build a lab from a lab file, or a name ($ETHPLUS_LABS, ./netns-labs/, then"
        " the labs ethplus ships)",
    )
    up.add_argument("file", metavar="FILE", help="lab file or name, e.g. erack-8x4")
    up.add_argument("--name", help="lab name (default: the file's lab.name or its stem)")
    up.add_argument("--time-scale", type=float, help="override the file's time_scale (>= 1)")
    up.add_argument(
        "--pin", action="store_true",
        help="keep the time scale the file gives (auto: the k chosen now), no governor",
    )  # fmt: skip
    up.add_argument("--json", action="store_true", help="print the realised lab as JSON")
    up.set_defaults(func=cmd_lab_up)

    down = lsub.add_parser("down", help="remove a lab and everything it made")
    down.add_argument("name", nargs="?", metavar="NAME")
    down.add_argument("--all", action="store_true", help="remove every running lab")
    down.set_defaults(func=cmd_lab_down)

    ls = lsub.add_parser("ls", help="list running labs")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_lab_ls)

    show = lsub.add_parser("show", help="nodes, links, parameters and time scale of a lab")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--json", action="store_true", help="machine-readable, for scripts")
    show.add_argument(
        "--settings", action="store_true",
        help="every [lab], [switch], [nic] and [tcp] key: its value here, default, meaning",
    )  # fmt: skip
    show.set_defaults(func=cmd_lab_show)
    keys = lsub.add_parser(
        "keys", help="every lab-wide key a lab file takes: default and meaning (declared once)"
    )
    keys.add_argument("--family", choices=("erack", "upn", "clos", "hpn"))
    keys.set_defaults(func=cmd_lab_keys)

    sc_ = lsub.add_parser(
        "scale", help="change a running lab's time scale k (real = nominal x k), at once"
    )
    sc_.add_argument("name", metavar="NAME")
    sc_.add_argument(
        "k", metavar="K", help="the new time scale (>= 1; pins it), or auto (governed again)"
    )
    sc_.add_argument(
        "--floor",
        type=float,
        metavar="K",
        help="with auto: the lowest k the governor may use from now on (default: the auto choice)",
    )
    sc_.set_defaults(func=cmd_lab_scale)

    stats = lsub.add_parser("stats", help="switch counters: traffic, drops by reason, queues")
    stats.add_argument("name", metavar="NAME")
    stats.add_argument("--json", action="store_true", help="every counter of every port")
    stats.add_argument("--all", action="store_true", help="also ports that saw no traffic")
    stats.add_argument(
        "--watch", type=float, nargs="?", const=1.0, metavar="SECONDS",
        help="every SECONDS (1): each busy port's rates, drops, marks and queue in that interval",
    )  # fmt: skip
    stats.add_argument("--count", type=int, default=0, help="with --watch: stop after N intervals")
    stats.set_defaults(func=cmd_lab_stats)

    link = sub.add_parser("link", help="change a link at run time (faults)")
    link_sub = link.add_subparsers(dest="link_command", required=True, metavar="LINK_COMMAND")
    ls_ = link_sub.add_parser(
        "set",
        help="ethplus link set LAB LINK down|up|loss P|corrupt P|rate R|delay D|jitter J|"
        "llr on|off",
    )
    ls_.add_argument("lab", metavar="LAB")
    ls_.add_argument("link", metavar="LINK", help="as named by `ethplus lab show`, e.g. h0-plane1")
    ls_.add_argument("change", nargs="+", metavar="CHANGE")
    ls_.set_defaults(func=cmd_link_set)

    node = sub.add_parser("node", help="take a whole switch (plane) down or up")
    node_sub = node.add_subparsers(dest="node_command", required=True, metavar="NODE_COMMAND")
    ns_ = node_sub.add_parser("set", help="ethplus node set LAB SWITCH down|up")
    ns_.add_argument("lab", metavar="LAB")
    ns_.add_argument("node", metavar="SWITCH")
    ns_.add_argument("state", choices=["down", "up"])
    ns_.set_defaults(func=cmd_node_set)

    cp = sub.add_parser("capture", help="frames crossing a link, both ways: lines or a pcap file")
    cp.add_argument("lab", metavar="NAME")
    cp.add_argument("link", metavar="LINK", help="as named by `ethplus lab show`, e.g. h0-plane1")
    cp.add_argument("-w", "--write", metavar="FILE", help="write a pcap file (ns timestamps)")
    cp.add_argument("-c", "--count", type=int, default=0, help="stop after N frames")
    cp.add_argument("--seconds", type=float, default=0.0, help="stop after S seconds")
    cp.set_defaults(func=cmd_capture)

    ws = sub.add_parser(
        "wireshark", help="where the ETH+ Wireshark dissector is, and how to load it"
    )
    ws.add_argument(
        "--install", action="store_true", help="copy it into your Wireshark plugin folder"
    )
    ws.add_argument(
        "--plugin-dir", metavar="DIR", help="--install into DIR instead (made if missing)"
    )
    ws.set_defaults(func=cmd_wireshark)

    ex = sub.add_parser("exec", help="run a command inside a node's namespace")
    ex.add_argument("lab", metavar="NAME")
    ex.add_argument("node", metavar="NODE", help="e.g. h0, plane1, leaf2, spine0")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")
    ex.set_defaults(func=cmd_exec)

    rn = sub.add_parser(
        "run", help="run a program's ranks (PyTorch, torchrun style) on a lab's accelerators"
    )
    rn.add_argument("lab", metavar="LAB", help="a running lab, or a lab file (up for the run)")
    rn.add_argument("--nodes", help="accelerators in rank order, e.g. h0,h1 (default: all)")
    rn.add_argument(
        "--backend",
        default="ethplus",
        choices=["ethplus", "gloo"],
        help="ethplus (this project's transports) or gloo (stock, kernel TCP)",
    )
    rn.add_argument(
        "--transport",
        default="ethplus",
        choices=["ethplus", "roce", "tcp"],
        help="the ethplus backend's transport (default ethplus)",
    )
    rn.add_argument("--algo", default="auto",
                    help="all-reduce: ring, halving-doubling, hierarchical, tree, in-network or"
                    " auto"
                    " (default: chosen per size as bench's; the switches where the lab reduces"
                    " and the transport is ethplus)")  # fmt: skip
    rn.add_argument("--master-port", type=int, default=29500, help="MASTER_PORT (29500)")
    rn.add_argument("--timeout", type=float, metavar="S",
                    help="stop the run after S seconds (each rank's stacks first)")  # fmt: skip
    rn.add_argument("--time-scale", type=float, metavar="K", help="k, for a lab file")
    rn.add_argument("--no-k-check", action="store_true",
                    help="governed: after the program, do not run bench's same collectives"
                    " and sizes at the lowest k it ran at and at 4x it (default: the smallest"
                    " ones, within half the program's real time or 10 s; the table's AT_4X_K"
                    " says how far each moved)")  # fmt: skip
    rn.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    rn.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")
    rn.set_defaults(func=cmd_run)

    b = sub.add_parser("bench", help="time a collective at a range of sizes (nccl-tests style)")
    _add_bench_options(b)
    b.add_argument("--transport", default="ethplus", help="ethplus, roce or tcp (default ethplus)")
    b.add_argument("--json", metavar="FILE", help="also write the result as JSON (see docs)")
    b.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    b.set_defaults(func=cmd_bench)

    c = sub.add_parser(
        "compare", help="run collectives over several transports on one lab; report and plots"
    )
    _add_bench_options(c)
    c.add_argument(
        "--transports", default=",".join(_available()), help="comma list (default: all available)"
    )
    c.add_argument(
        "--in-network",
        action="store_true",
        help="all-reduce also in the network (ethplus; the switches reduce), beside the others",
    )
    c.add_argument("--out", default="results/compare", metavar="DIR", help="report directory")
    c.set_defaults(func=cmd_compare)

    d = sub.add_parser("demo", help="compare all-reduce and all-to-all on erack-8x4 (< 3 min)")
    d.add_argument("--lab", default="erack-8x4", help=argparse.SUPPRESS)
    d.add_argument("--out", default="results/demo", metavar="DIR", help="report directory")
    d.add_argument("--sizes", default="64K,1M,4M", help=argparse.SUPPRESS)  # tests: smaller
    d.set_defaults(
        func=cmd_demo,
        collective="all-reduce",
        factor=2.0,
        iters=3,
        warmup=1,
        dtype="float32",
        op="sum",
        algo="ring",
        root=0,
        uneven=False,
        tcp_streams=None,
        qps=None,
        adaptive=False,
        cc=None,
        ranks_per_host=None,
        engine_per_rank=False,
        no_check=False,
        no_govern=False,
        no_k_check=False,
        check="first",
        seed=1,
        time_scale=None,
    )

    sc = sub.add_parser("scenario", help="reproducible experiments: a lab, jobs, timed faults")
    sc_sub = sc.add_subparsers(dest="scenario_command", required=True, metavar="SCENARIO_COMMAND")
    sl = sc_sub.add_parser(
        "list",
        help="every scenario by name ($ETHPLUS_LABS/scenarios/, ./netns-labs/scenarios/,"
        " then the shipped ones)",
    )
    sl.set_defaults(func=cmd_scenario_list)
    sr = sc_sub.add_parser("run", help="run a scenario over each of its transports")
    sr.add_argument("scenario", metavar="NAME|FILE")
    sr.add_argument("--out", metavar="DIR", help="report directory (results/NAME)")
    sr.add_argument("--short", action="store_true", help="the short form (CI: seconds)")
    sr.add_argument("--transports", help="only these (comma list)")
    sr.add_argument("--lab", help="a running lab or lab file instead of the scenario's")
    sr.add_argument(
        "--iters",
        type=int,
        metavar="N",
        help="timed iterations of every job (default: the scenario file's); more narrow a"
        " noisy transport's figure",
    )
    sr.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run each transport N times (with --check-k, N times at the larger k too);"
        " the figures are the medians, each run's is in the report",
    )
    sr.add_argument(
        "--check-k",
        action="store_true",
        help="then run each transport again with the time scale pinned at 4x the highest k"
        " the run used, and say whether each figure held (within 7%%; kernel TCP 10%%):"
        " costs about 4x the run's real time",
    )
    sr.add_argument(
        "--check-factor",
        type=_check_factor,
        metavar="F",
        help="with --check-k: pin at F x the highest k (default 4; more than 1)",
    )
    sr.set_defaults(func=cmd_scenario_run)

    cl = sub.add_parser(
        "clean",
        help="remove leftovers of ethplus after a crash (only those): labs whose creator "
        "and fabric are dead; live labs stay",
    )
    cl.add_argument("names", nargs="*", metavar="NAME", help="only these labs (default: all)")
    cl.set_defaults(func=cmd_clean)
    return p


def _parse(argv: list[str]) -> argparse.Namespace:
    """The command line; `run` and `exec` take their options anywhere before
    `--`, and everything after it is the command (argparse alone would hand
    options after the first positional to the command)."""
    if argv and argv[0] in ("run", "exec") and "--" in argv:
        head = argv[: argv.index("--")]
        args = build_parser().parse_args(head)
        if args.cmd:  # options after the positionals, which the remainder took: them first
            before = head[1 : len(head) - len(args.cmd)]
            args = build_parser().parse_args([head[0], *args.cmd, *before])
        args.cmd = argv[len(head) + 1 :]
        return args
    return build_parser().parse_args(argv)


def _labs_exist() -> bool:
    """A lab recorded, or a namespace of one left (the user namespace's keeper
    stays while either does)."""
    from dataplane.lab import registry

    if registry.names():
        return True
    try:
        return any(n.startswith("ethp") for n in os.listdir(registry.NETNS_DIR))
    except FileNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    from dataplane.lab import userns

    try:
        return args.func(args)
    except EthplusError as exc:
        print(f"ethplus: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`ethplus lab show L | head`): stop quietly,
        # and keep the interpreter's final flush from failing again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports death by SIGPIPE
    finally:
        userns.leave_if_idle(_labs_exist)


if __name__ == "__main__":
    sys.exit(main())
