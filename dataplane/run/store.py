"""The run's rendezvous store: torch's TCPStore, served for the whole run.

``ethplus run`` starts this next to rank 0 (in its namespace, listening on
MASTER_PORT there) and tells every rank to use it as a client
(TORCHELASTIC_USE_AGENT_STORE, as torchrun's agent does).  When rank 0 served
the store itself, a rank 0 that finished first took the store with it, and a
peer still at its last store call (gloo's or the ethplus backend's closing
barrier) failed with "Connection was likely closed".  This process lives
until the launcher stops it, after every rank has exited.

    python -I -m dataplane.run.launcher LAB NS -- python -I -m dataplane.run.store ADDR PORT WORLD
"""

from __future__ import annotations

import signal
import sys
from datetime import timedelta

USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # torch's name: every rank a client


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[1].isdigit() or not argv[2].isdigit():
        print("usage: store ADDR PORT WORLD", file=sys.stderr)
        return 2
    from torch.distributed import TCPStore

    addr, port, world = argv[0], int(argv[1]), int(argv[2])
    try:
        store = TCPStore(addr, port, world, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=30))  # fmt: skip
    except (RuntimeError, OSError) as e:  # the port is taken, most often
        print(f"cannot listen on {addr}:{port}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    del store
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    sys.exit(main(sys.argv[1:]))
