"""An in-process transport for unit tests of the collective algorithms: ranks
are threads, a message is a copy through a shared mailbox.  It checks the
algorithms' arithmetic and matching, not any network (lab tests do that)."""

from __future__ import annotations

import threading

from dataplane.run.collectives import Comm
from dataplane.run.transport import ShortMessage, Transport


class Hub:
    def __init__(self, world: int):
        self.world = world
        self.cond = threading.Condition()
        self.box: dict[tuple[int, int, int], bytes] = {}


class LocalTransport(Transport):
    name = "local"

    def __init__(self, hub: Hub, rank: int):
        self.hub, self.rank, self.world = hub, rank, hub.world

    def _isend(self, peer, tag, view):
        key = (self.rank, peer, tag)
        with self.hub.cond:
            assert key not in self.hub.box, f"tag {tag} reused between {self.rank} and {peer}"
            self.hub.box[key] = bytes(view)
            self.hub.cond.notify_all()
        return None

    def _irecv(self, peer, tag, view):
        return (peer, tag, view)

    def _wait(self, handle):
        if handle is None:
            return
        peer, tag, view = handle
        key = (peer, self.rank, tag)
        with self.hub.cond:
            assert self.hub.cond.wait_for(lambda: key in self.hub.box, timeout=20), (
                f"rank {self.rank} waits for {key}"
            )
            data = self.hub.box.pop(key)
        assert len(data) <= len(view), f"{len(data)}-byte message into a {len(view)}-byte buffer"
        view[: len(data)] = data
        if len(data) < len(view):
            raise ShortMessage(f"rank {peer}: {len(data)} of {len(view)} bytes", peer, len(data),
                               len(view))  # fmt: skip

    def _poll(self, handle, timeout_s):
        if handle is not None:
            key = (handle[0], self.rank, handle[1])
            with self.hub.cond:
                if not self.hub.cond.wait_for(lambda: key in self.hub.box, timeout=timeout_s):
                    return False
        self._wait(handle)
        return True

    def counters(self):
        return {}


def run_ranks(world: int, body, dtype: str = "float32") -> list:
    """Run body(comm) on world threads; return their results in rank order."""
    hub = Hub(world)
    out: list = [None] * world
    errors: list = []

    def one(r: int) -> None:
        try:
            out[r] = body(Comm(LocalTransport(hub, r), dtype))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((r, e))

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0][1]
    assert not hub.box, f"messages never received: {list(hub.box)[:5]}"
    return out
