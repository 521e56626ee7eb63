"""Deleting expired idempotency keys in short chunks (``outboxkit idempotency purge``).

A key is deleted once it expired, unless it is still in progress under a live lease (a request
running across its key's expiry keeps its claim until it finishes or its lease ends).
"""

from __future__ import annotations

from outboxkit.idempotency.tables import COMPLETED, http_idempotency_keys
from outboxkit.outbox.purge import delete_in_chunks
from sqlalchemy import or_
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


async def purge_expired(
    sessions: async_sessionmaker[AsyncSession],
    *,
    chunk_size: int = 1000,
    max_chunks: int | None = None,
) -> int:
    """Delete expired keys, ``chunk_size`` rows per transaction; return how many."""
    keys = http_idempotency_keys
    return await delete_in_chunks(
        sessions,
        keys,
        lambda now: (
            (keys.c.expires_ms <= now)
            & or_(keys.c.state == COMPLETED, keys.c.lease_expires_ms <= now)
        ),
        chunk_size=chunk_size,
        max_chunks=max_chunks,
    )
