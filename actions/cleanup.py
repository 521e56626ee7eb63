"""Deleting expired operations (and, on request, old audit rows) in short chunks.

Only records in a state that may expire are deleted (SUCCEEDED, FAILED_FINAL, PENDING); RUNNING
and UNKNOWN ones never expire, since forgetting them could let the action run twice, nor do
requests still awaiting a person's decision (``awaiting_decision``). The audit
trail of a deleted operation stays until :func:`purge_audit` removes it by age.
"""

from __future__ import annotations

from outboxkit.actions.states import REPLACEABLE
from outboxkit.actions.tables import agent_operation_audit, agent_operations
from outboxkit.outbox.purge import delete_in_chunks
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


async def purge_expired(
    sessions: async_sessionmaker[AsyncSession],
    *,
    chunk_size: int = 500,
    max_chunks: int | None = None,
) -> int:
    """Delete expired operations, ``chunk_size`` rows per transaction; return how many."""
    ops = agent_operations
    return await delete_in_chunks(
        sessions,
        ops,
        lambda now: (
            (ops.c.expires_ms <= now)
            & ops.c.state.in_([s.value for s in REPLACEABLE])
            & ops.c.awaiting_decision.is_not(True)
        ),
        chunk_size=chunk_size,
        max_chunks=max_chunks,
    )


async def purge_audit(
    sessions: async_sessionmaker[AsyncSession],
    *,
    older_than_s: float,
    chunk_size: int = 1000,
    max_chunks: int | None = None,
) -> int:
    """Delete audit rows older than ``older_than_s`` seconds (by the database clock), in chunks."""
    if not older_than_s >= 0:
        raise ValueError("older_than_s must not be negative")
    older_than_ms = round(older_than_s * 1000)
    audit = agent_operation_audit
    return await delete_in_chunks(
        sessions,
        audit,
        lambda now: audit.c.at_ms <= now - older_than_ms,
        chunk_size=chunk_size,
        max_chunks=max_chunks,
    )
