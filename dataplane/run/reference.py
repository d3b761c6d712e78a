"""Data types, reduction operators, test data and the numpy reference results.

Every rank fills its buffers with a deterministic pattern of small integers
(exactly representable in every supported type, even summed over every rank),
so a reduction gives one exact answer whatever order an algorithm adds in, and
results are checked bit for bit.  The pattern repeats a seeded random table of
a prime period (shifted per rank) plus a term that changes every period, so a
chunk placed at the wrong offset, from the wrong rank or twice is caught.
Because the reduction of periodic inputs is periodic, the reference costs one
period of work per rank, not a full buffer per rank.
"""

from __future__ import annotations

import numpy as np

from dataplane.memo import once

# name: (storage dtype, compute dtype, largest integer held exactly)
DTYPES: dict[str, tuple[type, type, int]] = {
    "float32": (np.float32, np.float32, 1 << 24),
    "float16": (np.float16, np.float16, 1 << 11),
    "bfloat16": (np.uint16, np.float32, 1 << 8),  # stored as its 16 bits
    "int32": (np.int32, np.int32, 1 << 30),
    "int64": (np.int64, np.int64, 1 << 62),
}
ALIASES = {"float": "float32", "half": "float16", "bf16": "bfloat16", "int": "int32",
           "fp32": "float32", "fp16": "float16"}  # fmt: skip
OPS = ("sum", "max", "min")
PERIOD = 65521  # elements; prime, so no chunking of a power-of-two buffer lines up with it
BLOCK_VALUES = 3  # the per-period term cycles through 0, 1, 2


def dtype_name(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"unknown data type {name!r} (expected one of {', '.join(DTYPES)})")
    return name


def itemsize(dtype: str) -> int:
    return np.dtype(DTYPES[dtype][0]).itemsize


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as hardware converts."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    b = b + np.uint32(0x7FFF) + ((b >> 16) & np.uint32(1))
    return (b >> 16).astype(np.uint16)


_UFUNC = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def reduce_into(dst: np.ndarray, src: np.ndarray, op: str, dtype: str) -> None:
    """dst = dst (op) src, element-wise, in the type's own arithmetic."""
    f = _UFUNC[op]
    if dtype == "bfloat16":
        a = bf16_to_f32(dst)
        f(a, bf16_to_f32(src), out=a)
        dst[:] = f32_to_bf16(a)
    else:
        f(dst, src, out=dst)


def _to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    return f32_to_bf16(x) if dtype == "bfloat16" else x.astype(DTYPES[dtype][0], copy=False)


def _amplitude(dtype: str, world: int) -> int:
    """Largest |table value| with world x (amplitude + block term) still exact."""
    exact = DTYPES[dtype][2]
    return int(max(1, min(8, exact // max(world, 1) - (BLOCK_VALUES - 1))))


@once(maxsize=8)
def _table(dtype: str, seed: int, world: int) -> np.ndarray:
    """One period of the seeded table (one per process; read-only): a rank
    host's ranks, and a check that reads from every rank, share it."""
    amp = _amplitude(dtype, world)
    rng = np.random.default_rng(seed)
    t = rng.integers(-amp, amp + 1, PERIOD).astype(DTYPES[dtype][1])
    t.flags.writeable = False
    return t


def _shift(rank: int) -> int:
    return (rank * 7919 + 13) % PERIOD


def _tile(
    period: np.ndarray, start: int, count: int, block_scale: int, shift: int = 0
) -> np.ndarray:
    """Elements [start, start+count) of period (rolled left by shift) repeated,
    plus the per-period term.  Copied slice by slice: memory for count
    elements only, however small count is (an uneven all-to-all's check
    takes world pieces of a few hundred elements)."""
    out = np.empty(count, period.dtype)
    i, at = 0, (start + shift) % PERIOD
    while i < count:
        n = min(count - i, PERIOD - at)
        out[i : i + n] = period[at : at + n]
        i, at = i + n, 0
    i = 0
    while i < count:
        blk = (start + i) // PERIOD
        end = min(count, (blk + 1) * PERIOD - start)
        val = (blk % BLOCK_VALUES) * block_scale
        if val:
            out[i:end] += val
        i = end
    return out


def pattern(rank: int, count: int, dtype: str, seed: int, world: int, start: int = 0) -> np.ndarray:
    """Rank's input: elements [start, start+count) of its pattern."""
    return _to_storage(_tile(_table(dtype, seed, world), start, count, 1, _shift(rank)), dtype)


@once(maxsize=8)
def _reduced_period(op: str, dtype: str, seed: int, world: int) -> np.ndarray:
    """One period of the reduction over every rank's table, each rank's
    rolled in turn: one period of memory whatever the world (a rank host's
    ranks share it; read-only)."""
    t = _table(dtype, seed, world)
    acc = np.roll(t, -_shift(0))
    f = _UFUNC[op]
    for r in range(1, world):
        f(acc, np.roll(t, -_shift(r)), out=acc)
    acc.flags.writeable = False
    return acc


def reduced(op: str, count: int, dtype: str, seed: int, world: int, start: int = 0) -> np.ndarray:
    """The reduction over every rank of pattern(rank, ...)[start:start+count]."""
    per = _reduced_period(op, dtype, seed, world)
    # The per-period term is the same on every rank: summed world times, else once.
    return _to_storage(_tile(per, start, count, world if op == "sum" else 1), dtype)


def wrong(got: np.ndarray, want: np.ndarray) -> int:
    """Elements that differ, bit for bit (nccl-tests' #wrong)."""
    if got.shape != want.shape:
        return max(got.size, want.size)
    u = np.dtype(f"u{got.dtype.itemsize}")
    return int(np.count_nonzero(got.view(u) != want.view(u)))


@once(maxsize=4)
def uneven_counts(count: int, world: int, seed: int) -> np.ndarray:
    """An MoE-like all-to-all: each rank sends count elements in all, split over
    destinations by a skewed random share (rows: senders, columns: receivers).
    One matrix per process (world x world; read-only)."""
    rng = np.random.default_rng(seed + 1)
    rows = [rng.multinomial(count, rng.dirichlet(np.full(world, 0.5))) for _ in range(world)]
    m = np.array(rows, dtype=np.int64)
    m.flags.writeable = False
    return m


@once(maxsize=4)
def even_counts(count: int, world: int) -> np.ndarray:
    """An even all-to-all's matrix, as uneven_counts' (one per process; read-only)."""
    b = bounds(count, world)
    per = np.diff(np.array(b, dtype=np.int64))
    m = np.tile(per, (world, 1))
    m.flags.writeable = False
    return m


def bounds(count: int, parts: int) -> list[int]:
    """Offsets splitting count elements into parts nearly equal pieces (the first
    count mod parts pieces one element longer), as numpy.array_split does."""
    q, rem = divmod(count, parts)
    out = [0]
    for i in range(parts):
        out.append(out[-1] + q + (1 if i < rem else 0))
    return out
