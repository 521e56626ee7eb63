"""What waits in the outbox, counted from its partial indexes only.

The relay samples these counts every heartbeat and ``outboxkit status`` (the console's too)
shows them, so they must not cost more as published, parked or scheduled rows pile up. Each
figure is one scalar subquery over one partial index: the backlog of due rows from
``ix_outbox_events_pending`` and the due range of ``ix_outbox_events_scheduled`` (exact: it
costs what the relay is about to read anyway), the oldest row and the next due time from the
first entry of an index, and the parked rows and the rows scheduled for later counted only up
to a cap. Those two can sit there by the million for weeks; an exact count of 1 M index
entries cost 180-250 ms on a loaded 2-CPU machine, a capped one of 10,000 about 3 ms
(docs/operations.md#sizing).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.tables import outbox_events
from sqlalchemy import Integer, ScalarSelect, Select, case, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

# Parked and later-scheduled rows are counted up to this many; a count that reaches it means
# "at least" (shown as ``≥ 10000``).
COUNT_CAP = 10_000

_rows = outbox_events.c
_PENDING = _rows.published_ms.is_(None) & _rows.parked_ms.is_(None)
# The predicates of the partial indexes (outbox/tables.py), spelled so the planner matches them.
_UNSCHEDULED = (_PENDING, _rows.deliver_at_ms.is_(None))
_SCHEDULED = (_PENDING, _rows.deliver_at_ms.is_not(None))


@dataclass(frozen=True, slots=True)
class OutboxCounts:
    """Unpublished rows at ``now_ms`` (the database clock). ``pending``: due rows
    (unscheduled, or scheduled for a time that has come), exact; ``oldest_due_ms``: when the
    backlog's oldest row became due (a scheduled row counts from its due time, others from
    their creation); ``parked`` and ``scheduled`` (for later) up to ``cap``: a count equal to
    it means at least that many; ``next_due_ms``: the earliest time still to come."""

    now_ms: int
    pending: int
    oldest_due_ms: int | None
    parked: int
    scheduled: int
    next_due_ms: int | None
    cap: int

    @property
    def parked_at_least(self) -> bool:
        """``parked`` reached the cap: there may be more."""
        return self.parked >= self.cap

    @property
    def scheduled_at_least(self) -> bool:
        """``scheduled`` reached the cap: there may be more."""
        return self.scheduled >= self.cap


def pending_count_query(now: ColumnElement[int]) -> Select[int]:
    """The due rows (``now``: the statement's clock), as two index counts: unscheduled
    pending rows and the due range of the scheduled ones. One ``OR`` over both would be a
    scan of the whole outbox."""
    return select(_count(*_UNSCHEDULED) + _count(*_SCHEDULED, _rows.deliver_at_ms <= now))


def counts_query(
    now: ColumnElement[int], cap: int
) -> Select[int, int, int | None, int, int, int | None]:
    """The figures of :class:`OutboxCounts` in one statement, in its field order (``cap``
    excepted); ``now`` is the statement's clock, so every part sees the same time."""
    later = _rows.deliver_at_ms > now
    return select(
        now,
        pending_count_query(now).scalar_subquery(),
        _oldest_due(now),
        _count_up_to(cap, _rows.parked_ms.is_not(None)),
        _count_up_to(cap, *_SCHEDULED, later),
        _first(_rows.deliver_at_ms, _rows.deliver_at_ms, *_SCHEDULED, later),
    )


def _oldest_due(now: ColumnElement[int], *also: ColumnElement[bool]) -> ColumnElement[int]:
    """When the backlog's oldest row (of those ``also`` selects) became due: the earliest
    scheduled row's due time if that has come and is earlier, else the oldest unscheduled
    row's creation (the one with the lowest id: both are taken as the row is inserted);
    ``NULL`` for no backlog."""
    unscheduled = _first(_rows.created_ms, _rows.id, *_UNSCHEDULED, *also)
    scheduled = _first(_rows.deliver_at_ms, _rows.deliver_at_ms, *_SCHEDULED, *also)
    earlier = (scheduled <= now) & (unscheduled.is_(None) | (scheduled < unscheduled))
    return case((earlier, scheduled), else_=unscheduled)


async def read_counts(connection: AsyncConnection, cap: int = COUNT_CAP) -> OutboxCounts:
    """:class:`OutboxCounts` in one statement on ``connection``."""
    now = dialect_of(connection).statement_now_ms()
    row = (await connection.execute(counts_query(now, cap))).one()
    now_ms, pending, oldest, parked, scheduled, next_due = row
    return OutboxCounts(
        now_ms=int(now_ms),
        pending=int(pending),
        oldest_due_ms=oldest,
        parked=int(parked),
        scheduled=int(scheduled),
        next_due_ms=next_due,
        cap=cap,
    )


async def oldest_due_in(
    connection: AsyncConnection, shards: Collection[int]
) -> tuple[int, int | None]:
    """``(now_ms, oldest_due_ms)``: the database clock and when the oldest due row of
    ``shards`` became due (``None``: none waits). The walk a claim of those shards makes."""
    now = dialect_of(connection).statement_now_ms()
    if not shards:
        return int(await connection.scalar(select(now)) or 0), None
    row = (
        await connection.execute(select(now, _oldest_due(now, _rows.shard.in_(sorted(shards)))))
    ).one()
    return int(row[0]), row[1]


def _count(*where: ColumnElement[bool]) -> ScalarSelect[int]:
    return select(func.count()).select_from(outbox_events).where(*where).scalar_subquery()


def _count_up_to(cap: int, *where: ColumnElement[bool]) -> ScalarSelect[int]:
    # No column the index lacks, so this stays an index-only scan.
    capped: Select[int] = (
        select(literal_column("1", Integer)).select_from(outbox_events).where(*where).limit(cap)
    )
    return select(func.count()).select_from(capped.subquery()).scalar_subquery()


def _first(
    column: ColumnElement[int], order: ColumnElement[int], *where: ColumnElement[bool]
) -> ScalarSelect[int]:
    """``column`` of the first row in ``order`` (a walk of the index that has it in order)."""
    return select(column).where(*where).order_by(order).limit(1).scalar_subquery()
