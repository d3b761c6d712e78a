"""Faults: link and switch changes on a running lab, as `ethplus link set`,
`node set` and scenario fault schedules make them (changes.py reads them
from words)."""

from __future__ import annotations

from dataplane.lab import labs


def set_link(lab_name: str, link: str, change: dict) -> dict:
    return labs.control(lab_name, {"op": "link", "link": link, "set": change})["link"]


def set_node(lab_name: str, node: str, up: bool) -> dict:
    return labs.control(lab_name, {"op": "node", "node": node, "up": up})


def restore(rec: dict, links: set[str], switches: set[str]) -> None:
    """Links and switches of a running lab back to their lab file's values."""
    for lk in rec["topology"]["links"]:
        if lk["name"] not in links:
            continue
        prm = lk["params"]
        set_link(rec["name"], lk["name"], {
            "up": True, "loss": 0.0, "corrupt": 0.0,
            "rate_bps": prm["rate_bps"], "delay_ns": prm["delay_ns"],
            "jitter_ns": prm.get("jitter_ns", 0), "llr": prm.get("llr", False),
        })  # fmt: skip
    for sw in switches:
        set_node(rec["name"], sw, True)
