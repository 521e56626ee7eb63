"""Deleting rows in short chunks, by a condition on the database clock: the one loop behind
the outbox's retention, the cleanups of expired agent operations, their audit trail and HTTP
idempotency keys.

Each chunk is one transaction kept short by three means: its rows are read along an index
(``order_by``, the cut-off a value the planner sees, each chunk starting where the previous
one stopped so it does not walk the index entries of rows it just deleted) and deleted by
primary key; its size follows the time the previous chunks took (:class:`Pacing`); and it
runs under a ``lock_timeout`` and ``statement_timeout`` local to it, so a cleanup gives up
rather than queue behind a long lock (with every writer of the table queued behind it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.secrecy import sqlstate
from sqlalchemy import BigInteger, ColumnElement, CursorResult, Table, bindparam, delete, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = logging.getLogger(__name__)

# lock_not_available (lock_timeout) and query_canceled (statement_timeout).
_TIMED_OUT = frozenset({"55P03", "57014"})


@dataclass(frozen=True)
class Pacing:
    """How long one chunk may hold its row locks, and how its size follows from that.

    The first chunk has ``first`` rows (or the caller's ``chunk_size`` if smaller); each next
    one is resized by ``target_ms`` / the time the last one held its locks (from its DELETE
    to its COMMIT returning), at most by half again, at least ``least`` rows, at most
    ``chunk_size``. The rest of a transaction (its round trips, reading the ids) holds no
    row lock and is left out: under load it is a fixed cost that a smaller chunk does not
    shorten, and pacing on it shrank chunks to a few dozen rows and retention below the
    inflow (docs/operations.md#retention-under-inflow). ``lock_timeout_ms`` and
    ``statement_timeout_ms`` bound each statement's lock wait and run (PostgreSQL, local to
    the transaction); a chunk that hits one is rolled back and ends the pass.
    """

    target_ms: float = 50.0
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
    even while rows keep expiring), at most ``chunk_size`` per transaction, in ``order_by``
    order (default: ``id``); return how many.

    Give ``order_by`` the column of an index ``condition`` bounds (the outbox's
    ``published_ms``), so a chunk is one short range scan of it. The ids are read first,
    then deleted by primary key with the condition checked again: PostgreSQL may re-run an
    ``IN (... LIMIT ... SKIP LOCKED)`` subquery per row and so delete more than one chunk in
    one statement. Rows locked by another transaction are skipped (PostgreSQL; SQLite's
    writers queue instead) and left for the next pass; ``skip_locked=False`` reads without
    locking, for rows nobody else locks (a lock taken only to be deleted is one more write of
    each row and its WAL), and a row that is locked after all ends the pass at the lock
    timeout. A chunk commits without waiting for its WAL to reach the disk where the database
    allows it: after a crash the next pass deletes those rows again.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    key = table.c.id if order_by is None else order_by
    now = bindparam("now_ms", type_=BigInteger)
    size = min(pacing.first, chunk_size)
    after: Any = None
    clock: int | None = None
    total = 0
    chunks = 0
    while max_chunks is None or chunks < max_chunks:
        deleting = 0.0
        try:
            async with sessions() as session, session.begin():
                dialect = dialect_of(session)
                settings = select(
                    dialect.now_ms(),
                    *dialect.local_timeouts(pacing.lock_timeout_ms, pacing.statement_timeout_ms),
                )
                if (no_flush := dialect.commit_without_flush()) is not None:
                    settings = settings.where(no_flush)
                started = (await session.execute(settings)).one()[0]
                clock = started if clock is None else clock
                selected = condition(now)
                chunk = select(table.c.id, key).where(selected)
                if after is not None:
                    # Ties of the key may straddle two chunks: ">=" keeps them.
                    chunk = chunk.where(key >= after)
                chunk = chunk.order_by(key).limit(size)
                if skip_locked:
                    chunk = dialect.claim_skip_locked(chunk)
                rows = (await session.execute(chunk, {"now_ms": clock})).all()
                if rows:
                    deleting = time.perf_counter()
                    by_id = dialect.in_list(table.c.id, "ids", table.c.id.type)
                    result = await session.execute(
                        delete(table).where(by_id, selected),
                        {"now_ms": clock, "ids": [row[0] for row in rows]},
                    )
                    total += cast("CursorResult[Any]", result).rowcount
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
        chunks += 1
        took_ms = (time.perf_counter() - deleting) * 1000 if rows else 0.0
        log.debug("cleanup of %s: %d rows, locks held %.1f ms", table.name, len(rows), took_ms)
        if len(rows) < size:
            break
        after = rows[-1][1]
        size = pacing.next_size(size, took_ms, chunk_size)
    return total
