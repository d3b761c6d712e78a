"""The `ethplus` console script.

Run by a user other than root, a command that touches labs must join the
user's namespace (dataplane/lab/userns.py) while the process still has one
thread: the kernel refuses a many-threaded one, and importing numpy starts
threads.  So this joins first, with nothing heavy imported, then runs
cli.main."""

from __future__ import annotations

import os
import sys

# (command, subcommand) pairs, or commands, that never touch a lab
_OUTSIDE = {("lab", "keys"), ("scenario", "list"), ("wireshark",)}


def _needs_labs(argv: list[str]) -> bool:
    if not argv or any(a in ("-h", "--help", "--version") for a in argv):
        return False
    return (argv[0],) not in _OUTSIDE and tuple(argv[:2]) not in _OUTSIDE


def main() -> int:
    if os.geteuid() != 0 and _needs_labs(sys.argv[1:]):
        from dataplane.errors import EthplusError
        from dataplane.lab import userns

        try:
            userns.enter()
        except EthplusError as exc:
            print(f"ethplus: error: {exc}", file=sys.stderr)
            return exc.exit_code
    from cli.main import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())
