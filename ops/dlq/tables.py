"""The replay ledger (which dead-letter records were republished, where, when and by whom) and
the discards (which were set aside, by whom and why).

A row is written only after Kafka acknowledged the republished record; the unique key
``(dlq_topic, dlq_partition, dlq_offset, target_topic)`` makes a second replay of the same
record to the same topic a no-op unless forced. Created by the migration ``0004_dlq_replays``.
"""

from __future__ import annotations

from collections.abc import Mapping

from outboxkit.outbox.tables import metadata
from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Index,
    Integer,
    String,
    Table,
    UniqueConstraint,
    false,
    or_,
)

TOPIC_MAX = 249
REPLAYED_BY_MAX = 128

dlq_replays = Table(
    "dlq_replays",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("dlq_topic", String(TOPIC_MAX), nullable=False),
    Column("dlq_partition", Integer, nullable=False),
    Column("dlq_offset", BigInteger, nullable=False),
    Column("target_topic", String(TOPIC_MAX), nullable=False),
    Column("replayed_ms", BigInteger, nullable=False),
    Column("replayed_by", String(REPLAYED_BY_MAX), nullable=False),
    Column("replay_id", String(36), nullable=False),
    UniqueConstraint(
        "dlq_topic", "dlq_partition", "dlq_offset", "target_topic", name="uq_dlq_replays_record"
    ),
)

Index("ix_dlq_replays_replay_id", dlq_replays.c.replay_id)

REASON_MAX = 1000

dlq_discards = Table(
    "dlq_discards",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("dlq_topic", String(TOPIC_MAX), nullable=False),
    Column("dlq_partition", Integer, nullable=False),
    Column("dlq_offset", BigInteger, nullable=False),
    Column("discarded_ms", BigInteger, nullable=False),
    Column("discarded_by", String(REPLAYED_BY_MAX), nullable=False),
    Column("reason", String(REASON_MAX), nullable=False),
    Column("discard_id", String(36), nullable=False),
    UniqueConstraint("dlq_topic", "dlq_partition", "dlq_offset", name="uq_dlq_discards_record"),
)
"""Dead letters an operator discarded (migration ``0014_dlq_discards``), keyed like
:data:`dlq_replays` by the record's place in its dead-letter topic. The record stays in Kafka;
a row here leaves it out of listings and replays until it is un-discarded (the row deleted)."""

Index("ix_dlq_discards_discard_id", dlq_discards.c.discard_id)


def held_by(table: Table, topic: str, bounds: Mapping[int, tuple[int, int]]) -> ColumnElement[bool]:
    """The rows of ``table`` (:data:`dlq_replays` or :data:`dlq_discards`) about records that
    ``topic`` still holds: ``bounds`` is ``{partition: (first offset, end offset)}``. Served by
    the unique key, which starts with ``(dlq_topic, dlq_partition, dlq_offset)``."""
    columns = table.c
    held = [
        (columns.dlq_partition == p) & (columns.dlq_offset >= first) & (columns.dlq_offset < end)
        for p, (first, end) in bounds.items()
        if end > first
    ]
    return (columns.dlq_topic == topic) & (or_(*held) if held else false())
