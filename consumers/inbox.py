"""The inbox: claim an event for a consumer once, and forget claims older than a window.

A claim is an ``INSERT ... ON CONFLICT DO NOTHING`` of ``(consumer, source, event_id)`` in the
transaction that applies the event's effect, so the claim and the effect commit or roll back
together. A claim that inserts nothing means the event was applied before: it is skipped.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Insert, delete, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from consumers.tables import inbox_events
from outbox.clock import db_now_ms
from outbox.errors import UnsupportedDatabaseError

DEFAULT_RETENTION = timedelta(days=7)
DEFAULT_PURGE_CHUNK = 5_000

_DIALECT_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


def claim_statement(dialect_name: str, consumer: str, source: str, event_id: str) -> Insert:
    """The idempotent INSERT of one inbox row; it returns a row only when it inserted one."""
    try:
        dialect_insert = _DIALECT_INSERTS[dialect_name]
    except KeyError:
        raise UnsupportedDatabaseError(
            f"outboxkit supports postgresql and sqlite, not {dialect_name!r}"
        ) from None
    return (
        dialect_insert(inbox_events)
        .values(
            consumer=consumer,
            source=source,
            event_id=event_id,
            processed_ms=db_now_ms(dialect_name),
        )
        .on_conflict_do_nothing(index_elements=["consumer", "source", "event_id"])
        .returning(inbox_events.c.processed_ms)
    )


async def claim(session: AsyncSession, consumer: str, source: str, event_id: str) -> bool:
    """Record ``(source, event_id)`` as applied by ``consumer`` in the session's transaction.

    Returns ``False`` when it was already recorded, i.e. the event is a duplicate.
    """
    statement = claim_statement(session.get_bind().dialect.name, consumer, source, event_id)
    return (await session.execute(statement)).first() is not None


async def purge_inbox(
    engine: AsyncEngine,
    *,
    consumer: str | None = None,
    older_than: timedelta = DEFAULT_RETENTION,
    chunk_size: int = DEFAULT_PURGE_CHUNK,
) -> int:
    """Delete inbox rows processed more than ``older_than`` ago; return how many went.

    It deletes at most ``chunk_size`` rows per transaction, so it never holds long locks.
    ``consumer`` limits it to one consumer's rows. The cut-off comes from the database clock.
    A redelivery of an event whose row was purged is applied again: keep the window longer
    than any redelivery you expect (consumer lag, replays from the dead-letter topic).
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    window_ms = int(older_than.total_seconds() * 1000)
    columns = inbox_events.c
    key = tuple_(columns.consumer, columns.source, columns.event_id)
    removed = 0
    while True:
        async with engine.begin() as connection:
            cutoff = db_now_ms(connection.dialect.name) - window_ms
            oldest = select(columns.consumer, columns.source, columns.event_id).where(
                columns.processed_ms < cutoff
            )
            if consumer is not None:
                oldest = oldest.where(columns.consumer == consumer)
            oldest = oldest.order_by(columns.processed_ms).limit(chunk_size)
            result = await connection.execute(delete(inbox_events).where(key.in_(oldest)))
        count = result.rowcount or 0
        removed += count
        if count < chunk_size:
            return removed
