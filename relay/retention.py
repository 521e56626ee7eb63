"""Deleting published outbox rows older than the retention window, in short chunks, and
making their space reusable at once."""

from __future__ import annotations

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.purge import DEFAULT_PACING, Pacing, delete_in_chunks
from outboxkit.outbox.tables import outbox_events
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

VACUUM_AFTER = 10_000
"""Rows a pass must delete before the relay vacuums the outbox (:func:`delete_published`)."""


async def delete_published(
    engine: AsyncEngine,
    retention_ms: int,
    chunk: int,
    *,
    vacuum_after: int | None = VACUUM_AFTER,
    pacing: Pacing = DEFAULT_PACING,
) -> int:
    """Delete published rows older than ``retention_ms``, at most ``chunk`` per transaction
    (sized to ``pacing``'s target time); return how many.

    A chunk reads the oldest published rows along ``ix_outbox_events_published`` and deletes
    them by id; unpublished, parked and scheduled rows have no ``published_ms`` and are never
    read. After a pass that deleted at least ``vacuum_after`` rows (``None``: never), a plain
    ``VACUUM`` of the outbox (PostgreSQL; it blocks no reads or writes, and skips the table if
    another vacuum holds it) makes their space reusable for the next inserts instead of
    leaving it to autovacuum, which may come minutes later.
    """
    published = outbox_events.c.published_ms
    deleted = await delete_in_chunks(
        async_sessionmaker(engine),
        outbox_events,
        lambda now: published.is_not(None) & (published < now - retention_ms),
        chunk_size=chunk,
        order_by=published,
        skip_locked=False,  # published rows are never locked by anyone else
        pacing=pacing,
    )
    if vacuum_after is not None and deleted >= vacuum_after:
        await vacuum_outbox(engine)
    return deleted


async def vacuum_outbox(engine: AsyncEngine) -> None:
    """``VACUUM (SKIP_LOCKED)`` the outbox where the database vacuums (a no-op on SQLite)."""
    if not dialect_of(engine).autovacuum:
        return
    async with engine.connect() as connection:
        autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.exec_driver_sql(f"VACUUM (SKIP_LOCKED) {outbox_events.name}")
