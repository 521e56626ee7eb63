"""The inbox table: one row per event a consumer has applied, keyed by ``(consumer, source, id)``.

It lives in :data:`outboxkit.outbox.tables.metadata` beside the outbox tables, and is created by the
migration ``0002_inbox``.
"""

from __future__ import annotations

from outboxkit.outbox.tables import metadata
from sqlalchemy import BigInteger, Column, Index, String, Table

CONSUMER_MAX = 200
SOURCE_MAX = 512
EVENT_ID_MAX = 256

inbox_events = Table(
    "inbox_events",
    metadata,
    Column("consumer", String(CONSUMER_MAX), primary_key=True),
    Column("source", String(SOURCE_MAX), primary_key=True),
    Column("event_id", String(EVENT_ID_MAX), primary_key=True),
    Column("processed_ms", BigInteger, nullable=False),
)

# Retention deletes the oldest rows first.
Index("ix_inbox_events_processed_ms", inbox_events.c.processed_ms)
