"""Capped exponential backoff with full jitter, used by every retry loop in outboxkit."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before retry ``attempt`` (1-based): uniform in ``[0, min(cap, base * 2**(n-1))]``.

    Full jitter spreads the retries of many processes after a shared outage (AWS architecture
    blog, "Exponential Backoff and Jitter"). ``floor`` keeps a minimum pause so a tight loop
    cannot spin on a dead dependency.
    """

    base_s: float = 0.1
    cap_s: float = 30.0
    floor_s: float = 0.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Return the delay in seconds before retry number ``attempt``."""
        ceiling = min(self.cap_s, self.base_s * 2 ** max(0, attempt - 1))
        return max(self.floor_s, (rng or random).uniform(0, ceiling))
