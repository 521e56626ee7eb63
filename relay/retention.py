"""Deleting published outbox rows older than the retention window, in bounded chunks."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from outbox.clock import db_now_ms
from outbox.tables import outbox_events


async def delete_published(engine: AsyncEngine, retention_ms: int, chunk: int) -> int:
    """Delete published rows older than ``retention_ms``, ``chunk`` per transaction.

    Short transactions keep locks and WAL bursts small while millions of rows go.
    """
    now = db_now_ms(engine.dialect.name)
    total = 0
    while True:
        oldest = (
            select(outbox_events.c.id)
            .where(
                outbox_events.c.published_ms.is_not(None),
                outbox_events.c.published_ms < now - retention_ms,
            )
            .limit(chunk)
            .scalar_subquery()
        )
        async with engine.begin() as conn:
            deleted = (
                await conn.execute(delete(outbox_events).where(outbox_events.c.id.in_(oldest)))
            ).rowcount
        total += deleted
        if deleted < chunk:
            return total
