"""The topology model: pure data, no side effects, no root.

A Topology holds nodes (accelerator hosts and switches), their ports and the
links between them, each link with nominal parameters.  Builders make the
four families this tool emulates:

- ``erack``: N accelerators, P planes, one single-tier switch per plane; every
  accelerator has one port per plane (ERack+ 64 is N=64, P=8).
- ``upn``: the same single-tier shape with large-radix switches (UPN 512).
- ``clos``: two-tier leaf-spine, hosts per leaf, spines, oversubscription.
- ``hpn``: rail-optimised dual plane: hosts of G accelerators, each
  accelerator with one port per plane to the ToR of its rail in that plane,
  ToRs of a plane joined by that plane's spines.

Naming is regular and short: accelerators ``h0``..``hN-1``; switches by role
and index (``plane0``, ``leaf2``, ``spine1``, ``tor5``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass, field

from dataplane.errors import UsageError

IFNAMSIZ_CHARS = 15
IF_PREFIX = "ethp"
# A lab name: it becomes a directory and namespace names, so it is checked
# (whole, fullmatch: no trailing newline) before it becomes any path.
LAB_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,23}")
NODE_NAME_RE = re.compile(r"[a-z]+[0-9]+")
LAB_NAME_EXPECTED = "1-24 characters: a-z, 0-9 and '-', starting with a letter or digit"
LAB_TAG_CHARS = 2
# ethp + tag + "-" + peer node name (+ optional ".k" for parallel links)
IF_NAME_OVERHEAD_CHARS = len(IF_PREFIX) + LAB_TAG_CHARS + 1

HOST_NET = ipaddress.IPv4Network("198.18.0.0/16")  # accelerator ports
GATEWAY_NET = ipaddress.IPv4Network("198.19.0.0/16")  # virtual next hops, one per plane
MAX_PLANES = 16
MAX_HOSTS_PER_PLANE = 4094  # 198.18.0.0/16 is cut into 16 /20 blocks, one per plane

# Real link-rate budget of this class of machine for time_scale = "auto": the
# smallest k with (sum of every link's nominal rate) / k <= this.  Measured by
# scripts/bench_switch.py: one ethplus switch forwarded 7.6 Gbit/s of MTU
# frames with both cores busy (a generator on one); a lab also runs its
# senders, receivers and transports on the same two cores, so a quarter of
# that is what its links may carry together.  Since the TX ring it forwards
# 11.5 Gbit/s; the budget was left where it was, as headroom for the
# transports (the fidelity figures were measured at it).
# docs/performance.md.
AUTO_REAL_BUDGET_BPS = 2_000_000_000


def valid_name(name: object) -> bool:
    return isinstance(name, str) and LAB_NAME_RE.fullmatch(name) is not None


@dataclass(frozen=True)
class LinkParams:
    """Nominal parameters of one link (both directions)."""

    rate_bps: int
    delay_ns: int
    buffer_bytes: int  # egress buffer of the switch port(s) on this link
    mtu_bytes: int  # interface (IP) MTU
    llr: bool = False  # link-level retry on this link
    jitter_ns: int = 0  # each frame's delay: delay_ns + uniform [0, jitter_ns], order kept

    def bdp_bytes(self, rtt_ns: int) -> int:
        return self.rate_bps * rtt_ns // 8 // 1_000_000_000


@dataclass
class Port:
    node: str
    index: int
    link: str  # link name
    peer: str  # peer node name
    ifname: str = ""  # without the lab tag; realised as ethp<tag>-<peer>
    plane: int = 0
    ip: str | None = None  # accelerator ports only
    gateway: str | None = None


@dataclass
class Node:
    name: str
    role: str  # "host" | "switch"
    kind: str  # accelerator | plane | leaf | spine | tor
    index: int
    radix: int = 0  # switches: maximum ports
    plane: int | None = None
    rail: int | None = None
    ports: list[Port] = field(default_factory=list)


@dataclass
class Link:
    name: str
    a: str
    a_port: int
    b: str
    b_port: int
    params: LinkParams
    tier: str  # "host" (accelerator to first switch) | "fabric"
    plane: int = 0


class TopologyError(UsageError):
    """A topology that cannot be built; .key names the lab-file key to blame."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(message)


