"""Running a :class:`~outboxkit.outbox.dialects.base.LockedBlock`: one statement in autocommit,
so the locks its statements take are released inside the server when it ends, with no client
round trip while they are held (a process descheduled between a ``DELETE``'s result and its
``COMMIT`` would hold them all that time)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from outboxkit.outbox.dialects.base import LockedBlock
from outboxkit.outbox.driver import send_script
from sqlalchemy.ext.asyncio import AsyncConnection

log = logging.getLogger(__name__)

AUTOCOMMIT = "AUTOCOMMIT"


@dataclass(frozen=True, slots=True)
class Held:
    """What a locked block did: the rows its statements changed (the sum of their row counts),
    its round trip as the client saw it (an upper bound of its locks' hold) and the time it
    ran in the server (its commit excluded)."""

    rows: int
    round_trip_ms: float
    server_ms: float


async def run_locked(connection: AsyncConnection, block: LockedBlock) -> Held:
    """Send ``block`` in autocommit on ``connection``, its values first in the same message
    (:func:`~outboxkit.outbox.driver.send_script`: one transaction on one server session), and
    read its results from the notice it ends with, in its own reply: the same server session
    through a transaction-mode pooler (PgBouncer's) too. ``connection`` is either in autocommit
    already (``session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})``)
    or outside a transaction, in which case it is put in autocommit for the block and back
    to its isolation level after it."""
    sync = connection.sync_connection
    if sync is None:
        raise ValueError("the connection is not open")
    previous = sync.get_execution_options().get("isolation_level")
    switch = previous != AUTOCOMMIT
    if switch:
        if connection.in_transaction():
            raise ValueError("a locked block must not run inside a transaction")
        await connection.execution_options(isolation_level=AUTOCOMMIT)
    try:
        script = block.sql if block.values_sql is None else f"{block.values_sql};\n{block.sql}"
        started = time.perf_counter()
        notices: list[str] = []
        await send_script(connection, script, notices=notices)
        round_trip_ms = (time.perf_counter() - started) * 1000
        rows, server_ms = _results(block, notices)
    finally:
        if switch:
            # Nothing is sent in autocommit: this ends SQLAlchemy's record of a transaction,
            # which must be closed before the isolation level changes back.
            await connection.rollback()
            level = previous or connection.default_isolation_level
            await connection.execution_options(isolation_level=level)
    held = Held(int(rows), round_trip_ms, float(server_ms))
    log.debug(
        "locked block: %d rows, %.1f ms round trip, %.1f ms in the server",
        held.rows,
        held.round_trip_ms,
        held.server_ms,
    )
    return held


def _results(block: LockedBlock, notices: list[str]) -> tuple[str, str]:
    """The row count and server milliseconds of the block's last notice of its results."""
    for message in reversed(notices):
        prefix, _, figures = message.partition(" ")
        if prefix == block.result_notice:
            rows, _, server_ms = figures.partition(" ")
            return rows, server_ms
    raise RuntimeError("the locked block ended without the notice of its results")
