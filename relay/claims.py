"""Claiming outbox rows for publication and settling them afterwards, in batched statements.

A claim reads the oldest pending rows of the shards this relay leases (``FOR UPDATE SKIP
LOCKED`` on PostgreSQL), and stamps the chosen ones with a lease token and expiry. Settling
(published, failed, released) only touches rows that still carry that token, so a relay that
lost its lease changes nothing with a late update.

Per-key order: a row whose earlier sibling (same Kafka key) is waiting for a retry or is leased
by another relay blocks the rest of its key in that batch, so a key never overtakes itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import BigInteger, any_, bindparam, delete, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from outbox.clock import db_now_ms
from outbox.tables import outbox_events, outbox_shard_leases

PENDING = outbox_events.c.published_ms.is_(None) & outbox_events.c.parked_ms.is_(None)


@dataclass(slots=True, eq=False)
class ClaimedRow:
    """One outbox row claimed for publication (compared by identity: one object per claim)."""

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

    def __init__(self, engine: AsyncEngine, relay_id: str, lease_ms: int) -> None:
        self.engine = engine
        self.relay_id = relay_id
        self.lease_ms = lease_ms
        self._now = db_now_ms(engine.dialect.name)

    async def claim(
        self, token: str, limit: int, in_flight: frozenset[str] = frozenset()
    ) -> list[ClaimedRow]:
        """Claim up to ``limit`` rows of this relay's leased shards, oldest first.

        Rows leased under one of this relay's ``in_flight`` tokens are being published right
        now, ahead of whatever this claim returns, so they are skipped without blocking their key.
        """
        my_shards = select(outbox_shard_leases.c.shard).where(
            outbox_shard_leases.c.holder == self.relay_id,
            outbox_shard_leases.c.expires_ms > self._now,
        )
        candidates_query = (
            select(
                outbox_events.c.id,
                outbox_events.c.kafka_key,
                outbox_events.c.available_ms,
                outbox_events.c.lease_until_ms,
                outbox_events.c.lease_token,
                self._now.label("now_ms"),
            )
            .where(PENDING, outbox_events.c.shard.in_(my_shards.scalar_subquery()))
            .order_by(outbox_events.c.id)
            .limit(limit)
            .with_for_update(of=outbox_events, skip_locked=True)
        )
        if in_flight:
            # Not merely skipped after the fact: they would fill the LIMIT and starve the claim.
            candidates_query = candidates_query.where(
                outbox_events.c.lease_token.is_(None)
                | outbox_events.c.lease_token.not_in(list(in_flight))
            )
        async with self.engine.begin() as conn:
            candidates = (await conn.execute(candidates_query)).all()
            chosen = _claimable(candidates, in_flight)
            if not chosen:
                return []
            now_ms = candidates[0].now_ms
            # Narrow candidates first, payloads only for the rows actually claimed.
            claimed = await conn.execute(
                update(outbox_events)
                .where(self._ids(chosen))
                .values(lease_token=token, lease_until_ms=now_ms + self.lease_ms)
                .returning(
                    outbox_events.c.id,
                    outbox_events.c.topic,
                    outbox_events.c.kafka_key,
                    outbox_events.c.headers,
                    outbox_events.c.payload,
                    outbox_events.c.attempts,
                )
            )
            rows = sorted(claimed.all(), key=lambda row: row.id)
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

    async def settle(
        self,
        token: str,
        published: Sequence[ClaimedRow],
        failed: Sequence[Failure],
        released: Sequence[ClaimedRow],
        *,
        delete_published: bool,
        max_attempts: int,
        retry_delay_ms: Callable[[int], int],
    ) -> int:
        """Record a batch's outcome in one transaction; return how many published rows matched.

        ``published`` rows are marked (or deleted), ``failed`` rows count an attempt and are
        parked after ``max_attempts``, ``released`` rows go back untouched for the next claim.
        """
        mine = outbox_events.c.lease_token == token
        matched = 0
        async with self.engine.begin() as conn:
            if published:
                ids = [row.id for row in published]
                if delete_published:
                    statement = delete(outbox_events).where(self._ids(ids), mine)
                else:
                    statement = (
                        update(outbox_events)
                        .where(self._ids(ids), mine)
                        .values(published_ms=self._now, lease_token=None, lease_until_ms=None)
                    )
                matched = (await conn.execute(statement)).rowcount
            for failure in failed:
                attempts = failure.row.attempts + 1
                values = {
                    "attempts": attempts,
                    "last_error": failure.error[:2000],
                    "lease_token": None,
                    "lease_until_ms": None,
                }
                if attempts >= max_attempts:
                    values["parked_ms"] = self._now
                else:
                    values["available_ms"] = self._now + retry_delay_ms(attempts)
                await conn.execute(
                    update(outbox_events)
                    .where(outbox_events.c.id == failure.row.id, mine)
                    .values(values)
                )
            if released:
                await conn.execute(self._release_statement(token, released))
        return matched

    async def release(self, token: str, rows: Sequence[ClaimedRow]) -> None:
        """Give claimed rows back untouched, for the next claim."""
        async with self.engine.begin() as conn:
            await conn.execute(self._release_statement(token, rows))

    def _ids(self, ids: Sequence[int]) -> ColumnElement[bool]:
        """``id IN (...)``; on PostgreSQL one array parameter (``= ANY``), which compiles once
        instead of rendering a bind per id."""
        if self.engine.dialect.name == "postgresql":
            return outbox_events.c.id == any_(bindparam("ids", list(ids), type_=ARRAY(BigInteger)))
        return outbox_events.c.id.in_(list(ids))

    def _release_statement(self, token: str, rows: Sequence[ClaimedRow]):
        return (
            update(outbox_events)
            .where(
                self._ids([row.id for row in rows]),
                outbox_events.c.lease_token == token,
            )
            .values(lease_token=None, lease_until_ms=None)
        )

    async def pending_count(self) -> int:
        """Rows not yet published nor parked (all shards)."""
        async with self.engine.connect() as conn:
            return await conn.scalar(select(func.count()).select_from(outbox_events).where(PENDING))

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


def _claimable(candidates: Sequence, in_flight: frozenset[str]) -> list[int]:
    """Ids to claim, in order, skipping each key from its first row that must wait."""
    blocked: set[bytes] = set()
    chosen: list[int] = []
    for row in candidates:
        key = row.kafka_key
        if (key is not None and key in blocked) or row.lease_token in in_flight:
            continue
        waiting = row.available_ms > row.now_ms
        leased_elsewhere = row.lease_until_ms is not None and row.lease_until_ms > row.now_ms
        if waiting or leased_elsewhere:
            if key is not None:
                blocked.add(key)
            continue
        chosen.append(row.id)
    return chosen
