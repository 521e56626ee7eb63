"""The inbox: claim an event for a consumer once, and forget claims older than a window.

A claim is an ``INSERT ... ON CONFLICT DO NOTHING`` of ``(consumer, source, event_id)`` in the
transaction that applies the event's effect, so the claim and the effect commit or roll back
together. A claim that inserts nothing means the event was applied before: it is skipped.
:func:`claim_many` claims a whole chunk of events in one statement per ``CLAIM_CHUNK`` keys.
:func:`purge_inbox` forgets old claims; :func:`retain_inbox` runs it periodically for a runtime.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Any

from outboxkit.consumers.tables import inbox_events
from outboxkit.outbox.dialects import DIALECTS, POSTGRESQL, dialect_of
from sqlalchemy import Insert, Select, String, bindparam, delete, func, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

log = logging.getLogger("outboxkit.consumer")

DEFAULT_RETENTION_S = 7 * 24 * 3600.0
DEFAULT_PURGE_CHUNK = 5_000
# Keys per claim statement, by database (the dialects' ``claim_chunk``).
CLAIM_CHUNK = {name: dialect.claim_chunk for name, dialect in DIALECTS.items()}

Key = tuple[str, str]
_KEY = ["consumer", "source", "event_id"]


def claim_statement(dialect_name: str, consumer: str, source: str, event_id: str) -> Insert:
    """The idempotent INSERT of one inbox row; it returns a row only when it inserted one."""
    dialect = dialect_of(dialect_name)
    return dialect.insert_or_skip(
        inbox_events, _KEY, returning=[inbox_events.c.processed_ms]
    ).values(consumer=consumer, source=source, event_id=event_id, processed_ms=dialect.now_ms())


async def claim(session: AsyncSession, consumer: str, source: str, event_id: str) -> bool:
    """Record ``(source, event_id)`` as applied by ``consumer`` in the session's transaction.

    Returns ``False`` when it was already recorded, i.e. the event is a duplicate.
    """
    statement = claim_statement(dialect_of(session).name, consumer, source, event_id)
    return (await session.execute(statement)).first() is not None


def claim_many_statement(dialect_name: str, consumer: str, keys: Sequence[Key]) -> Insert:
    """One INSERT of an inbox row per key, returning ``(source, event_id)`` of each row inserted.

    On PostgreSQL the keys travel as two arrays (``unnest``), so the statement text is the same
    for any number of keys and stays prepared; on SQLite they are a multi-row VALUES list.
    :func:`claim_many` uses it on SQLite; on PostgreSQL it runs :func:`postgres_claim` instead.
    """
    dialect = dialect_of(dialect_name)
    columns = inbox_events.c
    statement: postgresql.Insert | sqlite.Insert
    if dialect.array_parameters:
        statement = _postgres_insert(
            bindparam("consumer", consumer, type_=String),
            bindparam("sources", [k[0] for k in keys], type_=postgresql.ARRAY(String)),
            bindparam("ids", [k[1] for k in keys], type_=postgresql.ARRAY(String)),
        )
    else:
        now = dialect.now_ms()
        statement = dialect.insert(inbox_events).values(
            [
                {"consumer": consumer, "source": source, "event_id": event_id, "processed_ms": now}
                for source, event_id in keys
            ]
        )
    return statement.on_conflict_do_nothing(index_elements=_KEY).returning(
        columns.source, columns.event_id
    )


def _postgres_insert(consumer: Any, sources: Any, ids: Any) -> postgresql.Insert:
    """INSERT ... SELECT of one inbox row per element of the arrays ``sources`` and ``ids``."""
    rows = (
        func.unnest(sources, ids).table_valued("source", "event_id").render_derived(name="claimed")
    )
    chosen = select(consumer, rows.c.source, rows.c.event_id, POSTGRESQL.now_ms())
    return postgresql.insert(inbox_events).from_select(
        ["consumer", "source", "event_id", "processed_ms"], chosen
    )


@functools.cache
def postgres_claim() -> Select[Sequence[Any], Sequence[Any]]:
    """:func:`claim_many_statement` for PostgreSQL, built once: the consumer and the keys are
    parameters (``consumer``, ``sources``, ``ids``), and the keys inserted come back as one
    row of two arrays (``NULL`` when none was), not a row per key through SQLAlchemy's row
    processing."""
    columns = inbox_events.c
    inserted = (
        _postgres_insert(
            bindparam("consumer", type_=String),
            bindparam("sources", type_=postgresql.ARRAY(String)),
            bindparam("ids", type_=postgresql.ARRAY(String)),
        )
        .on_conflict_do_nothing(index_elements=_KEY)
        .returning(columns.source, columns.event_id)
        .cte("inserted")
    )
    # Both aggregates read the same rows in the same order: the arrays pair up.
    return select(func.array_agg(inserted.c.source), func.array_agg(inserted.c.event_id))


async def claim_many(session: AsyncSession, consumer: str, keys: Sequence[Key]) -> set[Key]:
    """Record every ``(source, event_id)`` of ``keys`` as applied by ``consumer``, in bulk.

    Returns the keys that were not recorded before, i.e. the events to apply; a key given
    twice is claimed once. Rows are inserted in the order of ``keys``.
    """
    unique = list(dict.fromkeys(keys))
    if not unique:
        return set()
    dialect = dialect_of(session)
    size = dialect.claim_chunk
    fresh: set[Key] = set()
    for start in range(0, len(unique), size):
        chunk = unique[start : start + size]
        if dialect.array_parameters:
            parameters = {
                "consumer": consumer,
                "sources": [key[0] for key in chunk],
                "ids": [key[1] for key in chunk],
            }
            sources, ids = (await session.execute(postgres_claim(), parameters)).one()
            if sources:
                fresh.update(zip(sources, ids, strict=True))
        else:
            statement = claim_many_statement(dialect.name, consumer, chunk)
            fresh.update(
                (source, event_id) for source, event_id in await session.execute(statement)
            )
    return fresh


async def purge_inbox(
    engine: AsyncEngine,
    *,
    consumer: str | None = None,
    older_than_s: float = DEFAULT_RETENTION_S,
    chunk_size: int = DEFAULT_PURGE_CHUNK,
) -> int:
    """Delete inbox rows processed more than ``older_than_s`` seconds ago; return how many went.

    It deletes at most ``chunk_size`` rows per transaction, so it never holds long locks.
    ``consumer`` limits it to one consumer's rows. The cut-off comes from the database clock.
    A redelivery of an event whose row was purged is applied again: keep the window longer
    than any redelivery you expect (consumer lag, replays from the dead-letter topic).
    """
    if chunk_size < 1 or older_than_s < 0:
        raise ValueError("chunk_size must be at least 1 and older_than_s not negative")
    window_ms = int(older_than_s * 1000)
    columns = inbox_events.c
    key = tuple_(columns.consumer, columns.source, columns.event_id)
    removed = 0
    while True:
        async with engine.begin() as connection:
            cutoff = dialect_of(connection).now_ms() - window_ms
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


async def retain_inbox(
    engine: AsyncEngine, *, consumer: str, retention_s: float, interval_s: float
) -> None:
    """Purge ``consumer``'s claims older than ``retention_s`` every ``interval_s``, until cancelled.

    A failed purge is logged once (not on every attempt) and tried again at the next interval.
    """
    failing = False
    while True:
        try:
            removed = await purge_inbox(engine, consumer=consumer, older_than_s=retention_s)
        except Exception as error:
            if not failing:
                failing = True
                log.warning("inbox retention failed (%s); will retry", type(error).__name__)
        else:
            if failing:
                failing = False
                log.info("inbox retention works again")
            if removed:
                log.info("inbox retention removed %d entries", removed)
        await asyncio.sleep(interval_s)
