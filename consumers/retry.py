"""Capped exponential backoff with full jitter, bounded in attempts and in total time."""

from __future__ import annotations

import random
from dataclasses import dataclass

from outboxkit.outbox.backoff import Backoff


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how often a failed record is tried again.

    The delay before attempt ``n + 1`` is uniform in ``[0, min(max_delay, base_delay * 2**(n-1))]``
    ("full jitter"), so instances failing together do not retry in lockstep. A record is given
    up after ``max_attempts`` attempts in all, or when the next attempt would start more than
    ``max_elapsed`` seconds after its first failure. Keep ``max_elapsed`` well below the
    consumer's ``max_poll_interval_ms`` (default 300 s), or Kafka takes the partitions away.
    """

    max_attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 10.0
    max_elapsed: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0 or self.max_elapsed < 0:
            raise ValueError("delays must not be negative")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """A full-jitter delay after ``failures`` failed attempts (outboxkit.outbox.backoff)."""
        backoff = Backoff(base_s=self.base_delay, cap_s=self.max_delay)
        return backoff.delay(min(failures, 64), rng)

    def next_delay(
        self, failures: int, elapsed: float, rng: random.Random | None = None
    ) -> float | None:
        """The delay before the next attempt, or ``None`` when the record is exhausted.

        ``failures`` counts the attempts that failed so far; ``elapsed`` is the time in seconds
        since the first failure.
        """
        if failures >= self.max_attempts:
            return None
        wait = self.delay(failures, rng)
        if elapsed + wait > self.max_elapsed:
            return None
        return wait
