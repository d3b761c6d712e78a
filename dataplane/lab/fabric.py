"""The fabric process: every switch of a lab, in C threads, under an asyncio
(uvloop) control plane that answers on a unix socket.

Started by `ethplus lab up` as ``python -m dataplane.lab.fabric NAME``; stopped by
SIGTERM (`lab down`).  Python never touches a packet: it builds the switches,
shapes the hosts' uplinks (tc tbf, since the host's kernel transmits), serves
counters and applies faults.  Requests are one JSON object per line:

    {"op": "stats"}                                  -> counters of every port
    {"op": "link", "link": "h0-plane0", "set": {...}} -> change a link
    {"op": "node", "node": "plane1", "up": false}    -> a whole switch down/up
    {"op": "config", "node": "plane1"}              -> a switch's settings, as in C
    {"op": "ping"}
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace

import uvloop

from dataplane.lab import clock, core, cpu, fabric_client, governor, kernel, registry
from dataplane.lab.fabric_client import socket_path
from dataplane.model import labfile, routing
from dataplane.report import fidelity
from dataplane.scale import Scale


@dataclass
class NominalLink(core.Link):
    """What `lab show` and `link set` speak: nominal units."""

    mtu_bytes: int = 0


_GOVERNOR_FIELDS = ("lost_link_ns", "late_sum_ns", "tx_frames")  # of every switch port

# A switch's small buffers, beside its full-size ones: a received frame of
# up to SMALL_BUFFER_BYTES (acks, handshakes, short messages) takes one, 512
# a port.  Kernel TCP's all-to-all over upn-512 (512 B a peer, and an ack
# each) queued 65,536 frames of 380 B on average, 25 MB, and the switch,
# its full-size buffers all taken, lost 259,323 frames its queues had room
# for.  Only the buffers in use are touched: 256 MiB of address space at most.
SMALL_BUFFER_BYTES = 1024
SMALL_BUFFERS_MAX = 262_144


def switch_pools(n_ports: int, mtu_bytes: int) -> dict[str, int]:
    """A switch's packet buffers (SwitchConfig fields): full-size ones for
    its largest frame, and small ones."""
    buf_bytes = mtu_bytes + 14 + 64
    small = buf_bytes > SMALL_BUFFER_BYTES
    return {
        "pool_pkts": min(65536, max(4096, n_ports * 512)),
        "buf_bytes": buf_bytes,
        "pool_small_pkts": min(SMALL_BUFFERS_MAX, max(8192, n_ports * 512)) if small else 0,
        "small_buf_bytes": SMALL_BUFFER_BYTES if small else 0,
    }


def _worst(before: list[int], after: list[int]) -> int:
    """The largest growth of one slot between two readings of a list."""
    return max((x - (before[i] if i < len(before) else 0) for i, x in enumerate(after)), default=0)


class Fabric:
    def __init__(self, rec: dict):
        self.rec = rec
        self.name = rec["name"]
        self.k = float(rec["time_scale"])
        topo = rec["topology"]
        self.nodes = {n["name"]: n for n in topo["nodes"]}
        self.links = {lk["name"]: lk for lk in topo["links"]}
        self.nominal = {
            name: NominalLink(
                **{
                    f: lk["params"][f]
                    for f in ("rate_bps", "delay_ns", "buffer_bytes", "mtu_bytes")
                },
                llr=lk["params"].get("llr", False),
                jitter_ns=lk["params"].get("jitter_ns", 0),
            )
            for name, lk in self.links.items()
        }
        self.switches: dict[str, core.Switch] = {}
        self.clock = clock.Clock(self.name, create=True, k=self.k)
        # "auto": the governor moves k (never under the k lab up chose);
        # `lab scale` pins it, `lab scale NAME auto` hands it back
        self.governor = governor.Governor(self.k) if governor.governed(rec) else None
        self.pinned = self.governor is None
        self.lock = threading.Lock()  # k and the links change under it
        self._host_ns = [rec["namespaces"][n] for n, x in self.nodes.items() if x["role"] == "host"]
        self._waits = cpu.WaitWatch()  # the ranks' threads (whatever job runs)
        self._pids_at = -1e9
        self.node_up = {n: True for n in self.nodes if self.nodes[n]["role"] == "switch"}
        self.started_ns = time.monotonic_ns()
        # in-network registrations as leases: group -> (owner pid, its start
        # time, [switch, ...] joined, [switch, ...] registered); expired by
        # expire_leases once the owner is gone (a killed job never leaves)
        self.leases: dict[int, tuple[int, int, list[str], list[str]]] = {}
        self.leases_expired = 0

    # -- translation nominal -> real
    def real(self, link: str, node: str, port_index: int) -> core.LinkState:
        lk, nl = self.links[link], self.nominal[link]
        me = self.nodes[node]["ports"][port_index]
        peer_node = self.nodes[me["peer"]]
        peer_port = lk["a_port"] if lk["a"] == me["peer"] else lk["b_port"]
        return core.LinkState(
            **nl.scaled(self.k),
            mac=me["mac"],
            peer_mac=peer_node["ports"][peer_port]["mac"],
            peer_is_host=peer_node["role"] == "host",
        )

    def build(self) -> None:
        sw_cfg = self.rec["switch"]
        mtu = max(lk["params"]["mtu_bytes"] for lk in self.links.values())
        tables = routing.tables(self.rec["topology"])
        ids = routing.switch_ids(self.rec["topology"])
        seed = int(self.rec.get("seed", 1))
        for name, node in ((n, x) for n, x in self.nodes.items() if x["role"] == "switch"):
            i = ids[name]
            n_ports = len(node["ports"])
            cfg = core.SwitchConfig(
                **labfile.c_values(labfile.switch_fields(self.rec["family"]), sw_cfg, self.k),
                agg_id=i,
                int_id=i,
                agg_slots=sw_cfg.get("inc_slots", 1024) if sw_cfg.get("inc") else 0,
                seed=seed * 1_000_003 + i,
                **switch_pools(n_ports, mtu),
            )
            sw = core.Switch(cfg, n_ports)
            ns = self.rec["namespaces"][name]
            for p in node["ports"]:
                idx = sw.add_port(ns, p["ifname"], self.real(p["link"], name, p["index"]))
                assert idx == p["index"]
            t = tables[name]
            for addr, group in t.ipv4.items():
                sw.add_route("ipv4", addr, group)
            for ep, group in t.ep.items():
                sw.add_route("ep", ep, group)
            self.switches[name] = sw
        for sw in self.switches.values():
            sw.start()

    # -- host uplinks: the host's kernel transmits, so tc shapes it
    def shape_hosts(self, links: list[str] | None = None) -> None:
        for name in links if links is not None else list(self.links):
            lk = self.links[name]
            for end, port in ((lk["a"], lk["a_port"]), (lk["b"], lk["b_port"])):
                node = self.nodes[end]
                if node["role"] != "host":
                    continue
                p = node["ports"][port]
                nl = self.nominal[name]
                kernel.shape(
                    self.rec["namespaces"][end],
                    p["ifname"],
                    rate_bps=max(8000, nl.scaled(self.k)["rate_bps"]),
                    mtu_bytes=nl.mtu_bytes,
                )

    def rescale(self, k: float) -> dict:
        """A new time scale for the whole fabric: the clock (the NIC engines
        follow it), every switch port's link and every host uplink's shaper
        from the nominal values at k (faults set on links stay, in nominal
        units).  Frames already queued or on a delay line keep the times
        they were given."""
        if not 1 <= k <= 1e9:  # also refuses NaN
            raise ValueError(f"time scale: expected a number from 1 to 1e9, got {k!r}")
        with self.lock:
            self.k = float(k)
            self.rec["time_scale"] = self.k
            self.clock.set_k(self.k)
            for name in self.links:
                self.apply_link(name)
            self.shape_hosts()
            kernel.tcp_routes(self.rec, self.k)
        return {"time_scale": self.k}

    def scale(self, req: dict) -> dict:
        """The `scale` request: k (pins the time scale there), "hold" (pins
        it where it is), "auto" (the governor moves it again, from there;
        with "floor", never under that k from now on) or
        "raise" (the governor raises it now: a run's verdict saw lateness;
        "from": the highest k that run fell behind at)."""
        k = req.get("k")
        if k == "hold":
            self.pinned = True
            return {"time_scale": self.k, "governed": False}
        if k == "raise":
            g = self.governor
            if g is None or self.pinned:
                raise ValueError(f"lab {self.name}'s time scale is not governed now")
            g.k = self.k
            try:
                behind_at_k = float(req.get("from", 0.0))
            except (TypeError, ValueError):
                raise ValueError(f"from: a time scale, not {req.get('from')!r}") from None
            new = g.raise_for(str(req.get("why", "asked to")), time.monotonic(),
                              self.clock.nominal_s(), behind_at_k)  # fmt: skip
            if new is not None:
                self.rescale(new)
            return {"time_scale": self.k, "governed": True}
        if k == "auto":
            if self.governor is None:
                raise ValueError(f"lab {self.name} has a fixed time scale: it has no governor")
            if req.get("floor") is not None:
                floor = float(req["floor"])
                if not 1 <= floor <= 1e9:
                    raise ValueError(f"floor: a time scale from 1 to 1e9, not {req['floor']!r}")
                self.governor.floor_k = floor
            self.pinned = False
            self.governor.k = self.k
            return {"time_scale": self.k, "governed": True}
        if self.governor is not None:
            self.pinned = True
        res = self.rescale(float(k))
        return {**res, "governed": False}

    def governor_state(self, all_events: bool = False) -> dict | None:
        g = self.governor
        if g is None:
            return None
        events = g.events if all_events else g.events[-20:]
        return {"on": not self.pinned, "floor_k": g.floor_k, "k": self.k, "events": list(events)}

    # -- the governor's eyes: every part that can fall behind
    def _readings(self) -> dict:
        ports = {}
        for name, sw in self.switches.items():
            rows = sw.counter_rows(_GOVERNOR_FIELDS, len(self.nodes[name]["ports"]))
            for i, row in enumerate(rows):
                ports[(name, i)] = tuple(row)
        busy, total = cpu.machine_s()
        now = time.monotonic()
        if now - self._pids_at > governor.WINDOW_S:  # the ranks (whatever job runs)
            self._waits.refresh(kernel.pids_in(self._host_ns))
            self._pids_at = now
        waited = self._waits.read()
        return {"t": now, "k": self.k, "busy": busy, "total": total, "ports": ports,
                "ring_drops": self.ring_drops(), "waited": waited,
                "clock": self.clock.reports(), "engines": self.clock.engines()}  # fmt: skip

    def _observe(self, a: dict, b: dict) -> governor.Observation:
        span_ns = max((b["t"] - a["t"]) * 1e9, 1.0)
        lost = late = tx = 0
        for key, (lo, ls, tf) in b["ports"].items():
            lo0, ls0, tf0 = a["ports"].get(key, (lo, ls, tf))
            lost, late, tx = max(lost, lo - lo0), late + ls - ls0, tx + tf - tf0
        base_rtt_real_ns = Scale(self.k).real_ns(self.rec["topology"]["base_rtt_ns"])
        ca, cb = a["clock"], b["clock"]
        total = b["total"] - a["total"]
        return governor.Observation(
            lost_link_share=lost / span_ns,
            added_delay_share=(late / tx / base_rtt_real_ns) if tx else 0.0,
            # the worst engine and rank, as the verdict judges them
            # (fidelity.engines_window; the mean lateness is over all engines)
            engine_lost_share=_worst(a["engines"]["lost_ns"], b["engines"]["lost_ns"]) / span_ns,
            engine_added_delay_share=fidelity.engine_added_delay(
                _worst(a["engines"]["late_sum_ns"], b["engines"]["late_sum_ns"]) / span_ns,
                cb["late_sum_ns"] - ca["late_sum_ns"],
                cb["late_wakeups"] - ca["late_wakeups"],
            )
            / base_rtt_real_ns,
            # only while frames move: ranks filling and checking buffers
            # (64 of them at once on erack-64x8) wait for a CPU at any k,
            # and raising k for that took it to 64x the floor for nothing
            waited_share=max(
                (cpu.waited_s(a["waited"].get(pid, {}), w) for pid, w in b["waited"].items()),
                default=0.0,
            )
            * 1e9
            / span_ns
            if tx
            else 0.0,
            ring_drops=cb["ring_drops"] - ca["ring_drops"],
            engine_rx_delay_share=fidelity.rx_wait_ns(
                cb["rx_wait_sum_ns"] - ca["rx_wait_sum_ns"],
                cb["rx_wait_frames"] - ca["rx_wait_frames"],
            )
            / base_rtt_real_ns,
            any_behind_share=(cb["any_late_ns"] - ca["any_late_ns"]) / span_ns,
            switch_ring_drops=b["ring_drops"] - a["ring_drops"],
            busy_share=(b["busy"] - a["busy"]) / total if total > 0 else 0.0,
        )

    def govern(self, stop: threading.Event) -> None:
        """The governor's thread (see governor.py): observe over the last
        WINDOW_S at the current k, decide, apply."""
        history = governor.History(self._readings())
        while not stop.wait(governor.INTERVAL_S):
            try:
                window = history.add(self._readings())
            except RuntimeError:
                return  # the switches are closing
            g = self.governor
            if window is None or g is None or self.pinned:
                continue
            try:
                obs = self._observe(*window)
                g.k = self.k
                new = g.step(obs, window[1]["t"], self.clock.nominal_s())
                if new is not None and not self.pinned:
                    self.rescale(new)
            except Exception as exc:  # noqa: BLE001 - logged; the governor goes on
                print(f"fabric: governor: {type(exc).__name__}: {exc}", file=sys.stderr)

    def apply_link(self, name: str) -> None:
        """(Under self.lock, or from rescale.)"""
        lk = self.links[name]
        for end, port in ((lk["a"], lk["a_port"]), (lk["b"], lk["b_port"])):
            if end in self.switches:
                self.switches[end].set_link(port, self.real(name, end, port))

    def close(self) -> None:
        for sw in self.switches.values():
            sw.close()
        self.switches.clear()

    # -- requests
    def stats(self) -> dict:
        # the fabric's CPU when asked (cpu_s) and once answered (cpu_s_done):
        # a job counts what it spent between its two requests, not the
        # requests themselves (on erack-64x8, 0.09 s each: a netlink query
        # per host namespace)
        pid = os.getpid()
        cpu_s, frames_cpu_s = cpu.self_s(), cpu.frame_threads_s(pid)
        out = {}
        for name, sw in self.switches.items():
            node = self.nodes[name]
            ports = {}
            for p in node["ports"]:
                c = sw.counters(p["index"])
                c["link"] = p["link"]
                c["peer"] = p["peer"]
                ports[p["ifname"]] = c
            drops, rx = sw.receive_counters()
            out[name] = {
                "up": self.node_up[name],
                "wakeups": sw.wakeups,
                "buffer": sw.buffer(),
                "ring": drops,
                "rx": rx,
                "ports": ports,
            }
        hosts = {
            name: {"uplink_drops": kernel.uplink_drops(self.rec["namespaces"][name])}
            for name, node in self.nodes.items()
            if node["role"] == "host"
        }
        return {
            "lab": self.name,
            "time_scale": self.k,
            "governor": self.governor_state(),
            "clock": {
                "gen": self.clock.gen,
                "nominal_ns": self.clock.nominal_ns(),
                **self.clock.reports(),
            },  # fmt: skip
            "uptime_s": (time.monotonic_ns() - self.started_ns) / 1e9,
            "cpu_s": cpu_s,
            "cpu_s_done": cpu.self_s(),
            "frames_cpu_s": frames_cpu_s,  # its switches' threads
            "inc_leases": len(self.leases),  # in-network groups held by live jobs
            "inc_leases_expired": self.leases_expired,  # ... undone, their owner gone
            "switches": out,
            "hosts": hosts,  # their uplinks' queues (tc), which the host's kernel fills
            "links": {n: vars(v) for n, v in self.nominal.items()},
        }

    def sample(self) -> dict:
        """What a job samples several times a second (fidelity.SAMPLE_FIELDS
        of every switch port, k, the fabric's CPU): one C call per switch,
        a tenth of stats() on upn-512's 4096 ports."""
        ports = {}
        for name, sw in self.switches.items():
            node_ports = self.nodes[name]["ports"]
            rows = sw.counter_rows(fidelity.SAMPLE_FIELDS, len(node_ports))
            for p, row in zip(node_ports, rows, strict=True):
                ports[f"{name}:{p['peer']}"] = row
        return {"time_scale": self.k, "cpu_s": cpu.self_s(), "ports": ports,
                "ring_drops": self.ring_drops()}  # fmt: skip

    def ring_drops(self) -> int:
        """Frames the switches lost before reading them (their RX rings
        full, or no buffer to take them into) so far: the host's losses,
        which no emulated link or queue decided."""
        return sum(
            v
            for sw in self.switches.values()
            for k, v in sw.receive_counters()[0].items()
            if k in fidelity.HOST_DROPS
        )

    def set_link(self, name: str, changes: dict) -> dict:
        if name not in self.links:
            raise KeyError(f"no link {name!r} in lab {self.name} (see `ethplus lab show`)")
        allowed = {
            "up", "loss", "corrupt", "rate_bps", "delay_ns", "jitter_ns", "buffer_bytes", "llr",
        }  # fmt: skip
        bad = set(changes) - allowed
        if bad:
            raise KeyError(f"cannot set {', '.join(sorted(bad))}")
        with self.lock:
            self.nominal[name] = replace(self.nominal[name], **changes)
            self.apply_link(name)
            if "rate_bps" in changes:
                self.shape_hosts([name])
        return vars(self.nominal[name])

    def inc(self, req: dict) -> None:
        """A job's in-network aggregation, from the control plane (never from
        a frame): register [switch, group, [[endpoint, address], ...] (its
        members, in index order), slot quota]; join (inner nodes of trees)
        [switch, group, parent id, index at the parent, the parent's
        members]; leave [switch, group]; unregister [switch, group].  What
        is registered or joined is leased to owner [pid, start time] (the
        process that will leave), and undone when that process is gone."""
        owner = req.get("owner")
        if (req.get("register") or req.get("join")) and not (
            isinstance(owner, list) and len(owner) == 2
            and registry.process_alive(int(owner[0]), int(owner[1]))
        ):  # fmt: skip
            raise ValueError(f"in-network registration: owner {owner!r} is not a live process")
        for sw, group, members, quota in req.get("register", []):
            self.switches[sw].agg_register(group, [tuple(m) for m in members], quota)
            self._lease(group, owner)[3].append(sw)
        for sw, group, parent, index, members in req.get("join", []):
            self.switches[sw].agg_join(group, parent, index, members)
            self._lease(group, owner)[2].append(sw)
        for sw, group in req.get("leave", []):
            self.switches[sw].agg_leave(group)
            self.leases.pop(group, None)
        for sw, group in req.get("unregister", []):
            self.switches[sw].agg_unregister(group)
            self.leases.pop(group, None)

    def _lease(self, group: int, owner: list) -> tuple[int, int, list[str], list[str]]:
        return self.leases.setdefault(group, (int(owner[0]), int(owner[1]), [], []))

    def expire_leases(self) -> int:
        """Undo the registrations whose owner process is gone; how many groups."""
        gone = [g for g, (pid, start, _, _) in self.leases.items()
                if not registry.process_alive(pid, start)]  # fmt: skip
        for group in gone:
            _pid, _start, joined, registered = self.leases.pop(group)
            for sw in joined:
                self.switches[sw].agg_leave(group)
            for sw in registered:
                self.switches[sw].agg_unregister(group)
        self.leases_expired += len(gone)
        return len(gone)

    def set_node(self, name: str, up: bool) -> dict:
        if name not in self.switches:
            raise KeyError(f"no switch {name!r} in lab {self.name}")
        self.switches[name].set_up(up)
        self.node_up[name] = up
        return {"node": name, "up": up}


async def _serve(fabric: Fabric, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ethp-ctl")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            req = json.loads(line or b"{}")
            op = req.get("op")
            if op == "ping":
                resp = {"ok": True, "pid": os.getpid()}
            elif op == "stats":
                # (a netlink query per host namespace: not on the loop)
                resp = {"ok": True, "stats": await loop.run_in_executor(pool, fabric.stats)}
            elif op == "sample":
                resp = {"ok": True, "sample": fabric.sample()}
            elif op == "link":
                # pyroute2 (tc) runs on a worker thread, never on the uvloop loop
                res = await loop.run_in_executor(pool, fabric.set_link, req["link"], req["set"])
                resp = {"ok": True, "link": res}
            elif op == "scale":
                res = await loop.run_in_executor(pool, fabric.scale, req)
                resp = {"ok": True, **res}
            elif op == "governor":
                resp = {"ok": True, "governor": fabric.governor_state(all_events=True)}
            elif op == "node":
                resp = {"ok": True, **fabric.set_node(req["node"], bool(req["up"]))}
            elif op == "inc":
                fabric.inc(req)
                resp = {"ok": True}
            elif op == "config":
                resp = {"ok": True, "config": fabric.switches[req["node"]].config()}
            else:
                resp = {"ok": False, "error": f"unknown request {op!r}"}
        except (KeyError, ValueError, TypeError, OSError) as exc:
            resp = {"ok": False, "error": str(exc).strip("'\"")}
        writer.write(json.dumps(resp).encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    path = socket_path(fabric.name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = await asyncio.start_unix_server(handle, path=path)

    async def watch_lab() -> None:
        # A fabric outlives nothing: if its lab is removed behind its back
        # (ethplus clean, a test's fallback), it stops instead of idling on.
        while not stop.is_set():
            await asyncio.sleep(1.0)
            fabric.expire_leases()
            if not registry.lab_dir(fabric.name).exists():
                print(f"fabric: lab {fabric.name} was removed; exiting", file=sys.stderr)
                stop.set()

    watcher = asyncio.create_task(watch_lab())
    async with server:
        await stop.wait()
    watcher.cancel()
    # a link request may be inside C on the pool's thread: let it finish
    # before _main frees the switches (a later one finds them closed)
    pool.shutdown(wait=True)


async def _main(name: str) -> int:
    rec = registry.load_lab(name)
    if rec is None:
        print(f"fabric: no lab {name!r}", file=sys.stderr)
        return 1
    fabric_client.record_self(name)
    fabric = Fabric(rec)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            await loop.run_in_executor(pool, fabric.shape_hosts)
            await loop.run_in_executor(pool, kernel.tcp_routes, rec, fabric.k)
        fabric.build()
        halt = threading.Event()
        gov = threading.Thread(target=fabric.govern, args=(halt,), name="ethp-governor")
        gov.start()
        try:
            await _serve(fabric, stop)
        finally:
            halt.set()
            gov.join()
    finally:
        fabric.close()
    return 0


def main() -> int:
    name = sys.argv[1]
    os.umask(0o077)  # its socket and log: root's alone
    # The fabric plays the wires: it must run when a frame is due, ahead of
    # the traffic generators and kernels it shares two cores with.
    with contextlib.suppress(OSError):
        os.nice(core.DATAPLANE_NICE)  # the NIC engines' too (nic.c)
    return uvloop.run(_main(name))


if __name__ == "__main__":
    sys.exit(main())
