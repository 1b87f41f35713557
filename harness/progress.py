"""A progress bar with ETA on stderr (quiet when stderr is not a terminal)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


class _Bar:
    """`advance(k)` moves the bar; `set_total(n)` sets its length once the work is known; `stop()` removes it."""

    def __init__(self, progress=None, task=None) -> None:
        self._progress, self._task = progress, task

    def __call__(self, k: int) -> None:
        self.advance(k)

    def advance(self, k: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, k)

    def set_total(self, n: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=n)

    def stop(self) -> None:
        """Take the bar off the terminal now and show the cursor again (before a last message and an exit that
        skips the `progress_bar` block's end)."""
        if self._progress is not None:
            self._progress.stop()


@contextmanager
def progress_bar(total: int | None, label: str) -> Iterator[_Bar]:
    """Yield a bar; renders with rich on a terminal, prints nothing otherwise."""
    if not sys.stderr.isatty():
        yield _Bar()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        yield _Bar(progress, progress.add_task(label, total=total))
