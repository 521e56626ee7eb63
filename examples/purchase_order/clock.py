"""A business clock that can be moved forward: days of waiting in a second of demo or test."""

from __future__ import annotations

import time


class BusinessClock:
    """Seconds since the epoch, starting now, moved on by :meth:`advance`.

    Pass the instance as the engine's ``clock=`` and the supplier's ``clock=``: deadlines,
    reminders and quote expiry then all follow it.
    """

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` on; returns the new time."""
        self._now += seconds
        return self._now