@dataclass
class Topology:
    family: str
    nodes: dict[str, Node] = field(default_factory=dict)
    links: dict[str, Link] = field(default_factory=dict)
    planes: int = 1
    base_rtt_ns: int = 0

    # -- construction
    def add_node(self, node: Node) -> Node:
        if node.name in self.nodes:
            raise TopologyError("topology", f"duplicate node name {node.name}")
        self.nodes[node.name] = node
        return node

    def connect(self, a: str, b: str, params: LinkParams, tier: str, plane: int = 0) -> Link:
        na, nb = self.nodes[a], self.nodes[b]
        parallel = sum(1 for p in na.ports if p.peer == b)
        name = f"{a}-{b}" if not parallel else f"{a}-{b}.{parallel}"
        suffix = "" if not parallel else f".{parallel}"
        pa = Port(node=a, index=len(na.ports), link=name, peer=b, ifname=b + suffix, plane=plane)
        pb = Port(node=b, index=len(nb.ports), link=name, peer=a, ifname=a + suffix, plane=plane)
        na.ports.append(pa)
        nb.ports.append(pb)
        link = Link(name, a, pa.index, b, pb.index, params, tier, plane)
        self.links[name] = link
        return link

    # -- queries
    def hosts(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.role == "host"]

    def switches(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.role == "switch"]

    def check(self, radix_key: str = "topology.switch_radix") -> None:
        """Raise TopologyError if something does not fit: radix, names, addresses."""
        for sw in self.switches():
            if sw.radix and len(sw.ports) > sw.radix:
                raise TopologyError(
                    radix_key,
                    f"switch {sw.name} needs {len(sw.ports)} ports but its radix is {sw.radix}",
                )

    def check_names(self, keys: dict[str, str]) -> None:
        """Raise TopologyError if an interface named after a node would not fit.

        keys maps a node kind to the lab-file key that sets how many there are."""
        longest = max(self.nodes.values(), key=lambda n: len(n.name))
        if IF_NAME_OVERHEAD_CHARS + len(longest.name) > IFNAMSIZ_CHARS:
            raise TopologyError(
                keys.get(longest.kind, "topology"),
                f"interfaces facing node {longest.name} would be named with "
                f"{IF_NAME_OVERHEAD_CHARS + len(longest.name)} characters; Linux allows "
                f"{IFNAMSIZ_CHARS}: use fewer nodes",
            )

    def total_link_rate_bps(self) -> int:
        return sum(link.params.rate_bps for link in self.links.values())

    def auto_time_scale(self) -> float:
        """The time scale 'auto' resolves to: total nominal link rate / real budget."""
        return max(1.0, self.total_link_rate_bps() / AUTO_REAL_BUDGET_BPS)

    def to_dict(self) -> dict:
        return {
            "family": self.family,
            "planes": self.planes,
            "base_rtt_ns": self.base_rtt_ns,
            "nodes": [
                {k: v for k, v in asdict(n).items() if v is not None} for n in self.nodes.values()
            ],
            "links": [asdict(link) for link in self.links.values()],
        }


# ---------------------------------------------------------------- addressing


def host_ip(plane: int, host_index: int) -> str:
    """Address of accelerator host_index's port on plane (198.18.0.0/16)."""
    return str(HOST_NET.network_address + plane * 4096 + host_index + 1)


def plane_subnet(plane: int) -> str:
    return str(ipaddress.IPv4Network((int(HOST_NET.network_address) + plane * 4096, 20)))


def gateway_ip(plane: int) -> str:
    """The virtual next hop of a plane; each host resolves it to its switch port."""
    return str(GATEWAY_NET.network_address + plane * 4096 + 1)


def _assign_addresses(topo: Topology) -> None:
    for h in topo.hosts():
        for p in h.ports:
            p.ip = host_ip(p.plane, h.index)
            p.gateway = gateway_ip(p.plane)


def _check_counts(n_hosts: int, planes: int) -> None:
    if planes > MAX_PLANES:
        raise TopologyError("topology.planes", f"at most {MAX_PLANES} planes, got {planes}")
    if n_hosts > MAX_HOSTS_PER_PLANE:
        raise TopologyError(
            "topology.accelerators", f"at most {MAX_HOSTS_PER_PLANE} accelerators, got {n_hosts}"
        )


def _add_hosts(topo: Topology, n: int) -> list[Node]:
    return [topo.add_node(Node(f"h{i}", "host", "accelerator", i)) for i in range(n)]


# ---------------------------------------------------------------- builders


