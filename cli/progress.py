"""Progress while a job runs: a rich progress bar on a terminal, plain lines
(on stderr, so stdout stays parseable) otherwise.  Result rows are printed
as each size completes, never only at the end."""

from __future__ import annotations

import sys

from dataplane.run.bench import format_row
from dataplane.units import size_text


class Reporter:
    """Callbacks for dataplane.run.bench.run, for one transport's sizes."""

    PHASES = {"check": "checking", "warm": "warming up", "time": "timing"}

    def __init__(self, sizes: list[int], title: str, echo_rows: bool = True):
        self.sizes, self.title, self.echo_rows = sizes, title, echo_rows
        self.tty = sys.stderr.isatty()
        self._progress = None

    def __enter__(self) -> Reporter:
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.title, total=len(self.sizes))
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def on_progress(self, barrier: str) -> None:
        phase, _, idx = barrier.partition("-")
        if phase not in self.PHASES or not idx.isdigit():
            return
        what = f"{self.title}: {size_text(self.sizes[int(idx)])} {self.PHASES[phase]}"
        if self._progress is not None:
            self._progress.update(self._task, description=what)
        elif phase == "check":
            print(f"# {what}", file=sys.stderr, flush=True)

    def on_row(self, row: dict) -> None:
        if self.echo_rows:
            print(format_row(row), flush=True)  # rich's live display keeps above it
        if self._progress is not None:
            self._progress.advance(self._task)
