"""The one retry policy of outboxkit: bounded attempts, capped backoff with full jitter, and a
budget of total time. Consumers use it per record, agent actions per operation."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from outboxkit.outbox.backoff import Backoff


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how often a failed piece of work is tried again.

    The delay before attempt ``n + 1`` comes from ``backoff`` (full jitter, so instances failing
    together do not retry in lockstep). The work is given up after ``max_attempts`` attempts in
    all, or when the next attempt would start more than ``max_elapsed_s`` seconds after the
    first failure.
    """

    max_attempts: int = 5
    backoff: Backoff = field(default_factory=lambda: Backoff(base_s=0.2, cap_s=10.0))
    max_elapsed_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.max_elapsed_s < 0 or self.backoff.base_s < 0 or self.backoff.cap_s < 0:
            raise ValueError("delays must not be negative")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """A full-jitter delay in seconds after ``failures`` failed attempts."""
        return self.backoff.delay(min(failures, 64), rng)

    def next_delay(
        self, failures: int, elapsed_s: float, rng: random.Random | None = None
    ) -> float | None:
        """The delay before the next attempt, or ``None`` when the work is exhausted.

        ``failures`` counts the attempts that failed so far; ``elapsed_s`` is the time in seconds
        since the first failure.
        """
        if failures >= self.max_attempts:
            return None
        wait = self.delay(failures, rng)
        if elapsed_s + wait > self.max_elapsed_s:
            return None
        return wait
