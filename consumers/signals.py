"""SIGTERM and SIGINT as a stop request, recorded from the first moment of a command.

A long-running command installs :class:`StopSignals` before anything else (loading the app,
connecting), so a signal that arrives while it starts up is a request to stop like any other:
the command then exits cleanly instead of being killed by the default action. Callbacks run in
the signal handler (the main thread, between two bytecodes): they must only set flags or use
``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Records SIGTERM/SIGINT once :meth:`install` ran; ``requested`` tells whether one came."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._callbacks: list[Callable[[], None]] = []

    def install(self) -> StopSignals:
        """Handle SIGTERM and SIGINT from now on (main thread only); returns ``self``."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)
        return self

    @property
    def requested(self) -> bool:
        """Whether a stop signal arrived."""
        return self.event.is_set()

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on every stop signal (at once if one already came)."""
        self._callbacks.append(callback)
        if self.requested:
            callback()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()
        for callback in list(self._callbacks):
            callback()
