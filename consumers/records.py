"""What a handler may know about the Kafka record that carried its event, beside the event.

The CloudEvents Kafka binding keeps the record's key out of the event (a key mapping must not
modify the event or add an attribute), so a handler that needs the key, or where the record
sits, asks for a :class:`KafkaRecord` parameter instead of reading an attribute.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """Metadata of the record an event arrived in: never part of the event itself.

    ``key`` is the record's key as sent (``None`` when it has none); ``timestamp`` is the
    record's Kafka timestamp (``None`` when the broker reports none); ``headers`` are all of
    the record's headers, ``ce_`` ones included, as sent.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    timestamp: datetime | None
    headers: tuple[tuple[str, bytes | None], ...]

    @classmethod
    def of(cls, record: Any) -> KafkaRecord:
        """The metadata of an aiokafka ``ConsumerRecord``."""
        timestamp_ms = record.timestamp
        return cls(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            timestamp=(
                datetime.fromtimestamp(timestamp_ms / 1000, UTC)
                if timestamp_ms is not None and timestamp_ms >= 0
                else None
            ),
            headers=tuple(record.headers or ()),
        )
