"""Deleting rows in short chunks, by a condition on the database clock: the one loop behind
the cleanups of expired agent operations, their audit trail and HTTP idempotency keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from outboxkit.outbox.dialects import dialect_of
from sqlalchemy import ColumnElement, CursorResult, Table, delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


async def delete_in_chunks(
    sessions: async_sessionmaker[AsyncSession],
    table: Table,
    condition: Callable[[ColumnElement[Any]], ColumnElement[bool]],
    *,
    chunk_size: int,
    max_chunks: int | None = None,
) -> int:
    """Delete the rows of ``table`` that ``condition(now)`` selects (``now``: the database
    clock in epoch ms), ``chunk_size`` per transaction, oldest id first; return how many.

    The ids are read first, then deleted with the condition checked again: PostgreSQL may
    re-run an ``IN (... LIMIT ... SKIP LOCKED)`` subquery per row and so delete more than one
    chunk in one statement. Rows locked by another transaction are skipped (PostgreSQL;
    SQLite's writers queue instead).
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    total = 0
    chunks = 0
    while max_chunks is None or chunks < max_chunks:
        async with sessions() as session, session.begin():
            dialect = dialect_of(session)
            selected = condition(dialect.now_ms())
            oldest = select(table.c.id).where(selected).order_by(table.c.id).limit(chunk_size)
            ids = (await session.scalars(dialect.claim_skip_locked(oldest))).all()
            if ids:
                result = await session.execute(delete(table).where(table.c.id.in_(ids), selected))
                total += cast("CursorResult[Any]", result).rowcount
        chunks += 1
        if len(ids) < chunk_size:
            break
    return total
