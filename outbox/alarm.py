"""A condition a long-running process watches in itself (a stalled relay, a lagging slot, a
stuck consumer group): one log line when it starts, one when it clears, and ``/readyz`` not
ready meanwhile, naming it (docs/observability.md#stalls)."""

from __future__ import annotations

import logging
import time

from outboxkit.outbox.readiness import Readiness


class Alarm:
    """On or off, with the reason it is on; :meth:`update` after every check."""

    def __init__(self, name: str, readiness: Readiness, log: logging.Logger) -> None:
        self.name = name
        self.reason: str | None = None
        self._readiness = readiness
        self._log = log
        self._since: float | None = None

    @property
    def on(self) -> bool:
        """True while the condition holds."""
        return self.reason is not None

    def update(self, reason: str | None) -> None:
        """The condition holds for ``reason`` (one line, no secret), or no longer (``None``).
        Logs the start (WARNING) and the end (INFO) only; ``/readyz`` names the latest reason."""
        if reason is not None and self.reason is None:
            self._since = time.monotonic()
            self._log.warning("%s: %s", self.name, reason)
        elif reason is None and self.reason is not None:
            lasted = time.monotonic() - (self._since or time.monotonic())
            self._log.info("%s cleared after %.0f s", self.name, lasted)
        self.reason = reason
        self._readiness.mark_problem(self.name, reason)
