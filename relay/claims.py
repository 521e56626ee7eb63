"""Claiming outbox rows for publication and settling them afterwards, in batched statements.

A claim reads the oldest pending rows of the shards this relay leases; the shard lease, held in
the database and checked by the claim itself, is what makes them this relay's, so a claim
writes nothing. Settling marks published rows (or deletes them) and counts failed attempts,
touching only rows still pending.

Per-key order: a row whose earlier sibling (same Kafka key) is waiting for a retry blocks the
rest of its key in that batch, so a key never overtakes itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from outboxkit.outbox.clock import db_now_ms
from outboxkit.outbox.tables import outbox_events, outbox_shard_leases
from sqlalchemy import (
    BigInteger,
    CursorResult,
    Select,
    all_,
    any_,
    bindparam,
    case,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Executable
from sqlalchemy.sql.elements import ColumnElement

PENDING = outbox_events.c.published_ms.is_(None) & outbox_events.c.parked_ms.is_(None)


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


@dataclass(frozen=True, slots=True)
class Backlog:
    """What waits in the outbox."""

    pending: int
    oldest_age_s: float
    parked: int


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
        self._now = db_now_ms(engine.dialect.name)
        self._postgresql = engine.dialect.name == "postgresql"
        self._claim_statement = self._build_claim_statement()
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
        rows = claimed.all()
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

    def _build_claim_statement(self) -> Select[Any]:
        """The claim, built once (building it per call cost more than running it)."""
        now = self._now
        my_shards = select(outbox_shard_leases.c.shard).where(
            outbox_shard_leases.c.holder == self.relay_id,
            outbox_shard_leases.c.expires_ms > now,
        )
        must_wait = case((outbox_events.c.available_ms > now, 1), else_=0)
        candidates = (
            select(outbox_events.c.id, outbox_events.c.kafka_key, must_wait.label("must_wait"))
            .where(
                PENDING,
                outbox_events.c.shard.in_(my_shards.scalar_subquery()),
                self._id_in("in_flight", negated=True),
            )
            .order_by(outbox_events.c.id)
            .limit(bindparam("limit"))
            .cte("candidates")
        )
        # A key is blocked from its first waiting row on; a row without a key only by itself.
        blocked_since = func.max(candidates.c.must_wait).over(
            partition_by=candidates.c.kafka_key, order_by=candidates.c.id
        )
        ranked = select(
            candidates.c.id,
            case(
                (candidates.c.kafka_key.is_(None), candidates.c.must_wait), else_=blocked_since
            ).label("blocked"),
        ).cte("ranked")
        return (
            select(
                outbox_events.c.id,
                outbox_events.c.topic,
                outbox_events.c.kafka_key,
                outbox_events.c.headers,
                outbox_events.c.payload,
                outbox_events.c.attempts,
            )
            .join(ranked, ranked.c.id == outbox_events.c.id)
            .where(ranked.c.blocked == 0)
            .order_by(outbox_events.c.id)
        )

    def _id_in(self, name: str, *, negated: bool = False) -> ColumnElement[bool]:
        """``id`` in (or, ``negated``, not in) the list parameter ``name``; on PostgreSQL one
        array parameter, so the statement text does not change with the list's length. A
        negated list must not be empty: pass ``[0]`` for none."""
        column = outbox_events.c.id
        if self._postgresql:
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
                    if len(work) == 1 and self._postgresql:
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
        """Rows not yet published nor parked (all shards)."""
        async with self.engine.connect() as conn:
            query = select(func.count()).select_from(outbox_events).where(PENDING)
            return (await conn.execute(query)).scalar_one()

    async def backlog(self) -> Backlog:
        """Backlog size, age of its oldest row and parked rows, in one query (all shards)."""
        parked = outbox_events.c.parked_ms.is_not(None)
        query = select(
            func.count().filter(PENDING),
            func.min(outbox_events.c.created_ms).filter(PENDING),
            func.count().filter(parked),
            self._now,
        ).where(PENDING | parked)
        async with self.engine.connect() as conn:
            pending, oldest_ms, parked_rows, now_ms = (await conn.execute(query)).one()
        age_s = max(0, now_ms - oldest_ms) / 1000 if oldest_ms is not None else 0.0
        return Backlog(pending=pending, oldest_age_s=age_s, parked=parked_rows)
