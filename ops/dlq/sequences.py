"""Blocked keys of sequence-mode consumers (``on_dead_letter="sequence"``): list, show, resolve.

An operator sees which keys wait behind a dead-lettered head, how many records each holds and
since when, and resolves a head without replaying it: ``skip`` (the head is given up for good)
or ``release`` (the head was dealt with by other means). Either way the consumer that owns the
key's partition then applies the held records in their order (:mod:`outboxkit.consumers.sequences`).
The CLI (``outboxkit dlq sequences``) and the console call these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from outboxkit.consumers.sequences import key_hash
from outboxkit.consumers.tables import consumer_held_events, consumer_sequences
from outboxkit.ops.access import OpsError
from sqlalchemy import Row, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

Resolution = Literal["skipped", "released"]
REASON_MAX = 500
BY_MAX = 128


@dataclass(frozen=True)
class BlockedKey:
    """One blocked (or releasing) key of a consumer, as an operator reads it."""

    consumer: str
    topic: str
    key: str
    partition: int
    state: str
    held: int
    head_source: str | None
    head_event_id: str | None
    head_offset: int | None
    head_error: str | None
    blocked_ms: int
    resolution: str | None
    resolved_by: str | None
    reason: str | None


@dataclass(frozen=True)
class HeldRecord:
    """A record held behind a blocked key (never its payload)."""

    offset: int
    source: str | None
    event_id: str | None
    event_type: str | None
    held_ms: int


@dataclass(frozen=True)
class SequenceSummary:
    """Blocked keys across consumers, for ``status`` and the metrics."""

    blocked_keys: int
    held: int
    oldest_blocked_ms: int | None


def _key_of(row: Row[Any]) -> BlockedKey:
    return BlockedKey(
        consumer=row.consumer,
        topic=row.topic,
        key=row.key_shown,
        partition=row.kafka_partition,
        state=row.state,
        held=row.held,
        head_source=row.head_source,
        head_event_id=row.head_event_id,
        head_offset=row.head_offset,
        head_error=row.head_error,
        blocked_ms=row.blocked_ms,
        resolution=row.resolution,
        resolved_by=row.resolved_by,
        reason=row.reason,
    )


async def list_blocked_keys(
    session: AsyncSession, consumer: str | None = None, limit: int = 1000
) -> list[BlockedKey]:
    """Blocked keys, oldest first (of one consumer, or of all)."""
    table = consumer_sequences.c
    query = select(consumer_sequences).order_by(table.blocked_ms, table.topic).limit(limit)
    if consumer is not None:
        query = query.where(table.consumer == consumer)
    return [_key_of(row) for row in await session.execute(query)]


async def summarize(session: AsyncSession | AsyncConnection) -> SequenceSummary:
    """How many keys are blocked, how many records they hold, and the oldest block."""
    table = consumer_sequences.c
    row = (
        await session.execute(
            select(
                func.count(), func.coalesce(func.sum(table.held), 0), func.min(table.blocked_ms)
            ).select_from(consumer_sequences)
        )
    ).one()
    return SequenceSummary(int(row[0]), int(row[1]), None if row[2] is None else int(row[2]))


async def show_blocked_key(
    session: AsyncSession, consumer: str, topic: str, key: str, limit: int = 100
) -> tuple[BlockedKey, list[HeldRecord]]:
    """One blocked key and its first held records in order; :class:`OpsError` if not blocked."""
    blocked = await _find(session, consumer, topic, key)
    held = consumer_held_events.c
    rows = await session.execute(
        select(held.kafka_offset, held.source, held.event_id, held.event_type, held.held_ms)
        .where(
            held.consumer == consumer, held.topic == topic, held.key_hash == key_hash(key.encode())
        )
        .order_by(held.kafka_offset)
        .limit(limit)
    )
    return blocked, [
        HeldRecord(r.kafka_offset, r.source, r.event_id, r.event_type, r.held_ms) for r in rows
    ]


async def _find(session: AsyncSession, consumer: str, topic: str, key: str) -> BlockedKey:
    table = consumer_sequences.c
    row = (
        await session.execute(
            select(consumer_sequences).where(
                table.consumer == consumer,
                table.topic == topic,
                table.key_hash == key_hash(key.encode()),
            )
        )
    ).first()
    if row is None:
        raise OpsError(f"key {key!r} of {topic!r} is not blocked for consumer {consumer!r}")
    return _key_of(row)


async def resolve_head(
    session: AsyncSession,
    consumer: str,
    topic: str,
    key: str,
    *,
    resolution: Resolution,
    by: str,
    reason: str,
) -> BlockedKey:
    """Skip or release the dead-lettered head of a blocked key, with who and why.

    Its held records are then applied in order by the consumer owning the partition. Raises
    :class:`OpsError` when the key is not blocked, or already released.
    """
    if not by.strip() or len(by) > BY_MAX:
        raise OpsError(f"--by must have 1 to {BY_MAX} characters")
    if not reason.strip() or len(reason) > REASON_MAX:
        raise OpsError(f"--reason must have 1 to {REASON_MAX} characters")
    async with session.begin():
        blocked = await _find(session, consumer, topic, key)
        if blocked.state != "blocked":
            raise OpsError(f"key {key!r} of {topic!r} is being released already")
        table = consumer_sequences.c
        await session.execute(
            update(consumer_sequences)
            .where(
                table.consumer == consumer,
                table.topic == topic,
                table.key_hash == key_hash(key.encode()),
                table.state == "blocked",
            )
            .values(state="released", resolution=resolution, resolved_by=by, reason=reason)
        )
    return blocked
