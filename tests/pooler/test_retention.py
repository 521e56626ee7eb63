"""Retention through PgBouncer in transaction mode (Debian's 1.18), each transaction on another
server connection: the outbox's and the inbox's passes remove what they should, pass after
pass, and report their figures (no session state is read back across transactions)."""

from __future__ import annotations

import asyncio
import logging
import uuid

import psycopg
import pytest
from outboxkit.consumers import purge_inbox
from outboxkit.consumers.inbox_partitions import (
    _MAINTAINER_LOCK,
    DAY_MS,
    OTHER_PASS,
    SKIPS_WARNED,
    purge_partitioned,
)
from outboxkit.consumers.tables import inbox_events
from outboxkit.outbox.clock import read_db_now_ms
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay.retention import delete_published
from outboxkit.testing.pgbouncer import PgBouncer
from prometheus_client import REGISTRY
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


async def test_concurrent_passes_through_the_pooler_never_fail_and_leave_nothing_behind(
    pgbouncer: PgBouncer, pgbouncer_url: str
) -> None:
    engine = make_async_engine(f"{pgbouncer_url}?pooler=transaction", pool_size=8)
    try:
        await pgbouncer.fill_pool(pgbouncer_url)
        async with engine.connect() as connection:
            now = await read_db_now_ms(connection)
        for n in range(3):
            day = (now - (10 + n) * DAY_MS) // DAY_MS * DAY_MS
            await attach_day(engine, day)
            await claims_made(engine, ("billing",), day + 1, 30, now - 9 * DAY_MS)
            await claims_made(engine, ("billing",), day - 5 * DAY_MS, 7, now - 9 * DAY_MS)
            passes = await asyncio.gather(
                *(
                    purge_partitioned(
                        engine, consumer="billing", window_ms=DAY_MS, chunk_size=4, ahead_ms=DAY_MS
                    )
                    for _ in range(4)
                )
            )
            assert sum(p.removed for p in passes) == 37, passes
        async with engine.connect() as connection:
            left = await connection.scalar(select(func.count()).select_from(inbox_events))
        assert left == 0
    finally:
        await engine.dispose()


async def test_skipped_passes_say_why_count_and_warn_when_skipped_again_and_again(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = f"c{uuid.uuid4().hex[:8]}"
    labels = {"consumer": consumer}
    engine = make_async_engine(pg_url)
    caplog.set_level(logging.INFO, "outboxkit.consumer")
    try:
        with psycopg.connect(pg_url) as holder:
            # Another maintainer inside a step: the lock held by its transaction.
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (_MAINTAINER_LOCK,))
            for _ in range(SKIPS_WARNED):
                done = await purge_partitioned(
                    engine, consumer=consumer, window_ms=DAY_MS, chunk_size=4, ahead_ms=DAY_MS
                )
                assert done.skipped == OTHER_PASS
            holder.rollback()
        lines = [
            (r.levelname, r.getMessage()) for r in caplog.records if consumer in r.getMessage()
        ]
        assert lines[:-1] == [
            ("INFO", f"inbox retention pass of {consumer} skipped: {OTHER_PASS}")
        ] * (SKIPS_WARNED - 1)
        assert lines[-1][0] == "WARNING"
        assert f"skipped {SKIPS_WARNED} passes in a row: {OTHER_PASS}" in lines[-1][1]
        assert REGISTRY.get_sample_value("outboxkit_inbox_retention_skipped_total", labels) == 5
        gauge = "outboxkit_inbox_retention_skipped_in_a_row"
        assert REGISTRY.get_sample_value(gauge, labels) == SKIPS_WARNED
        done = await purge_partitioned(
            engine, consumer=consumer, window_ms=DAY_MS, chunk_size=4, ahead_ms=DAY_MS
        )
        assert done.skipped is None and done.created
        assert REGISTRY.get_sample_value(gauge, labels) == 0
    finally:
        await engine.dispose()
