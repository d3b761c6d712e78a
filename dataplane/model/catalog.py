"""What a job may name: the collectives and their algorithms, and the
transports (pure: no lab, no C)."""

from __future__ import annotations

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "broadcast")
ALGORITHMS = {
    "all-reduce": ("ring", "halving-doubling", "hierarchical", "tree", "in-network", "auto"),
    # ring: the pipelined chain root, root+1, ...; tree: two binary trees
    # under the root, half the buffer down each
    "broadcast": ("ring", "tree", "auto"),
}
# auto: up to this many ranks a flat ring's 2(n-1) steps are few enough
AUTO_FLAT_RANKS_MAX = 16
# auto: below this many bytes per rank per step, a step costs its latency
# more than its bytes, and the fewest steps win
AUTO_LATENCY_BOUND_BYTES = 64 * 1024
# auto, beyond AUTO_FLAT_RANKS_MAX ranks and no power of two: the tree up to
# this many bytes a rank (48 ranks of erack-64x8: its busbw 2.3x, 1.8x and
# 1.1x the hierarchical's at 256 KiB, 1 MiB and 4 MiB; the hierarchical's
# 1.34x and 1.52x the tree's at 8 and 16 MiB)
AUTO_TREE_BYTES_MAX = 4 << 20
# auto broadcast: the chain up to this many ranks, the two trees beyond
# (erack-64x8 at 8, 16 and 64 ranks, 256 KiB to 16 MiB: the trees' busbw
# 1.1-7.3x the chain's, level with it at 16 MiB on 8 ranks)
AUTO_CHAIN_RANKS_MAX = 7
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


def groups_of(world: int) -> int:
    """The group size of a hierarchical all-reduce over world ranks: the
    divisor of world nearest its square root from below (fewest steps:
    2(g-1) within groups plus 2(world/g - 1) across them); 1 when world is
    prime (no hierarchy)."""
    g = int(world**0.5)
    while world % g:
        g -= 1
    return g


def all_reduce_steps(algo: str, world: int) -> int:
    """Latency-bound steps of an all-reduce: messages each rank waits for in
    turn (a power of two for halving-doubling; the ranks beyond one fold in
    and out, two steps more)."""
    n = world
    if algo == "ring":
        return 2 * (n - 1)
    if algo == "halving-doubling":
        p = 1 << (n.bit_length() - 1)
        return 2 * (p.bit_length() - 1) + (2 if p != n else 0)
    if algo == "hierarchical":
        g = groups_of(n)
        return 2 * (g - 1) + 2 * (n // g - 1)
    if algo == "tree":  # up a balanced binary tree and down again
        return 2 * (n.bit_length() - 1)
    if algo == "in-network":
        return 1
    raise ValueError(f"unknown all-reduce algorithm {algo!r}")


def broadcast_steps(algo: str, world: int) -> int:
    """Hops from the root to the farthest rank: the chain's world - 1; the
    tree's one to each tree's root, then down a balanced binary tree over
    the other world - 1 ranks."""
    if world <= 1:
        return 0
    if algo == "ring":
        return world - 1
    if algo == "tree":
        return (world - 1).bit_length()  # 1 + the depth of a tree of world - 1
    raise ValueError(f"unknown broadcast algorithm {algo!r}")


def pick_broadcast(world: int) -> tuple[str, str]:
    """What --algo auto runs for a broadcast over world ranks, and why: the
    chain up to AUTO_CHAIN_RANKS_MAX ranks, the two trees beyond (as MPI
    libraries leave a pipelined chain for trees as the ranks grow)."""
    chain = broadcast_steps("ring", world)
    if world <= AUTO_CHAIN_RANKS_MAX:
        return "ring", f"a chain of {chain} hops, pipelined"
    t = broadcast_steps("tree", world)
    return "tree", f"{t} hops deep, not the chain's {chain}, pipelined in chunks"


def pick_all_reduce(world: int, size_bytes: int, in_network: bool = False) -> tuple[str, str]:
    """What --algo auto runs for one all-reduce of size_bytes per rank over
    world ranks, and why in a few words.  As libraries do at scale: the
    switches when they can aggregate; otherwise the fewest steps while a step
    is latency-bound (halving-doubling on a power of two), a flat ring up to
    AUTO_FLAT_RANKS_MAX ranks, and beyond that halving-doubling on a power of
    two (Rabenseifner's: the ring's bytes in 2 log2(n) steps; on erack-64x8
    at 16 MiB 0.84 of the ideal busbw against the hierarchical's 0.39), and
    otherwise the double binary tree up to AUTO_TREE_BYTES_MAX a rank and
    the hierarchical all-reduce past it (a ring inside groups, one across
    them)."""
    n = world
    ring = all_reduce_steps("ring", n)
    if in_network:
        return "in-network", "the switches aggregate: one round trip, each byte sent once"
    step_bytes = size_bytes // max(1, n)
    pow2 = n & (n - 1) == 0
    hd = all_reduce_steps("halving-doubling", n)
    if pow2 and n > 2 and step_bytes < AUTO_LATENCY_BOUND_BYTES:
        return "halving-doubling", f"{step_bytes} B a step is latency-bound: {hd} steps, not {ring}"
    if pow2 and n > AUTO_FLAT_RANKS_MAX:
        return "halving-doubling", f"{hd} steps, not the flat ring's {ring}, for the same bytes"
    if n > AUTO_FLAT_RANKS_MAX and size_bytes <= AUTO_TREE_BYTES_MAX:
        t = all_reduce_steps("tree", n)
        return "tree", f"{t} steps deep, not the flat ring's {ring}, pipelined in chunks"
    if n > AUTO_FLAT_RANKS_MAX and groups_of(n) > 1:
        g, h = groups_of(n), all_reduce_steps("hierarchical", n)
        return "hierarchical", f"{n // g} groups of {g}: {h} steps, not the flat ring's {ring}"
    return "ring", f"{ring} steps, bandwidth-bound"
