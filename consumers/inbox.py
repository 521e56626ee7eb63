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

from outboxkit.consumers.inbox_partitions import purge_partitioned, width_ms
from outboxkit.consumers.tables import inbox_events, inbox_events_unpartitioned
from outboxkit.outbox.dialects import DIALECTS, POSTGRESQL, Dialect, dialect_of
from outboxkit.outbox.id_time import id_time_ms
from sqlalchemy import BigInteger, Insert, Select, String, bindparam, delete, func, select, tuple_
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

log = logging.getLogger("outboxkit.consumer")

DEFAULT_RETENTION_S = 7 * 24 * 3600.0
DEFAULT_PURGE_CHUNK = 5_000
# Keys per claim statement, by database (the dialects' ``claim_chunk``).
CLAIM_CHUNK = {name: dialect.claim_chunk for name, dialect in DIALECTS.items()}

Key = tuple[str, str]
_KEY = ["consumer", "source", "event_id"]


def inbox_key(dialect: Dialect) -> list[str]:
    """The inbox's unique key on ``dialect``: ``(consumer, source, event_id)``, and ``id_ms`` (a
    function of ``event_id``) where the table is partitioned by it."""
    return [*_KEY, "id_ms"] if dialect.time_partitions else list(_KEY)


async def claim(session: AsyncSession, consumer: str, source: str, event_id: str) -> bool:
    """Record ``(source, event_id)`` as applied by ``consumer`` in the session's transaction.

    Returns ``False`` when it was already recorded, i.e. the event is a duplicate.
    """
    return bool(await claim_many(session, consumer, [(source, event_id)]))


def claim_many_statement(dialect_name: str, consumer: str, keys: Sequence[Key]) -> Insert:
    """One multi-row INSERT of an inbox row per key (a VALUES list), returning ``(source,
    event_id)`` of each row inserted: :func:`claim_many` on a database without array
    parameters (SQLite). PostgreSQL runs :func:`postgres_claim`."""
    dialect = dialect_of(dialect_name)
    now = dialect.now_ms()
    rows = [
        {
            "consumer": consumer,
            "source": source,
            "event_id": event_id,
            "processed_ms": now,
            "id_ms": id_time_ms(event_id),
        }
        for source, event_id in keys
    ]
    statement: Insert = (
        dialect.insert(inbox_events)
        .values(rows)
        .on_conflict_do_nothing(index_elements=inbox_key(dialect))
        .returning(inbox_events.c.source, inbox_events.c.event_id)
    )
    return statement


@functools.cache
def postgres_claim() -> Select[Sequence[Any], Sequence[Any]]:
    """The claim of many keys on PostgreSQL, built once: the consumer and the keys are
    parameters (``consumer``, ``sources``, ``ids``, ``id_ms``: three arrays, so the statement's
    text is the same for any number of keys and stays prepared), and the keys inserted come
    back as one row of two arrays (``NULL`` when none was), not a row per key.

    A key claimed in ``inbox_events_unpartitioned`` (the inbox from before partitions, which
    no claim goes into) counts as claimed: it is not inserted again.
    """
    consumer = bindparam("consumer", type_=String)
    keys = (
        func.unnest(
            bindparam("sources", type_=postgresql.ARRAY(String)),
            bindparam("ids", type_=postgresql.ARRAY(String)),
            bindparam("id_ms", type_=postgresql.ARRAY(BigInteger)),
        )
        .table_valued("source", "event_id", "id_ms")
        .render_derived(name="claimed")
    )
    old = inbox_events_unpartitioned.c
    claimed_before = (
        select(old.consumer)
        .where(old.consumer == consumer, old.source == keys.c.source)
        .where(old.event_id == keys.c.event_id)
        .exists()
    )
    chosen = select(
        consumer, keys.c.source, keys.c.event_id, POSTGRESQL.now_ms(), keys.c.id_ms
    ).where(~claimed_before)
    columns = inbox_events.c
    inserted = (
        postgresql.insert(inbox_events)
        .from_select(["consumer", "source", "event_id", "processed_ms", "id_ms"], chosen)
        .on_conflict_do_nothing(index_elements=inbox_key(POSTGRESQL))
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
                "id_ms": [id_time_ms(key[1]) for key in chunk],
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
    ahead_s: float | None = None,
) -> int:
    """Forget inbox claims made more than ``older_than_s`` seconds ago; return how many went.

    ``consumer`` limits it to one consumer's claims. The cut-off comes from the database clock.
    On PostgreSQL whole partitions go (:mod:`outboxkit.consumers.inbox_partitions`): their
    claims still inside their consumer's window move to the default partition first; with
    ``ahead_s`` (and ``consumer``) the pass also records the consumer's window and attaches the
    partitions of the next ``ahead_s`` seconds, as a runtime's retention does. Elsewhere, and
    in the partitions that cannot be dropped, at most ``chunk_size`` claims go per transaction.
    A redelivery of an event whose claim was forgotten is applied again: keep the window longer
    than any redelivery you expect (consumer lag, replays from the dead-letter topic).
    """
    if chunk_size < 1 or older_than_s < 0 or (ahead_s is not None and ahead_s <= 0):
        raise ValueError(
            "chunk_size must be at least 1, older_than_s not negative, ahead_s positive"
        )
    window_ms = int(older_than_s * 1000)
    if dialect_of(engine).time_partitions:
        done = await purge_partitioned(
            engine,
            consumer=consumer,
            window_ms=window_ms,
            chunk_size=chunk_size,
            ahead_ms=None if ahead_s is None else int(ahead_s * 1000),
        )
        return done.removed
    return await _delete_old_claims(engine, consumer, window_ms, chunk_size)


async def _delete_old_claims(
    engine: AsyncEngine, consumer: str | None, window_ms: int, chunk_size: int
) -> int:
    """The unpartitioned inbox (SQLite): delete old claims ``chunk_size`` per transaction."""
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


def partitions_ahead_s(retention_s: float, interval_s: float) -> float:
    """How far ahead a retention pass every ``interval_s`` attaches the inbox's partitions:
    three intervals, and at least two partitions."""
    return max(2 * width_ms(int(retention_s * 1000)) / 1000, 3 * interval_s)


async def retain_inbox(
    engine: AsyncEngine, *, consumer: str, retention_s: float, interval_s: float
) -> None:
    """Forget ``consumer``'s claims older than ``retention_s`` every ``interval_s``, until
    cancelled. On PostgreSQL each pass also attaches the inbox's partitions ahead, for three
    intervals and at least two partitions (:func:`partitions_ahead_s`).

    A failed pass is logged once (not on every attempt) and tried again at the next interval.
    """
    ahead_s = partitions_ahead_s(retention_s, interval_s)
    failing = False
    while True:
        try:
            removed = await purge_inbox(
                engine, consumer=consumer, older_than_s=retention_s, ahead_s=ahead_s
            )
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
