"""What a job may name: the collectives and their algorithms, and the
transports (pure: no lab, no C)."""

from __future__ import annotations

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "broadcast")
ALGORITHMS = {"all-reduce": ("ring", "halving-doubling", "in-network")}
TRANSPORT_LABELS = {
    "ethplus": "ETH+ (this project's NIC)",
    "tcp": "kernel TCP",
    "roce": "RoCEv2 (emulated)",
}


def available() -> list[str]:
    """Transports this build can run, in report order."""
    return ["ethplus", "roce", "tcp"]


def canonical(name: str) -> str:
    """'allreduce', 'all_reduce' and 'all-reduce' all name all-reduce."""
    key = name.lower().replace("_", "").replace("-", "")
    for c in COLLECTIVES:
        if c.replace("-", "") == key:
            return c
    raise ValueError(f"unknown collective {name!r} (expected one of {', '.join(COLLECTIVES)})")


def bus_factor(collective: str, world: int) -> float:
    """busbw = algbw x factor (nccl-tests' definitions, PROTOCOLS.md)."""
    n = world
    return {
        "all-reduce": 2 * (n - 1) / n,
        "reduce-scatter": (n - 1) / n,
        "all-gather": (n - 1) / n,
        "all-to-all": (n - 1) / n,
        "broadcast": 1.0,
    }[canonical(collective)]
