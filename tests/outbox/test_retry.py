"""The retry policy: bounded in attempts and in total time."""

from __future__ import annotations

import random

from outboxkit.outbox import RetryPolicy
from outboxkit.outbox.backoff import Backoff


def test_retry_policy_is_bounded_in_attempts_and_time() -> None:
    policy = RetryPolicy(
        max_attempts=4, backoff=Backoff(base_s=1.0, cap_s=5.0), max_elapsed_s=100.0
    )
    rng = random.Random(7)
    delays = [policy.delay(n, rng) for n in range(1, 50)]
    assert all(0 <= d <= 5.0 for d in delays)
    assert max(policy.delay(1, rng) for _ in range(200)) <= 1.0
    assert policy.next_delay(3, 0.0) is not None
    assert policy.next_delay(4, 0.0) is None  # attempts exhausted
    assert policy.next_delay(1, 100.5) is None  # total time exhausted
    assert (
        RetryPolicy(backoff=Backoff(base_s=1.0), max_elapsed_s=0.0).next_delay(
            1, 0.0, random.Random(3)
        )
        is None
    )
