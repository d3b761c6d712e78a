"""Values a process computes once, however many of its threads ask at once.

A rank host runs hundreds of ranks as threads of one process, and they pass
each barrier together: a plain ``functools.lru_cache`` lets every one of
them miss and compute the same value side by side (512 ranks' reference
reduction, each summing 512 rolled tables).  ``once`` serialises the
lookups, so the first computes and the rest read its result.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def once(maxsize: int) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """lru_cache(maxsize) behind a lock: each key computed by one thread."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        lock = threading.Lock()

        @functools.wraps(fn)
        def call(*args):
            with lock:
                return cached(*args)

        return call

    return wrap
