"""The one base of every error ethplus raises on purpose.

Each says what went wrong in one line, naming the file, key, argument or
lab to blame and what was expected; the command line prints it as
``ethplus: error: ...`` and exits with its ``exit_code``, never with a
traceback.  Subclasses keep a second, built-in base (``ValueError`` for bad
input, ``RuntimeError`` for an operation that failed) for callers that
catch those.
"""

from __future__ import annotations

import signal

EXIT_FAILURE = 1  # the operation failed
EXIT_USAGE = 2  # the input was wrong (as argparse exits)


class EthplusError(Exception):
    """An error a user can act on; exit_code is what the CLI exits with."""

    exit_code = EXIT_FAILURE


class UsageError(EthplusError, ValueError):
    """Bad input: a file, key or argument that is not what was expected."""

    exit_code = EXIT_USAGE


class Interrupted(EthplusError, RuntimeError):
    """A signal (SIGTERM, or SIGINT: Ctrl-C) stopped the operation, which
    cleaned up after itself; the CLI exits as a shell reports the signal."""

    def __init__(self, signame: str, what: str = ""):
        super().__init__(f"interrupted by {signame}" + (f"; {what}" if what else ""))
        self.signame = signame
        self.exit_code = 128 + int(getattr(signal.Signals, signame, signal.SIGTERM))
