"""Operator actions on the outbox: list parked, pending or scheduled rows; requeue parked ones.

Pending rows are the backlog: due now (unscheduled, or scheduled for a time that has come).
Scheduled rows wait for a time still to come, judged on the database clock.

A requeued row is pending again with a fresh attempt budget: ``parked_ms`` cleared,
``attempts`` 0 and ``available_ms`` now, so the next claim of its shard takes it. Its
``last_error`` is kept until the relay overwrites it. It is published after the rows of its key
written since it was parked: parking is where order yields to liveness.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from outboxkit.outbox.clock import read_db_now_ms
from outboxkit.outbox.dialects import Dialect, dialect_of
from outboxkit.outbox.tables import outbox_events
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

PENDING = outbox_events.c.published_ms.is_(None) & outbox_events.c.parked_ms.is_(None)
PARKED = outbox_events.c.parked_ms.is_not(None)
Which = Literal["pending", "parked", "scheduled"]


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """An unpublished outbox row as an operator sees it (no payload)."""

    id: int
    type: str
    source: str
    event_id: str
    topic: str
    attempts: int
    created_ms: int
    available_ms: int
    parked_ms: int | None
    last_error: str | None
    deliver_at_ms: int | None = None


@dataclass(frozen=True)
class RequeueRefused:
    """Ids that cannot be requeued: ``unknown`` (no such row) or ``not_parked``."""

    unknown: tuple[int, ...]
    not_parked: tuple[int, ...]

    def __str__(self) -> str:
        parts = []
        if self.unknown:
            parts.append(f"no outbox row with id {_ids(self.unknown)}")
        if self.not_parked:
            parts.append(f"id {_ids(self.not_parked)} not parked")
        return "; ".join(parts)


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ids)


_COLUMNS = (
    outbox_events.c.id,
    outbox_events.c.type,
    outbox_events.c.source,
    outbox_events.c.event_id,
    outbox_events.c.topic,
    outbox_events.c.attempts,
    outbox_events.c.created_ms,
    outbox_events.c.available_ms,
    outbox_events.c.parked_ms,
    outbox_events.c.last_error,
    outbox_events.c.deliver_at_ms,
)


def _where(which: Which, dialect: Dialect) -> tuple[Any, Any]:
    """The condition and the order of ``which`` rows."""
    now = dialect.now_ms()
    deliver_at = outbox_events.c.deliver_at_ms
    if which == "parked":
        return PARKED, outbox_events.c.parked_ms
    if which == "scheduled":
        return PENDING & (deliver_at > now), deliver_at
    return PENDING & (deliver_at.is_(None) | (deliver_at <= now)), outbox_events.c.id


@dataclass(frozen=True)
class RowFilter:
    """Conditions on unpublished rows; ``None`` matches everything. ``after`` is the keyset
    position of a page: the sort key ``(order value, id)`` of the previous page's last row."""

    topic: str | None = None
    type: str | None = None
    source: str | None = None
    after: tuple[int, int] | None = None


def _conditions(which: Which, dialect: Dialect, wanted: RowFilter) -> tuple[Any, Any]:
    where, order = _where(which, dialect)
    for column, value in (
        (outbox_events.c.topic, wanted.topic),
        (outbox_events.c.type, wanted.type),
        (outbox_events.c.source, wanted.source),
    ):
        if value is not None:
            where = where & (column == value)
    return where, order


async def list_rows(
    engine: AsyncEngine, *, which: Which, limit: int, wanted: RowFilter | None = None
) -> tuple[list[OutboxRow], int]:
    """Parked rows (oldest parked first), pending rows (oldest first) or scheduled rows (next
    due first), and the database time; ``wanted`` filters them and pages by keyset."""
    wanted = wanted or RowFilter()
    where, order = _conditions(which, dialect_of(engine), wanted)
    if wanted.after is not None:
        value, last_id = wanted.after
        if order is outbox_events.c.id:
            where = where & (outbox_events.c.id > last_id)
        else:
            where = where & ((order > value) | ((order == value) & (outbox_events.c.id > last_id)))
    query = select(*_COLUMNS).where(where).order_by(order, outbox_events.c.id).limit(limit)
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).all()
        now = await read_db_now_ms(connection)
    return [OutboxRow(**row._mapping) for row in rows], now


def sort_key(which: Which, row: OutboxRow) -> tuple[int, int]:
    """``row``'s keyset position in a ``which`` listing (for :attr:`RowFilter.after`)."""
    if which == "parked":
        return row.parked_ms or 0, row.id
    if which == "scheduled":
        return row.deliver_at_ms or 0, row.id
    return row.id, row.id


async def count_rows(
    engine: AsyncEngine,
    *,
    which: Which,
    wanted: RowFilter | None = None,
    at_most: int | None = None,
) -> int:
    """How many rows are parked, pending or scheduled (and match ``wanted``); with ``at_most``,
    counting stops there (a page's "10,000 or more" without reading a million index entries)."""
    where, _ = _conditions(which, dialect_of(engine), wanted or RowFilter())
    if at_most is None:
        query = select(func.count()).select_from(outbox_events).where(where)
    else:
        matching = select(outbox_events.c.id).where(where).limit(at_most).subquery()
        query = select(func.count()).select_from(matching)
    async with engine.connect() as connection:
        return int(await connection.scalar(query) or 0)


async def requeue(engine: AsyncEngine, ids: Sequence[int]) -> RequeueRefused | int:
    """Requeue the parked rows ``ids``, all or none; return how many, or what was refused."""
    wanted = sorted(set(ids))
    async with engine.begin() as connection:
        found = {
            row.id: row.parked_ms
            for row in await connection.execute(
                select(outbox_events.c.id, outbox_events.c.parked_ms)
                .where(outbox_events.c.id.in_(wanted))
                .with_for_update()
            )
        }
        refused = RequeueRefused(
            unknown=tuple(i for i in wanted if i not in found),
            not_parked=tuple(i for i in wanted if i in found and found[i] is None),
        )
        if refused.unknown or refused.not_parked:
            return refused
        count = await _requeue_where(connection, outbox_events.c.id.in_(wanted))
    return count


async def requeue_all_parked(engine: AsyncEngine) -> int:
    """Requeue every parked row; return how many."""
    async with engine.begin() as connection:
        return await _requeue_where(connection, PARKED)


async def requeue_matching(engine: AsyncEngine, wanted: RowFilter) -> int:
    """Requeue the parked rows that match ``wanted`` (topic, type, source); return how many."""
    where, _ = _conditions(
        "parked", dialect_of(engine), RowFilter(wanted.topic, wanted.type, wanted.source)
    )
    async with engine.begin() as connection:
        return await _requeue_where(connection, where)


async def _requeue_where(connection: AsyncConnection, condition: Any) -> int:
    dialect = dialect_of(connection)
    result = await connection.execute(
        update(outbox_events)
        .where(condition, PARKED)
        .values(
            parked_ms=None,
            attempts=0,
            available_ms=dialect.now_ms(),
        )
    )
    if dialect.listen_notify and result.rowcount:
        from outboxkit.relay.notify import CHANNEL

        # The relays' trigger fires on INSERT only; wake them now instead of at their next poll.
        await connection.execute(text("SELECT pg_notify(:channel, '')"), {"channel": CHANNEL})
    return int(result.rowcount or 0)
