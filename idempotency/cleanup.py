"""Deleting expired idempotency keys in short chunks (``outboxkit idempotency purge``).

A key is deleted once it expired, unless it is still in progress under a live lease (a request
running across its key's expiry keeps its claim until it finishes or its lease ends).
"""

from __future__ import annotations

from typing import Any, cast

from outboxkit.idempotency.tables import COMPLETED, http_idempotency_keys
from outboxkit.outbox.clock import db_now_ms
from sqlalchemy import CursorResult, delete, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


async def purge_expired(
    sessions: async_sessionmaker[AsyncSession],
    *,
    chunk_size: int = 1000,
    max_chunks: int | None = None,
) -> int:
    """Delete expired keys, ``chunk_size`` rows per transaction; return how many."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    keys = http_idempotency_keys
    total = 0
    chunks = 0
    while max_chunks is None or chunks < max_chunks:
        async with sessions() as session, session.begin():
            now = db_now_ms(session.get_bind().dialect.name)
            expired = (keys.c.expires_ms <= now) & or_(
                keys.c.state == COMPLETED, keys.c.lease_expires_ms <= now
            )
            ids = (
                await session.scalars(
                    select(keys.c.id)
                    .where(expired)
                    .order_by(keys.c.id)
                    .limit(chunk_size)
                    .with_for_update(skip_locked=True)  # ignored on SQLite, whose writers queue
                )
            ).all()
            if ids:
                result = await session.execute(delete(keys).where(keys.c.id.in_(ids), expired))
                total += cast("CursorResult[Any]", result).rowcount
        chunks += 1
        if len(ids) < chunk_size:
            break
    return total
