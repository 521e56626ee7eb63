"""Deleting published outbox rows older than the retention window, in short chunks."""

from __future__ import annotations

from outboxkit.outbox.purge import DEFAULT_PACING, Pacing, delete_in_chunks
from outboxkit.outbox.tables import outbox_events
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker


async def delete_published(
    engine: AsyncEngine, retention_ms: int, chunk: int, *, pacing: Pacing = DEFAULT_PACING
) -> int:
    """Delete published rows older than ``retention_ms``, at most ``chunk`` per transaction
    (sized to ``pacing``'s target time); return how many.

    A chunk reads the oldest published rows along ``ix_outbox_events_published`` and deletes
    them by id; unpublished, parked and scheduled rows have no ``published_ms`` and are never
    read. The space of the deleted rows is made reusable by autovacuum, which migration
    ``0017_outbox_autovacuum`` starts after 10,000 dead rows whatever the table's size.
    """
    published = outbox_events.c.published_ms
    return await delete_in_chunks(
        async_sessionmaker(engine),
        outbox_events,
        lambda now: published.is_not(None) & (published < now - retention_ms),
        chunk_size=chunk,
        order_by=published,
        skip_locked=False,  # published rows are never locked by anyone else
        pacing=pacing,
    )
