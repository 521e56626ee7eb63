"""Progress of long work on stderr: a rich bar (or spinner) on a terminal, plain lines when
stderr is not one (a log file, CI), at most one every :data:`PLAIN_EVERY_S` seconds.

stdout stays the command's result (a summary, ``--json``); progress never goes there.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

PLAIN_EVERY_S = 5.0


class ProgressReport:
    """``update(done, total)`` as the work goes on, ``close()`` at the end.

    Disabled (``enabled=False``, e.g. with ``--json``) it shows nothing. On a terminal it is a
    rich bar; otherwise a plain ``label: done of total`` line once ``every_s`` seconds have
    passed, then at most every ``every_s`` seconds, and one at the end if any was printed
    (work done within ``every_s`` prints nothing).
    """

    def __init__(
        self,
        label: str,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        every_s: float = PLAIN_EVERY_S,
    ) -> None:
        self.label = label
        self._stream = stream or sys.stderr
        self._enabled = enabled
        self._every_s = every_s
        self._rich: Progress | None = None
        self._task: Any = None
        self._began = time.monotonic()
        self._last_plain: float | None = None
        self._last: tuple[int, int | None] | None = None
        if enabled and self._stream.isatty():
            self._rich = Progress(
                TextColumn(label),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self._stream),
                transient=True,
            )

    def update(self, done: int, total: int | None) -> None:
        """Report ``done`` of ``total`` (``None``: not known)."""
        if not self._enabled:
            return
        self._last = (done, total)
        if self._rich is not None:
            if self._task is None:
                self._rich.start()
                self._task = self._rich.add_task(self.label, total=total)
            self._rich.update(self._task, completed=done, total=total)
            return
        now = time.monotonic()
        if now - (self._last_plain or self._began) >= self._every_s:
            self._plain(done, total)
            self._last_plain = now

    def close(self) -> None:
        """End the display: the bar goes away; plain mode prints the last figures once more."""
        if self._rich is not None and self._task is not None:
            self._rich.stop()
        elif self._last_plain is not None and self._last is not None:
            self._plain(*self._last)

    def _plain(self, done: int, total: int | None) -> None:
        of = f" of {total}" if total is not None else ""
        print(f"{self.label}: {done}{of}", file=self._stream, flush=True)


@contextlib.contextmanager
def progress_note(label: str, *, enabled: bool = True) -> Iterator[None]:
    """A spinner with the time elapsed while one long step runs (one SQL statement, say), on
    a terminal only: without a terminal the command's result line says all there is."""
    if not enabled or not sys.stderr.isatty():
        yield
        return
    spinner = Progress(
        SpinnerColumn(),
        TextColumn(label),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with spinner:
        spinner.add_task(label, total=None)
        yield
