"""Forwarding tables of a lab's switches, computed from its topology (pure).

Every accelerator port address is a destination.  The switch a host port is
attached to forwards to that port; every other switch forwards along all
shortest switch-to-switch paths towards it (the equal-cost group).  An ETH+
endpoint (the host's rank) routes like the host's port that this switch can
reach, preferring the switch's own plane.

In-network aggregation: switch k (in topology order) is aggregator k, ETH+
endpoint AGG_EP_BASE + k; every other switch routes that endpoint (and the
aggregator's IPv4 address, which the switch maps onto it) along its
shortest paths to k.  A job's aggregators are the switches whose farthest
member is nearest (aggregators()).
"""

from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import dataclass, field

AGG_EP_BASE = 0xF000  # ETHP_AGG_EP_BASE
AGG_NET = 0xC613F100  # ETHP_AGG_NET: aggregator k's address is AGG_NET + k (198.19.241.k)
MAX_AGGREGATORS = 16  # ETHP_NIC_MAX_PLANES: aggregators one job may use


@dataclass
class SwitchTable:
    name: str
    ipv4: dict[int, list[int]] = field(default_factory=dict)  # address -> port indexes
    ep: dict[int, list[int]] = field(default_factory=dict)  # endpoint -> port indexes


def _switch_graph(nodes: dict[str, dict], down=frozenset()) -> dict[str, list[tuple[int, str]]]:
    """switch -> [(port index, neighbour switch)], without the switches in down"""
    return {
        name: [
            (p["index"], p["peer"])
            for p in n["ports"]
            if nodes[p["peer"]]["role"] == "switch" and p["peer"] not in down
        ]
        for name, n in nodes.items()
        if n["role"] == "switch" and name not in down
    }


def _distances(graph: dict[str, list[tuple[int, str]]], target: str) -> dict[str, int]:
    dist = {target: 0}
    todo = deque([target])
    while todo:
        s = todo.popleft()
        for _port, nb in graph[s]:
            if nb not in dist:
                dist[nb] = dist[s] + 1
                todo.append(nb)
    return dist


def switch_ids(topology: dict) -> dict[str, int]:
    """switch name -> its number: its aggregator number (in-network
    computing) and its switch id in INT records (HPCC)"""
    switches = [n["name"] for n in topology["nodes"] if n["role"] == "switch"]
    return {name: i for i, name in enumerate(switches)}


def aggregators(
    topology: dict, members: list[str], down=frozenset()
) -> list[tuple[str, dict[str, int]]]:
    """The switches a job of these hosts aggregates at: those whose farthest
    member is the fewest hops away (every plane switch of a single-tier
    fabric, the spines of a Clos, the one leaf a job inside a leaf shares),
    at most MAX_AGGREGATORS.  With each, the plane of the port through which
    each member reaches it (nearest first, then the lowest plane).  Switches
    in down are neither aggregators nor on the way to one."""
    nodes = {n["name"]: n for n in topology["nodes"]}
    graph = _switch_graph(nodes, down)
    reach: dict[str, dict[str, tuple[int, int]]] = {}  # switch -> member -> (hops, plane)
    for s in graph:
        dist = _distances(graph, s)
        reach[s] = {}
        for m in members:
            options = [
                (dist[p["peer"]] + 1, p.get("plane", 0))
                for p in nodes[m]["ports"]
                if p["peer"] in dist
            ]
            if options:
                reach[s][m] = min(options)
    usable = {s: r for s, r in reach.items() if len(r) == len(members)}
    if not usable:
        return []
    worst = {s: max(h for h, _ in r.values()) for s, r in usable.items()}
    best = min(worst.values())
    ids = switch_ids(topology)
    chosen = sorted((s for s in usable if worst[s] == best), key=ids.__getitem__)
    return [(s, {m: usable[s][m][1] for m in members}) for s in chosen[:MAX_AGGREGATORS]]


@dataclass
class IncStream:
    """One stream of a job's in-network all-reduce: the chunks that one top
    aggregator (root) finishes.  hop: where each member sends its chunks
    (aggregator, the plane it leaves by, the members there, its index
    there).  inner: switches that reduce their own members' chunks first and
    send the partial to the root (tree), with their index at the root."""

    root: str
    root_members: int
    hop: dict[str, tuple[str, int, int, int]]
    inner: dict[str, int]


def inc_plan(
    topology: dict, members: list[str], tree: bool = True, down=frozenset()
) -> list[IncStream]:
    """The streams of a job (one per aggregators() root).  With tree, a
    member's first switch, when it is next to the root and has two or more
    of the job's members, reduces theirs first (SHARP's aggregation tree):
    the root's links from it then carry one partial per chunk instead of
    one contribution per member."""
    nodes = {n["name"]: n for n in topology["nodes"]}
    graph = _switch_graph(nodes, down)
    ids = switch_ids(topology)
    out = []
    for root, planes in aggregators(topology, members, down):
        dist = _distances(graph, root)
        first = {}  # member -> its switch towards the root
        for m in members:
            ports = [p for p in nodes[m]["ports"] if p.get("plane", 0) == planes[m]]
            first[m] = min(ports, key=lambda p: (dist.get(p["peer"], 1 << 30), p["index"]))["peer"]
        local: dict[str, list[str]] = {}
        for m in members:
            local.setdefault(first[m], []).append(m)
        inner = sorted(
            (
                sw
                for sw, ms in local.items()
                if tree and sw != root and dist.get(sw) == 1 and len(ms) > 1
            ),
            key=ids.__getitem__,
        )
        direct = [m for m in members if first[m] not in inner]
        n_root = len(direct) + len(inner)
        hop = {m: (root, planes[m], n_root, i) for i, m in enumerate(direct)}
        for sw in inner:
            for i, m in enumerate(local[sw]):
                hop[m] = (sw, planes[m], len(local[sw]), i)
        out.append(
            IncStream(root, n_root, hop, {sw: len(direct) + i for i, sw in enumerate(inner)})
        )
    return out


def tables(topology: dict) -> dict[str, SwitchTable]:
    nodes = {n["name"]: n for n in topology["nodes"]}
    graph = _switch_graph(nodes)
    out = {s: SwitchTable(s) for s in graph}
    dist_cache: dict[str, dict[str, int]] = {}
    for target, k in switch_ids(topology).items():
        dist = dist_cache[target] = _distances(graph, target)
        for s, d in dist.items():
            if d:
                toward = [port for port, nb in graph[s] if dist.get(nb) == d - 1]
                out[s].ep[AGG_EP_BASE + k] = toward
    # host port -> (address, attached switch, that switch's port index facing it)
    for host in (n for n in nodes.values() if n["role"] == "host"):
        reach: dict[str, tuple[int, list[int]]] = {}  # switch -> (plane, group) for the EP
        for hp in host["ports"]:
            attached = hp["peer"]
            facing = next(p["index"] for p in nodes[attached]["ports"] if p["link"] == hp["link"])
            addr = int(ipaddress.IPv4Address(hp["ip"]))
            if attached not in dist_cache:
                dist_cache[attached] = _distances(graph, attached)
            dist = dist_cache[attached]
            for s, d in dist.items():
                if d == 0:
                    group = [facing]
                else:
                    group = [port for port, nb in graph[s] if dist.get(nb) == d - 1]
                out[s].ipv4[addr] = group
                plane = hp.get("plane", 0)
                prev = reach.get(s)
                own_plane = nodes[s].get("plane")
                if prev is None or (own_plane == plane and prev[0] != own_plane):
                    reach[s] = (plane, group)
        for s, (_plane, group) in reach.items():
            out[s].ep[host["index"]] = group
    return out
