"""Deleting published outbox rows older than the retention window, in bounded chunks."""

from __future__ import annotations

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.tables import outbox_events
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine


async def delete_published(engine: AsyncEngine, retention_ms: int, chunk: int) -> int:
    """Delete published rows older than ``retention_ms``, ``chunk`` per transaction.

    Short transactions keep locks and WAL bursts small while millions of rows go. The ids are
    read first: PostgreSQL may evaluate a volatile-clock ``IN (SELECT ... LIMIT n)`` more than
    once, which would let one chunk delete more than ``n`` rows.
    """
    now = dialect_of(engine).now_ms()
    oldest = (
        select(outbox_events.c.id)
        .where(
            outbox_events.c.published_ms.is_not(None),
            outbox_events.c.published_ms < now - retention_ms,
        )
        .limit(chunk)
    )
    total = 0
    while True:
        async with engine.begin() as conn:
            ids = (await conn.execute(oldest)).scalars().all()
            if ids:
                await conn.execute(delete(outbox_events).where(outbox_events.c.id.in_(ids)))
        total += len(ids)
        if len(ids) < chunk:
            return total
