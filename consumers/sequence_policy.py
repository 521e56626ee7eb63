"""The vocabulary of dead letters that keep the order (:mod:`.sequences`), and its defaults."""

from __future__ import annotations

from typing import Final, Literal

OnDeadLetter = Literal["continue", "sequence"]
"""``"continue"``: later records of a dead-lettered record's key are applied as they come (the
default); ``"sequence"``: they wait, held, behind it."""
OnHoldFull = Literal["stop", "dead-letter"]
"""Past the bound of held records: ``"stop"`` the partition waits; ``"dead-letter"`` the record
is dead-lettered (in order) and the key stays blocked."""

ON_DEAD_LETTER: Final = ("continue", "sequence")
ON_HOLD_FULL: Final = ("stop", "dead-letter")
DEFAULT_MAX_HELD_PER_KEY: Final = 10_000
DEFAULT_MAX_HELD: Final = 100_000
