"""A job's in-network all-reduce, planned once by the job on the lab's
record (which switches aggregate which members, on which plane) and handed
to every rank as JSON; the ranks' part is nic_transport.inc_group."""

from __future__ import annotations

import ipaddress

from dataplane.model import routing
from dataplane.run.transport import TransportError


def inc_problem(rec: dict) -> str | None:
    """Why this lab cannot run an in-network all-reduce, or None."""
    if not rec["switch"].get("inc"):
        return (
            f"lab {rec['name']!r} has no in-network computing"
            " (set inc = true under [switch] in its lab file)"
        )
    return None


def auto_in_network(rec: dict, transport: str) -> bool:
    """Whether --algo auto hands a job's all-reduces to the switches: the lab
    aggregates and the transport is the one they aggregate for."""
    return transport == "ethplus" and inc_problem(rec) is None


def inc_plan(rec: dict, members: list[int] | None, group: int, down=frozenset()) -> dict:
    """A job's in-network all-reduce on this lab, made once by the job and
    handed to every rank (JSON): its streams (routing.inc_plan; members are
    lab ranks, None: every accelerator; switches in down are left out), each
    with its group id (group, with the stream's number in the low 4 bits),
    its root and inner nodes by aggregator id, and each member's hop."""
    why = inc_problem(rec)
    if why:
        raise TransportError(why)
    hosts = {n["index"]: n["name"] for n in rec["topology"]["nodes"] if n["role"] == "host"}
    ranks = list(members) if members is not None else sorted(hosts)
    streams = routing.inc_plan(
        rec["topology"], [hosts[r] for r in ranks], bool(rec["switch"].get("inc_tree", True)), down
    )
    if not streams:
        raise TransportError(
            "no switch that is up reaches every member of the job"
            + (f" ({', '.join(sorted(down))} down)" if down else "")
        )
    ids = routing.switch_ids(rec["topology"])
    meets: dict[str, int] = {}  # aggregator -> streams of the job that use it
    for st in streams:
        for sw in {st.root, *st.inner}:
            meets[sw] = meets.get(sw, 0) + 1
    slots = int(rec["switch"].get("inc_slots", 1024))
    share = max(meets.values())
    # one job may take half of a switch's slots, over its streams that meet there
    quota = max(1, slots // (2 * share))
    nodes = {n["name"]: n for n in rec["topology"]["nodes"]}

    def host(m: str, plane: int) -> list[int]:
        port = next(p for p in nodes[m]["ports"] if p.get("plane", 0) == plane)
        return [nodes[m]["index"], int(ipaddress.IPv4Address(port["ip"]))]

    # [switch, group, members in index order, quota]: what the control plane vouches for
    register = []
    for i, st in enumerate(streams):
        g = (group & ~0xF) | i
        at: dict[str, dict[int, list[int]]] = {}
        for m, (sw, plane, _n, idx) in st.hop.items():
            at.setdefault(sw, {})[idx] = host(m, plane)
        for sw, idx in st.inner.items():
            at.setdefault(st.root, {})[idx] = [
                routing.AGG_EP_BASE + ids[sw],
                routing.AGG_NET + ids[sw],
            ]
        register += [[sw, g, [ms[k] for k in sorted(ms)], quota] for sw, ms in at.items()]
    return {
        "slots": slots,
        "share": share,
        "register": register,
        "streams": [
            {
                "group": (group & ~0xF) | i,
                "root": ids[st.root],
                "root_members": st.root_members,
                "inner": st.inner,  # switch -> its index at the root
                "hop": {m: [ids[h[0]], *h[1:]] for m, h in st.hop.items()},
            }
            for i, st in enumerate(streams)
        ],
    }


def inc_trees(plan: dict) -> list[list]:
    """The inner nodes of a job's trees, as the fabric's inc request wants
    them: [switch, group, root id, index at the root, the root's members]."""
    return [
        [sw, st["group"], st["root"], idx, st["root_members"]]
        for st in plan["streams"]
        for sw, idx in st["inner"].items()
    ]
