"""One log line per change of a dependency's state, not one per failed attempt (the relay's
database and broker, a consumer waiting for its dependencies to start)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from outboxkit.outbox.secrecy import describe_error


class DependencyHealth:
    """Tracks whether a dependency (database, Kafka) works and logs only the transitions:
    the first failure, each change of its cause (a rejected password after an outage, say),
    and the recovery."""

    def __init__(
        self,
        name: str,
        on_change: Callable[[bool, str], None] | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self.name = name
        self._log = log or logging.getLogger("outboxkit")
        self.failures = 0
        self.cause: str | None = None
        self._on_change = on_change  # told (ok, error class) after every attempt: readiness

    @property
    def healthy(self) -> bool:
        """True while the last attempt succeeded."""
        return self.failures == 0

    def failed(self, error: BaseException) -> int:
        """Record a failure; return how many happened in a row."""
        self.failures += 1
        if self._on_change is not None:
            self._on_change(False, type(error).__name__)
        cause = describe_error(error, with_class=True)
        if cause != self.cause:
            self.cause = cause
            self._log.warning("%s unavailable: %s; retrying", self.name, cause)
        return self.failures

    def succeeded(self) -> None:
        """Record a success; logs recovery after failures."""
        if self._on_change is not None:
            self._on_change(True, "")
        if self.failures:
            self._log.info("%s available again after %d failed attempts", self.name, self.failures)
        self.failures = 0
        self.cause = None
