"""Deleting expired operations (and, on request, old audit rows) in short chunks.

Only records in a state that may expire are deleted (SUCCEEDED, FAILED_FINAL, PENDING); RUNNING
and UNKNOWN ones never expire, since forgetting them could let the action run twice. The audit
trail of a deleted operation stays until :func:`purge_audit` removes it by age.
"""

from __future__ import annotations

from typing import Any, cast

from outboxkit.actions.states import REPLACEABLE
from outboxkit.actions.tables import agent_operation_audit, agent_operations
from outboxkit.outbox.clock import db_now_ms
from sqlalchemy import CursorResult, delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


async def purge_expired(
    sessions: async_sessionmaker[AsyncSession],
    *,
    chunk_size: int = 500,
    max_chunks: int | None = None,
) -> int:
    """Delete expired operations, ``chunk_size`` rows per transaction; return how many."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    ops = agent_operations
    total = 0
    chunks = 0
    while max_chunks is None or chunks < max_chunks:
        async with sessions() as session, session.begin():
            now = db_now_ms(session.get_bind().dialect.name)
            expired = (ops.c.expires_ms <= now) & ops.c.state.in_([s.value for s in REPLACEABLE])
            # Ids first, then the delete: PostgreSQL may re-run an IN (... LIMIT ... SKIP
            # LOCKED) subquery per row and so delete more than one chunk in one statement.
            ids = (
                await session.scalars(
                    select(ops.c.id)
                    .where(expired)
                    .order_by(ops.c.id)
                    .limit(chunk_size)
                    .with_for_update(skip_locked=True)  # ignored on SQLite, whose writers queue
                )
            ).all()
            if ids:
                result = await session.execute(delete(ops).where(ops.c.id.in_(ids), expired))
                total += cast("CursorResult[Any]", result).rowcount
        chunks += 1
        if len(ids) < chunk_size:
            break
    return total


async def purge_audit(
    sessions: async_sessionmaker[AsyncSession],
    *,
    older_than_s: float,
    chunk_size: int = 1000,
    max_chunks: int | None = None,
) -> int:
    """Delete audit rows older than ``older_than_s`` seconds (by the database clock), in chunks."""
    if chunk_size < 1 or not older_than_s >= 0:
        raise ValueError("chunk_size must be at least 1 and older_than_s not negative")
    older_than_ms = round(older_than_s * 1000)
    audit = agent_operation_audit
    total = 0
    chunks = 0
    while max_chunks is None or chunks < max_chunks:
        async with sessions() as session, session.begin():
            now = db_now_ms(session.get_bind().dialect.name)
            old = audit.c.at_ms <= now - older_than_ms
            ids = (
                await session.scalars(
                    select(audit.c.id).where(old).order_by(audit.c.id).limit(chunk_size)
                )
            ).all()
            if ids:
                result = await session.execute(delete(audit).where(audit.c.id.in_(ids)))
                total += cast("CursorResult[Any]", result).rowcount
        chunks += 1
        if len(ids) < chunk_size:
            break
    return total
