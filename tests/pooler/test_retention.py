"""Retention through PgBouncer in transaction mode (Debian's 1.18), each transaction on another
server connection: the outbox's and the inbox's passes remove what they should, pass after
pass, and report their figures (no session state is read back across transactions)."""

from __future__ import annotations

import logging

import pytest
from outboxkit.consumers import purge_inbox
from outboxkit.consumers.inbox_partitions import DAY_MS, purge_partitioned
from outboxkit.consumers.tables import inbox_events
from outboxkit.outbox.clock import read_db_now_ms
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay.retention import delete_published
from outboxkit.testing.pgbouncer import PgBouncer
from sqlalchemy import func, select

from tests.consumers.test_inbox_partitions import attach_day, claims_made
from tests.relay.test_retention import HOUR_MS, write_rows

PASSES = 5


async def test_outbox_retention_through_the_pooler_deletes_the_old_rows_pass_after_pass(
    pgbouncer: PgBouncer, pgbouncer_url: str
) -> None:
    url = f"{pgbouncer_url}?pooler=transaction"
    engine = make_async_engine(url)
    try:
        await pgbouncer.fill_pool(pgbouncer_url)
        for n in range(PASSES):
            write_rows(
                url,
                {"pending": 2, "parked": 1, "scheduled": 1, "recent": 3, "old": 7 + n},
            )
            deleted = await delete_published(engine, retention_ms=HOUR_MS, chunk=3)
            assert deleted == 7 + n, f"pass {n}"
        async with engine.connect() as connection:
            published = await connection.scalar(
                select(func.count()).where(outbox_events.c.published_ms.is_not(None))
            )
        assert published == 3 * PASSES  # the recent ones
    finally:
        await engine.dispose()


async def test_inbox_retention_through_the_pooler_drops_and_deletes_pass_after_pass(
    pgbouncer: PgBouncer, pgbouncer_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_async_engine(f"{pgbouncer_url}?pooler=transaction")
    caplog.set_level(logging.INFO, "outboxkit.consumer")
    try:
        await pgbouncer.fill_pool(pgbouncer_url)
        async with engine.connect() as connection:
            now = await read_db_now_ms(connection)
        day = (now - 10 * DAY_MS) // DAY_MS * DAY_MS
        await attach_day(engine, day)
        in_partition = await claims_made(engine, ("billing",), day + 1, 40, now - 9 * DAY_MS)
        removed = []
        for n in range(PASSES):
            # Claims in the default partition (a time no partition covers), made long ago.
            await claims_made(
                engine, ("billing",), day - DAY_MS + 1000 * n, 10 + n, now - 9 * DAY_MS
            )
            done = await purge_partitioned(
                engine, consumer="billing", window_ms=DAY_MS, chunk_size=4, ahead_ms=DAY_MS
            )
            assert not done.skipped, f"pass {n} skipped: {caplog.text}"
            removed.append(done.removed)
        async with engine.connect() as connection:
            left = await connection.scalar(select(func.count()).select_from(inbox_events))
        assert removed == [len(in_partition) + 10, 11, 12, 13, 14]
        assert left == 0
        assert await purge_inbox(engine, consumer="billing", older_than_s=DAY_MS / 1000) == 0
    finally:
        await engine.dispose()