def single_tier(
    family: str,
    accelerators: int,
    planes: int,
    switch_radix: int,
    host_link: LinkParams,
) -> Topology:
    """erack / upn: one switch per plane, every accelerator on every plane."""
    _check_counts(accelerators, planes)
    topo = Topology(family=family, planes=planes, base_rtt_ns=4 * host_link.delay_ns)
    hosts = _add_hosts(topo, accelerators)
    planes_nodes = [
        topo.add_node(Node(f"plane{p}", "switch", "plane", p, radix=switch_radix, plane=p))
        for p in range(planes)
    ]
    topo.check_names({"plane": "topology.planes", "accelerator": "topology.accelerators"})
    for p, sw in enumerate(planes_nodes):
        for h in hosts:
            topo.connect(h.name, sw.name, host_link, "host", plane=p)
    topo.check("topology.switch_radix")
    _assign_addresses(topo)
    return topo


def clos(
    leaves: int,
    hosts_per_leaf: int,
    spines: int,
    oversubscription: float,
    switch_radix: int,
    host_link: LinkParams,
    fabric_link: LinkParams,
) -> Topology:
    """Two-tier leaf-spine.  Uplink rate = hosts_per_leaf * host rate / (spines * ratio)."""
    n_hosts = leaves * hosts_per_leaf
    _check_counts(n_hosts, 1)
    uplink_bps = int(hosts_per_leaf * host_link.rate_bps / (spines * oversubscription))
    if uplink_bps <= 0:
        raise TopologyError("topology.oversubscription", "leaves no uplink bandwidth")
    up = LinkParams(
        uplink_bps, fabric_link.delay_ns, fabric_link.buffer_bytes, fabric_link.mtu_bytes
    )
    topo = Topology(
        family="clos", planes=1, base_rtt_ns=2 * (2 * host_link.delay_ns + 2 * up.delay_ns)
    )
    hosts = _add_hosts(topo, n_hosts)
    leaf_nodes = [
        topo.add_node(Node(f"leaf{i}", "switch", "leaf", i, radix=switch_radix))
        for i in range(leaves)
    ]
    spine_nodes = [
        topo.add_node(Node(f"spine{i}", "switch", "spine", i, radix=switch_radix))
        for i in range(spines)
    ]
    topo.check_names(
        {"spine": "topology.spines", "leaf": "topology.leaves", "accelerator": "topology.leaves"}
    )
    for h in hosts:
        topo.connect(h.name, leaf_nodes[h.index // hosts_per_leaf].name, host_link, "host")
    for leaf in leaf_nodes:
        for sp in spine_nodes:
            topo.connect(leaf.name, sp.name, up, "fabric")
    topo.check("topology.switch_radix")
    _assign_addresses(topo)
    return topo


def hpn(
    hosts: int,
    accelerators_per_host: int,
    tors_per_rail: int,
    spines_per_plane: int,
    switch_radix: int,
    host_link: LinkParams,
    fabric_link: LinkParams,
) -> Topology:
    """Rail-optimised dual plane (HPN-style).

    Accelerator j of host k is on rail j.  In each of the two planes, rail j
    has tors_per_rail ToRs; host k's accelerator uses ToR k % tors_per_rail of
    its rail.  Every ToR of a plane links to every spine of that plane.
    """
    planes = 2
    n_acc = hosts * accelerators_per_host
    _check_counts(n_acc, planes)
    topo = Topology(
        family="hpn",
        planes=planes,
        base_rtt_ns=2 * (2 * host_link.delay_ns + 2 * fabric_link.delay_ns),
    )
    accs = _add_hosts(topo, n_acc)
    rails = accelerators_per_host
    tors: dict[tuple[int, int, int], Node] = {}
    for p in range(planes):
        for r in range(rails):
            for t in range(tors_per_rail):
                idx = len(tors)
                tors[p, r, t] = topo.add_node(
                    Node(f"tor{idx}", "switch", "tor", idx, radix=switch_radix, plane=p, rail=r)
                )
    spines = {}
    for p in range(planes):
        for s in range(spines_per_plane):
            idx = p * spines_per_plane + s
            spines[p, s] = topo.add_node(
                Node(f"spine{idx}", "switch", "spine", idx, radix=switch_radix, plane=p)
            )
    topo.check_names(
        {
            "spine": "topology.spines_per_plane",
            "tor": "topology.tors_per_rail",
            "accelerator": "topology.hosts",
        }
    )
    for acc in accs:
        host_k, rail = divmod(acc.index, accelerators_per_host)
        acc.rail = rail
        for p in range(planes):
            tor = tors[p, rail, host_k % tors_per_rail]
            topo.connect(acc.name, tor.name, host_link, "host", plane=p)
    for (p, _r, _t), tor in tors.items():
        for s in range(spines_per_plane):
            topo.connect(tor.name, spines[p, s].name, fabric_link, "fabric", plane=p)
    topo.check("topology.switch_radix")
    _assign_addresses(topo)
    return topo
