"""bench.growth's transaction timer counts a locked block, one statement in autocommit, as a
lock hold of its whole round trip, named by its locking statement."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from outboxkit.outbox.dialects import POSTGRESQL
from outboxkit.outbox.locked import run_locked
from outboxkit.relay.retention import delete_published
from sqlalchemy import text

from bench.growth_tables import WAL_SETTINGS, disk_writes, timed_engine, wal_stats
from tests.relay.test_retention import HOUR_MS, write_rows


async def test_a_locked_block_is_one_lock_hold_named_by_its_statement(pg_url: str) -> None:
    write_rows(pg_url, {"pending": 0, "parked": 0, "scheduled": 0, "recent": 0, "old": 3})
    engine, timer = timed_engine(pg_url)
    try:
        assert await delete_published(engine, retention_ms=HOUR_MS, chunk=100) == 3
        transactions, locks = timer.take()
        # The read of the ids (a transaction, no lock) and the block with its values in one
        # message (its figures come back in its own reply): the block alone holds locks.
        assert len(transactions) == 2 and len(locks) == 1
        assert timer.longest_holds(5)[0][1].startswith("DO: DELETE FROM outbox_events")
        block = POSTGRESQL.locked_block(
            ["LOCK TABLE outbox_events IN EXCLUSIVE MODE"], lock_timeout_ms=100
        )
        assert block is not None
        async with engine.connect() as connection:
            await run_locked(connection, block)
            async with connection.begin():  # a plain transaction still counts as before
                await connection.execute(text("DELETE FROM outbox_events"))
        transactions, locks = timer.take()
        assert len(transactions) == 2 and len(locks) == 2
        named = sorted(statement for _, statement in timer.longest_holds(5))
        assert named[0] == "DELETE FROM outbox_events"
        assert named[1].startswith("DO: DELETE FROM outbox_events WHERE outbox_events.id")
        assert named[2] == "DO: LOCK TABLE outbox_events IN EXCLUSIVE MODE"
        assert all(held >= 0 for held in locks)
    finally:
        await engine.dispose()


async def test_the_wal_reading_counts_what_the_server_wrote_between_two_readings(
    pg_url: str,
) -> None:
    """Rows written between two readings show as WAL bytes; the settings are named."""
    before = await wal_stats(pg_url)
    write_rows(pg_url, {"pending": 0, "parked": 0, "scheduled": 0, "recent": 0, "old": 200})
    after = await wal_stats(pg_url)
    assert after.wal_bytes > before.wal_bytes
    assert set(after.settings) == set(WAL_SETTINGS)
    assert "max_wal_size" in after.since(before) and "MiB of WAL" in after.since(before)


def test_the_disk_reading_counts_a_file_written_and_synced() -> None:
    """4 MiB written and fsynced (in the home directory: /tmp may be in memory) between two
    readings show as at least that many bytes written."""
    if not Path("/sys/block").is_dir():
        pytest.skip("no /sys/block on this machine")
    before = disk_writes()
    with tempfile.NamedTemporaryFile(dir=Path.home()) as written:
        written.write(os.urandom(4 * 2**20))
        written.flush()
        os.fsync(written.fileno())
        after = disk_writes()
    assert after.bytes - before.bytes >= 4 * 2**20 and after.ios > before.ios
    assert "write IOs" in after.since(before, 1.0)
