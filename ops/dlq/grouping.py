"""Dead letters counted per failure cause, for ``dlq list --group`` and any script or report.

A cause is a :mod:`fingerprint <outboxkit.ops.dlq.fingerprint>`: the error class and the message
with its values stripped, so ``order 17 exceeds limit`` and ``order 42 exceeds limit`` count
together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from outboxkit.ops.dlq.fingerprint import normalise
from outboxkit.ops.dlq.reader import DlqRecord
from outboxkit.outbox.jsonable import as_json


@dataclass(kw_only=True)
class FailureGroup:
    """Dead letters of one failure cause: how many, when, from which topics, and one example."""

    fingerprint: str
    """:attr:`DlqRecord.fingerprint_id` of its records."""
    error_class: str | None
    pattern: str
    """The normalised message."""
    count: int = 0
    first_ms: int
    """Dead-lettering time of the earliest record (epoch ms)."""
    last_ms: int
    original_topics: set[str] = field(default_factory=set)
    example: DlqRecord

    @classmethod
    def starting_with(cls, example: DlqRecord) -> FailureGroup:
        """An empty group for ``example``'s cause (``add`` counts it)."""
        return cls(
            fingerprint=example.fingerprint_id,
            error_class=example.letter.error_class,
            pattern=normalise(example.letter.error_message),
            example=example,
            first_ms=example.timestamp,
            last_ms=example.timestamp,
        )

    def add(self, record: DlqRecord) -> None:
        """Count ``record``, which has this group's cause."""
        self.count += 1
        self.first_ms = min(self.first_ms, record.timestamp)
        self.last_ms = max(self.last_ms, record.timestamp)
        if record.letter.topic:
            self.original_topics.add(record.letter.topic)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready values; the example as its position in the dead-letter topic."""
        position = {"partition": self.example.partition, "offset": self.example.offset}
        return as_json(self, omit={"example"}, extra={"example": position})


class FailureGroups:
    """Counts records into one :class:`FailureGroup` per cause as they are read."""

    def __init__(self) -> None:
        self._groups: dict[str, FailureGroup] = {}

    def add(self, record: DlqRecord) -> None:
        """Count ``record`` in the group of its cause."""
        group = self._groups.get(record.fingerprint)
        if group is None:
            group = self._groups[record.fingerprint] = FailureGroup.starting_with(record)
        group.add(record)

    def ordered(self) -> list[FailureGroup]:
        """The groups, largest first; equal counts by their earliest record."""
        return sorted(self._groups.values(), key=lambda g: (-g.count, g.first_ms))


def group_by_cause(records: Iterable[DlqRecord]) -> list[FailureGroup]:
    """``records`` counted per cause, largest group first."""
    groups = FailureGroups()
    for record in records:
        groups.add(record)
    return groups.ordered()


HOUR_MS = 3_600_000


class Tallies:
    """Counts of dead letters by event type, original topic and hour dead-lettered (UTC), the
    other ways the console groups them besides their cause."""

    def __init__(self) -> None:
        self.by_type: Counter[str] = Counter()
        self.by_topic: Counter[str] = Counter()
        self.by_hour: Counter[int] = Counter()

    def add(self, record: DlqRecord) -> None:
        """Count ``record``."""
        self.by_type[record.type or "-"] += 1
        self.by_topic[record.letter.topic or "-"] += 1
        self.by_hour[record.timestamp // HOUR_MS * HOUR_MS] += 1
