"""Claiming outbox rows for publication and settling them afterwards, in batched statements.

A claim reads the oldest pending rows of the shards this relay leases; the shard lease, held in
the database and checked by the claim itself, is what makes them this relay's, so a claim
writes nothing. Settling marks published rows (or deletes them) and counts failed attempts,
touching only rows still pending.

Per-key order: a row whose earlier sibling (same Kafka key) is waiting for a retry blocks the
rest of its key in that batch, so a key never overtakes itself. "Earlier" is by due time, then
id: a scheduled row (``deliver_at_ms``) is claimed only once due and never holds back its key
before (docs/relay.md#scheduled-delivery).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.tables import outbox_events, outbox_shard_leases
from outboxkit.relay.outbox_counts import pending_count_query, read_counts
from sqlalchemy import (
    BigInteger,
    BindParameter,
    CursorResult,
    Integer,
    Select,
    all_,
    any_,
    bindparam,
    case,
    delete,
    func,
    literal_column,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Executable
from sqlalchemy.sql.elements import ColumnElement

PENDING = outbox_events.c.published_ms.is_(None) & outbox_events.c.parked_ms.is_(None)
_NO: ColumnElement[int] = literal_column("0", Integer).label("scheduled")
_YES: ColumnElement[int] = literal_column("1", Integer).label("scheduled")
# The relay looks this far ahead (rows of any shard, in due order) for its own next due row.
NEXT_DUE_WINDOW = 1000


@dataclass(slots=True)
class ClaimedRow:
    """One outbox row claimed for publication."""

    id: int
    topic: str
    key: bytes | None
    headers: list[tuple[str, bytes]]
    payload: bytes
    attempts: int

    @property
    def event_id(self) -> str | None:
        """The CloudEvents id, for logs and spans."""
        for name, value in self.headers:
            if name == "ce_id":
                return value.decode()
        return None


def claimed_rows(rows: Sequence[Any]) -> list[ClaimedRow]:
    """:class:`ClaimedRow` objects from result rows with ``id, topic, kafka_key, headers,
    payload, attempts``."""
    # One JSON parse for the whole batch instead of one per row.
    all_headers = json.loads("[" + ",".join(row.headers for row in rows) + "]")
    return [
        ClaimedRow(
            row.id,
            row.topic,
            row.kafka_key,
            [(name, value.encode()) for name, value in headers.items()],
            row.payload,
            row.attempts,
        )
        for row, headers in zip(rows, all_headers, strict=True)
    ]


@dataclass(frozen=True, slots=True)
class Backlog:
    """What waits in the outbox."""

    pending: int
    oldest_age_s: float
    parked: int
    scheduled: int = 0


@dataclass(frozen=True, slots=True)
class Failure:
    """A row whose publication failed for a reason of its own (not an outage)."""

    row: ClaimedRow
    error: str


class Claims:
    """Claim and settle outbox rows for one relay."""

    def __init__(self, engine: AsyncEngine, relay_id: str) -> None:
        self.engine = engine
        self.relay_id = relay_id
        self._dialect = dialect_of(engine)
        self._now = self._dialect.now_ms()
        self._claim_statement = self._build_claim_statement()
        self._next_due_statement = self._build_next_due_statement()
        self._pending_count_statement = pending_count_query(self._dialect.statement_now_ms())
        self._build_settle_statements()

    async def claim(self, limit: int, in_flight: Sequence[int] = ()) -> list[ClaimedRow]:
        """Read up to ``limit`` pending rows of this relay's leased shards, oldest first.

        One read-only statement. A key is cut off at its first row that waits for a retry.
        ``in_flight`` are ids this relay is publishing or settling right now, ahead of
        whatever this claim returns: they are left out without blocking their key (and do not
        fill the ``LIMIT``). Nothing is written: the shard lease makes the rows this relay's.
        """
        parameters = {"limit": limit, "in_flight": list(in_flight) or [0]}
        (claimed,) = await self._execute([(self._claim_statement, parameters)])
        return claimed_rows(claimed.all())

    def _build_claim_statement(self) -> Select[Any]:
        """The claim, built once (building it per call cost more than running it).

        Two streams of candidates, each from its own partial index: the oldest ``limit``
        unscheduled rows by id (the statement as it was before scheduled delivery) and the
        earliest ``limit`` scheduled rows that are due. A key's rows go in order of their due
        time (a scheduled row's ``deliver_at_ms``; an unscheduled row's ``created_ms``, made
        non-decreasing in id per key so unscheduled rows keep their write order), then id.
        A stream that came full may hide rows due before its last one: the other stream's rows
        due after that wait for a later claim, so no key overtakes a row it has not seen.
        """
        now = self._now
        rows = outbox_events.c
        my_shards = select(outbox_shard_leases.c.shard).where(
            outbox_shard_leases.c.holder == self.relay_id,
            outbox_shard_leases.c.expires_ms > now,
        )
        mine = (
            PENDING,
            rows.shard.in_(my_shards.scalar_subquery()),
            self._id_in("in_flight", negated=True),
        )
        limit: BindParameter[int] = bindparam("limit", type_=Integer)
        # The statement's clock, not the volatile one: the planner sees its value, so the due
        # rows are a range of ix_outbox_events_scheduled it walks in order and stops at the
        # first not yet due, in custom and generic plans alike. Behind a volatile clock (an
        # InitPlan) it guessed a third of the scheduled rows due and, with 1 M of them, chose
        # a seq scan of the whole outbox (docs/operations.md#sizing).
        statement_now = self._dialect.statement_now_ms()
        must_wait = case((rows.available_ms > now, 1), else_=0).label("must_wait")
        unscheduled = (
            select(rows.id, rows.kafka_key, rows.created_ms.label("due_ms"), must_wait, _NO)
            .where(*mine, rows.deliver_at_ms.is_(None))
            .order_by(rows.id)
            .limit(limit)
            .subquery()
        )
        due = (
            select(rows.id, rows.kafka_key, rows.deliver_at_ms.label("due_ms"), must_wait, _YES)
            .where(*mine, rows.deliver_at_ms.is_not(None), rows.deliver_at_ms <= statement_now)
            .order_by(rows.deliver_at_ms, rows.id)
            .limit(limit)
            .subquery()
        )
        candidates = union_all(select(unscheduled), select(due)).cte("candidates")
        c = candidates.c

        def last_due_if_full(scheduled: int) -> ColumnElement[Any]:
            stream = c.scheduled == scheduled
            return case((func.count().filter(stream) >= limit, func.max(c.due_ms).filter(stream)))

        bounds = select(
            last_due_if_full(0).label("unscheduled_until"),
            last_due_if_full(1).label("scheduled_until"),
        ).cte("bounds")
        key_stream = (c.kafka_key, c.scheduled)
        running_due = func.max(c.due_ms).over(partition_by=key_stream, order_by=c.id)
        ordered = (
            select(
                c.id,
                c.kafka_key,
                c.must_wait,
                c.scheduled,
                case((c.scheduled == 1, c.due_ms), else_=running_due).label("due_ms"),
                bounds.c.unscheduled_until,
                bounds.c.scheduled_until,
            )
            .select_from(candidates.join(bounds, true()))
            .cte("ordered")
        )
        o = ordered.c
        waits = case(
            (o.must_wait == 1, 1),
            ((o.scheduled == 0) & (o.due_ms > o.scheduled_until), 1),
            ((o.scheduled == 1) & (o.due_ms > o.unscheduled_until), 1),
            else_=0,
        )
        # A key is blocked from its first waiting row on; a row without a key only by itself.
        blocked_since = func.max(waits).over(partition_by=o.kafka_key, order_by=(o.due_ms, o.id))
        ranked = select(
            o.id,
            o.due_ms,
            case((o.kafka_key.is_(None), waits), else_=blocked_since).label("blocked"),
        ).cte("ranked")
        return (
            select(
                rows.id,
                rows.topic,
                rows.kafka_key,
                rows.headers,
                rows.payload,
                rows.attempts,
            )
            .join(ranked, ranked.c.id == rows.id)
            .where(ranked.c.blocked == 0)
            .order_by(ranked.c.due_ms, rows.id)
            .limit(limit)
        )

    def _id_in(self, name: str, *, negated: bool = False) -> ColumnElement[bool]:
        """``id`` in (or, ``negated``, not in) the list parameter ``name``; on PostgreSQL one
        array parameter, so the statement text does not change with the list's length. A
        negated list must not be empty: pass ``[0]`` for none."""
        column = outbox_events.c.id
        if self._dialect.array_parameters:
            ids = bindparam(name, type_=ARRAY(BigInteger))
            return column != all_(ids) if negated else column == any_(ids)
        ids = bindparam(name, expanding=True)
        return column.not_in(ids) if negated else column.in_(ids)

    async def _execute(
        self, work: Sequence[tuple[Executable, dict[str, Any]]]
    ) -> list[CursorResult[Any]]:
        """Execute ``(statement, parameters)`` pairs in one transaction; once more if the
        connection was dead.

        A single statement on PostgreSQL runs in autocommit: no BEGIN and COMMIT round trips.
        The engine has no pre-ping: after a database restart the first statement fails on a
        stale connection, SQLAlchemy invalidates the pool, and the retry gets a fresh one.
        """
        for attempt in (1, 2):
            try:
                async with self.engine.connect() as conn:
                    if len(work) == 1 and self._dialect.autocommit_statements:
                        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                        return [await conn.execute(*work[0])]
                    async with conn.begin():
                        return [await conn.execute(*each) for each in work]
            except DBAPIError as error:
                if attempt == 2 or not error.connection_invalidated:
                    raise
        raise AssertionError("unreachable")

    async def settle(
        self,
        published: Sequence[ClaimedRow],
        failed: Sequence[Failure],
        *,
        delete_published: bool,
        max_attempts: int,
        retry_delay_ms: Callable[[int], int],
    ) -> int:
        """Record a batch's outcome in one transaction; return how many published rows matched.

        ``published`` rows are marked (or deleted); ``failed`` rows count an attempt and are
        parked after ``max_attempts``. Only rows still pending are touched: a row another relay
        marked meanwhile (after a lease takeover) stays as it is. Rows given back (an outage,
        a key held back) need nothing: they are still pending.
        """
        work: list[tuple[Executable, dict[str, Any]]] = []
        if published:
            statement = self._delete_published if delete_published else self._mark_published
            work.append((statement, {"ids": [row.id for row in published]}))
        for failure in failed:
            attempts = failure.row.attempts + 1
            values = {"attempts": attempts, "last_error": failure.error[:2000]}
            if attempts >= max_attempts:
                values["parked_ms"] = self._now
            else:
                values["available_ms"] = self._now + retry_delay_ms(attempts)
            one_row = (outbox_events.c.id == failure.row.id) & PENDING
            work.append((update(outbox_events).where(one_row).values(values), {}))
        if not work:
            return 0
        results = await self._execute(work)
        return results[0].rowcount if published else 0

    def _build_settle_statements(self) -> None:
        """Marking and deleting rows by id, built once per relay."""
        by_ids = self._id_in("ids")
        self._mark_published = (
            update(outbox_events).where(by_ids, PENDING).values(published_ms=self._now)
        )
        self._delete_published = delete(outbox_events).where(by_ids, PENDING)

    async def pending_count(self) -> int:
        """Rows that are due and neither published nor parked (all shards); rows scheduled
        for later are not counted."""
        async with self.engine.connect() as conn:
            count: int = (await conn.execute(self._pending_count_statement)).scalar_one()
        return count

    async def backlog(self) -> Backlog:
        """Backlog size, age of its oldest row, parked rows and rows scheduled for later, in
        one query of the partial indexes (all shards; :mod:`.outbox_counts`). A scheduled
        row's age counts from its due time; parked and scheduled rows are counted up to
        :data:`~.outbox_counts.COUNT_CAP`."""
        async with self.engine.connect() as conn:
            counts = await read_counts(conn)
        oldest_ms = counts.oldest_due_ms
        age_s = max(0, counts.now_ms - oldest_ms) / 1000 if oldest_ms is not None else 0.0
        return Backlog(
            pending=counts.pending,
            oldest_age_s=age_s,
            parked=counts.parked,
            scheduled=counts.scheduled,
        )

    async def next_due_in_s(self) -> float | None:
        """Seconds until the next scheduled row of this relay's shards is due, or ``None``.

        Bounded: it looks at the :data:`NEXT_DUE_WINDOW` earliest scheduled rows of all shards
        (from their index) and picks this relay's first; none among them is ``None`` (the
        relay then polls). Rows already due are the claim's business, not counted here.
        """
        async with self.engine.connect() as conn:
            delay_ms = (await conn.execute(self._next_due_statement)).scalar()
        return None if delay_ms is None else max(0, delay_ms) / 1000

    def _build_next_due_statement(self) -> Select[Any]:
        now = self._now
        rows = outbox_events.c
        earliest = (
            select(rows.deliver_at_ms, rows.shard)
            .where(
                PENDING,
                rows.deliver_at_ms.is_not(None),
                rows.deliver_at_ms > self._dialect.statement_now_ms(),  # bounds the index scan
            )
            .order_by(rows.deliver_at_ms)
            .limit(NEXT_DUE_WINDOW)
            .subquery()
        )
        my_shards = select(outbox_shard_leases.c.shard).where(
            outbox_shard_leases.c.holder == self.relay_id,
            outbox_shard_leases.c.expires_ms > now,
        )
        return select(func.min(earliest.c.deliver_at_ms) - now).where(
            earliest.c.shard.in_(my_shards.scalar_subquery())
        )
