"""Deleting rows in short chunks, by a condition on the database clock: the one loop behind
the outbox's retention, the cleanups of expired agent operations, their audit trail and HTTP
idempotency keys.

Each chunk holds its row locks briefly by four means: its rows are read along an index
(``order_by``, the cut-off a value the planner sees, each chunk starting where the previous
one stopped so it does not walk the index entries of rows it just deleted) and deleted by
primary key; its size follows the time the previous chunks held their locks
(:class:`Pacing`); on PostgreSQL the delete is one statement in autocommit, a locked block
(:mod:`outboxkit.outbox.locked`), so no client round trip falls inside its locks; and every
lock wait is bounded by a ``lock_timeout``, so a cleanup gives up rather than queue behind a
long lock (with every writer of the table queued behind it).

The read of the ids also runs under a ``statement_timeout`` local to its transaction. The
locked block does not: a timeout set inside a statement does not bound that statement, and a
session-level one around it would be two more round trips and would stay on a pooled
connection whenever its reset was missed. Its work is bounded instead: at most
``chunk_size`` rows, found by primary key, and no lock waited for longer than the lock
timeout (the first wait that reaches it fails the block, which changes nothing); a
``statement_timeout`` of the role or database still applies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.locked import AUTOCOMMIT, run_locked
from outboxkit.outbox.secrecy import sqlstate
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    CursorResult,
    Row,
    Table,
    bindparam,
    delete,
    select,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = logging.getLogger(__name__)

# lock_not_available (lock_timeout) and query_canceled (statement_timeout).
_TIMED_OUT = frozenset({"55P03", "57014"})


@dataclass(frozen=True)
class Pacing:
    """How long one chunk may hold its row locks, and how its size follows from that.

    The first chunk has ``first`` rows (or the caller's ``chunk_size`` if smaller); each next
    one is resized by ``target_ms`` / the time the last one held its locks (the round trip
    of its locked block on PostgreSQL; from its DELETE to its COMMIT returning elsewhere), at
    most by half again, at least ``least`` rows, at most ``chunk_size``. The rest of a chunk
    (its round trips, reading the ids) holds no row lock and is left out: under load it is a
    fixed cost that a smaller chunk does not shorten, and pacing on it shrank chunks to a few
    dozen rows and retention below the inflow (docs/operations.md#retention-under-inflow).
    ``lock_timeout_ms`` bounds every lock wait of a chunk and ``statement_timeout_ms`` the
    read of its ids (PostgreSQL); a chunk that hits one changes nothing and ends the pass.
    """

    # 50 ms let chunks reach 5,000 rows, whose locked blocks ran up to 86-227 ms inside the
    # server when a checkpoint's writes stalled their WAL (p99 61-66 ms); 25 ms: p99 48-55 ms.
    target_ms: float = 25.0
    first: int = 1000
    least: int = 200
    lock_timeout_ms: int = 100
    statement_timeout_ms: int = 1000

    def next_size(self, size: int, took_ms: float, most: int) -> int:
        """The size of the chunk after one of ``size`` rows that held its locks ``took_ms``."""
        factor = min(1.5, self.target_ms / max(took_ms, 0.001))
        return max(min(self.least, most), min(most, round(size * factor)))


DEFAULT_PACING = Pacing()


async def delete_in_chunks(
    sessions: async_sessionmaker[AsyncSession],
    table: Table,
    condition: Callable[[ColumnElement[Any]], ColumnElement[bool]],
    *,
    chunk_size: int,
    max_chunks: int | None = None,
    order_by: ColumnElement[Any] | None = None,
    skip_locked: bool = True,
    pacing: Pacing = DEFAULT_PACING,
) -> int:
    """Delete the rows of ``table`` that ``condition(now)`` selects (``now``: the database
    clock in epoch ms, read once when the pass starts and bound as a value, so a pass ends
    even while rows keep expiring), at most ``chunk_size`` per chunk, in ``order_by`` order
    (default: ``id``); return how many.

    Give ``order_by`` the column of an index ``condition`` bounds (the outbox's
    ``published_ms``), so a chunk is one short range scan of it. The ids are read first,
    then deleted by primary key with the condition checked again: PostgreSQL may re-run an
    ``IN (... LIMIT ... SKIP LOCKED)`` subquery per row and so delete more than one chunk in
    one statement. Where the database has locked blocks (PostgreSQL), the ids are read
    without locking them and the delete is one statement in autocommit that sets its lock
    timeout first and commits when it ends
    (:meth:`~outboxkit.outbox.dialects.Dialect.locked_block`): its row locks are taken and
    released inside the server, with no client round trip while they are held. Rows locked
    by another transaction are skipped (PostgreSQL; SQLite's writers queue instead) and left
    for the next pass; ``skip_locked=False`` deletes without that, for rows nobody else locks
    (locking a row only to delete it is one more write of it and its WAL), and a row that is
    locked after all ends the pass at the lock timeout. A chunk commits without waiting for
    its WAL to reach the disk where the database allows it: after a crash the next pass
    deletes those rows again.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    chunks = _Chunks(table, condition, table.c.id if order_by is None else order_by, pacing)
    size = min(pacing.first, chunk_size)
    after: Any = None
    total = 0
    done = 0
    while max_chunks is None or done < max_chunks:
        try:
            async with sessions() as session:
                if dialect_of(session).locked_blocks:
                    rows, deleted, took_ms = await chunks.in_block(
                        session, after, size, skip_locked=skip_locked
                    )
                else:
                    rows, deleted, took_ms = await chunks.in_transaction(
                        session, after, size, skip_locked=skip_locked
                    )
        except DBAPIError as error:
            if sqlstate(error) not in _TIMED_OUT:
                raise
            log.warning(
                "cleanup of %s stopped after %d rows: a chunk hit its lock or statement "
                "timeout (the next pass goes on)",
                table.name,
                total,
            )
            break
        total += deleted
        done += 1
        log.debug("cleanup of %s: %d rows, locks held %.1f ms", table.name, len(rows), took_ms)
        if len(rows) < size:
            break
        after = rows[-1][1]
        size = pacing.next_size(size, took_ms, chunk_size)
    return total


@dataclass
class _Chunks:
    """One pass's chunks: what they delete, and the database clock its first chunk read."""

    table: Table
    condition: Callable[[ColumnElement[Any]], ColumnElement[bool]]
    key: ColumnElement[Any]
    pacing: Pacing
    clock: int | None = None

    async def _read(
        self, session: AsyncSession, after: Any, size: int, *, lock: bool
    ) -> Sequence[Row[Any, Any]]:
        """The chunk's ids and keys, in ``session``'s transaction, whose later statements
        the pacing's lock and statement timeouts bound (``lock``: the rows locked, skipping
        those others hold, and the commit not waiting for the disk)."""
        dialect = dialect_of(session)
        timeouts = dialect.local_timeouts(
            self.pacing.lock_timeout_ms, self.pacing.statement_timeout_ms
        )
        settings = select(dialect.now_ms(), *timeouts)
        if lock and (no_flush := dialect.commit_without_flush()) is not None:
            settings = settings.where(no_flush)
        started = (await session.execute(settings)).one()[0]
        self.clock = started if self.clock is None else self.clock
        chunk = select(self.table.c.id, self.key).where(self.condition(_NOW))
        if after is not None:
            # Ties of the key may straddle two chunks: ">=" keeps them.
            chunk = chunk.where(self.key >= after)
        chunk = chunk.order_by(self.key).limit(size)
        if lock:
            chunk = dialect.claim_skip_locked(chunk)
        return (await session.execute(chunk, {"now_ms": self.clock})).all()

    async def in_transaction(
        self, session: AsyncSession, after: Any, size: int, *, skip_locked: bool
    ) -> tuple[Sequence[Row[Any, Any]], int, float]:
        """Read and delete one chunk in one transaction: its rows, how many went, and how
        long their locks were held (from the DELETE to the COMMIT returning)."""
        deleting = 0.0
        async with session.begin():
            rows = await self._read(session, after, size, lock=skip_locked)
            if not rows:
                return rows, 0, 0.0
            deleting = time.perf_counter()
            dialect = dialect_of(session)
            by_id = dialect.in_list(self.table.c.id, "ids", self.table.c.id.type)
            result = await session.execute(
                delete(self.table).where(by_id, self.condition(_NOW)),
                {"now_ms": self.clock, "ids": [row[0] for row in rows]},
            )
        deleted = cast("CursorResult[Any]", result).rowcount
        return rows, deleted, (time.perf_counter() - deleting) * 1000

    async def in_block(
        self, session: AsyncSession, after: Any, size: int, *, skip_locked: bool
    ) -> tuple[Sequence[Row[Any, Any]], int, float]:
        """Read one chunk in a transaction that locks no row, then delete it in one locked
        block: its rows, how many went, and the block's round trip (the longest its locks
        can have been held)."""
        async with session.begin():
            rows = await self._read(session, after, size, lock=False)
        if not rows:
            return rows, 0, 0.0
        dialect = dialect_of(session)
        assert self.clock is not None  # read by the chunk above
        # The block's values, not its text: the same text for every chunk (locked_block).
        selected = self.condition(dialect.block_value("chunk_now", BigInteger()))
        by_id = dialect.in_block_list(self.table.c.id, "chunk_ids")
        statement = delete(self.table).where(by_id, selected)
        if skip_locked:
            unlocked = dialect.claim_skip_locked(select(self.table.c.id).where(by_id, selected))
            statement = delete(self.table).where(self.table.c.id.in_(unlocked))
        connection = await session.connection(execution_options={"isolation_level": AUTOCOMMIT})
        sql = statement.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True})
        block = dialect.locked_block(
            [str(sql)],
            lock_timeout_ms=self.pacing.lock_timeout_ms,
            commit_without_flush=True,
            values={"chunk_now": self.clock, "chunk_ids": [row[0] for row in rows]},
        )
        if block is None:
            raise ValueError(f"{dialect.title} has no locked blocks")
        held = await run_locked(connection, block)
        return rows, held.rows, held.round_trip_ms


_NOW = bindparam("now_ms", type_=BigInteger)
