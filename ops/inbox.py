"""Looking an event up in the inbox: which consumers applied ``(source, id)``, and when."""

from __future__ import annotations

from dataclasses import dataclass

from outboxkit.consumers.tables import inbox_events
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass(frozen=True, slots=True)
class Applied:
    """One consumer applied the event at ``processed_ms`` (epoch ms, database clock)."""

    consumer: str
    processed_ms: int


async def lookup(engine: AsyncEngine, source: str, event_id: str) -> list[Applied]:
    """The consumers that applied the event, first applier first; empty: not seen."""
    columns = inbox_events.c
    query = (
        select(columns.consumer, columns.processed_ms)
        .where(columns.source == source, columns.event_id == event_id)
        .order_by(columns.processed_ms, columns.consumer)
    )
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).all()
    return [Applied(row.consumer, row.processed_ms) for row in rows]
