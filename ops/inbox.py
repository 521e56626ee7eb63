"""Looking an event up in the inbox: which consumers applied ``(source, id)``, and when."""

from __future__ import annotations

from dataclasses import dataclass

from outboxkit.consumers.tables import inbox_events, inbox_events_unpartitioned
from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.id_time import id_time_ms
from sqlalchemy import select, union_all
from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass(frozen=True, slots=True)
class Applied:
    """One consumer applied the event at ``processed_ms`` (epoch ms, database clock)."""

    consumer: str
    processed_ms: int


async def lookup(engine: AsyncEngine, source: str, event_id: str) -> list[Applied]:
    """The consumers that applied the event, first applier first; empty: not seen.

    On PostgreSQL only the partition of the id's time is read, and the inbox from before
    partitions too (``inbox_events_unpartitioned``)."""
    inbox = inbox_events.c
    applied = select(inbox.consumer, inbox.processed_ms).where(
        inbox.source == source, inbox.event_id == event_id
    )
    if dialect_of(engine).time_partitions:
        old = inbox_events_unpartitioned.c
        before = select(old.consumer, old.processed_ms).where(
            old.source == source, old.event_id == event_id
        )
        found = union_all(applied.where(inbox.id_ms == id_time_ms(event_id)), before).subquery()
    else:
        found = applied.subquery()
    query = select(found.c.consumer, found.c.processed_ms).order_by(
        found.c.processed_ms, found.c.consumer
    )
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).all()
    return [Applied(row.consumer, row.processed_ms) for row in rows]
