"""What every :class:`~outboxkit.outbox.dialects.Dialect` must do, on its own database.

Each test runs once per supported database (the ``db_url`` fixture); a new dialect passes
these before any store uses it. The tables are outboxkit's own (``inbox_events``: a key of
three strings, plus the time in the id where the table is partitioned by it; ``dlq_replays``:
an upsert target), migrated by the fixture.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from outboxkit.consumers.inbox import inbox_key
from outboxkit.consumers.tables import inbox_events
from outboxkit.ops.dlq.tables import dlq_replays
from outboxkit.outbox.clock import read_db_now_ms
from outboxkit.outbox.db import make_async_engine, parse_url
from outboxkit.outbox.dialects import DIALECTS, Dialect, dialect_of
from outboxkit.outbox.dialects.base import LockedBlock, Refusal
from outboxkit.outbox.errors import UnsupportedDatabaseError
from outboxkit.outbox.locked import run_locked
from outboxkit.outbox.secrecy import sqlstate
from sqlalchemy import BigInteger, String, delete, func, insert, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from tests.support.waits import scaled


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_async_engine(db_url)
    yield engine
    await engine.dispose()


def _inbox_row(event_id: str, processed_ms: int = 1) -> dict[str, object]:
    return {"consumer": "c", "source": "/s", "event_id": event_id, "processed_ms": processed_ms}


async def test_every_way_to_name_the_database_finds_the_same_dialect(
    engine: AsyncEngine, db_url: str
) -> None:
    dialect = dialect_of(engine)
    assert dialect is DIALECTS[engine.dialect.name]
    async with engine.connect() as connection, AsyncSession(engine) as session:
        bounds = [connection, session, engine.sync_engine, engine.dialect, parse_url(db_url)]
        assert all(dialect_of(bound) is dialect for bound in bounds)
    assert dialect_of(dialect.name) is dialect
    assert engine.url.drivername == dialect.async_driver


def test_a_database_without_a_dialect_is_refused() -> None:
    with pytest.raises(UnsupportedDatabaseError, match="not 'mysql'"):
        dialect_of("mysql")


async def test_insert_or_skip_returns_the_row_it_inserted_and_nothing_when_it_skipped(
    engine: AsyncEngine,
) -> None:
    dialect = dialect_of(engine)
    key = inbox_key(dialect)
    statement = dialect.insert_or_skip(inbox_events, key, returning=[inbox_events.c.event_id])
    async with engine.begin() as connection:
        first = (await connection.execute(statement.values(_inbox_row("e-1", 5)))).all()
        again = (await connection.execute(statement.values(_inbox_row("e-1", 9)))).all()
        quiet = await connection.execute(
            dialect.insert_or_skip(inbox_events, key).values(_inbox_row("e-2"))
        )
        assert not quiet.returns_rows
    assert [tuple(row) for row in first] == [("e-1",)]
    assert again == []
    async with engine.connect() as connection:
        rows = (
            await connection.execute(select(inbox_events.c.event_id, inbox_events.c.processed_ms))
        ).all()
    assert sorted(tuple(row) for row in rows) == [("e-1", 5), ("e-2", 1)]  # the first kept


async def test_the_insert_construct_upserts(engine: AsyncEngine) -> None:
    dialect = dialect_of(engine)
    columns = dlq_replays.c
    row = {
        "dlq_topic": "t.dlq",
        "dlq_partition": 0,
        "dlq_offset": 7,
        "target_topic": "t",
        "replayed_ms": 1,
        "replayed_by": "first",
        "replay_id": "r-1",
    }
    async with engine.begin() as connection:
        for by in ("first", "second"):
            statement = dialect.insert(dlq_replays).values({**row, "replayed_by": by})
            await connection.execute(
                statement.on_conflict_do_update(
                    index_elements=["dlq_topic", "dlq_partition", "dlq_offset", "target_topic"],
                    set_={"replayed_by": statement.excluded.replayed_by},
                )
            )
    async with engine.connect() as connection:
        assert (await connection.execute(select(columns.replayed_by))).scalars().all() == ["second"]


async def test_a_skip_locked_claim_passes_over_rows_another_transaction_holds(
    engine: AsyncEngine,
) -> None:
    """On a database with row locks, a second claimant gets the rows the first did not lock;
    on a single-writer database there is no second claimant beside the first (its BEGIN
    waits), so a claim reads every row."""
    dialect = dialect_of(engine)
    async with engine.begin() as connection:
        await connection.execute(insert(inbox_events), [_inbox_row(f"e-{i}") for i in range(3)])
    ids = inbox_events.c.event_id
    oldest = select(ids).order_by(ids)
    async with engine.connect() as first, first.begin():
        held = (await first.execute(dialect.claim_skip_locked(oldest.limit(1)))).scalars()
        assert held.all() == ["e-0"]
        if dialect.single_writer:
            claimed = (await first.execute(dialect.claim_skip_locked(oldest))).scalars()
            assert claimed.all() == ["e-0", "e-1", "e-2"]
            return
        async with engine.connect() as second, second.begin():
            claimed = (await second.execute(dialect.claim_skip_locked(oldest))).scalars()
            assert claimed.all() == ["e-1", "e-2"]
            locked = await second.execute(dialect.lock(oldest.where(ids == "e-1")))
            assert locked.scalars().all() == ["e-1"]


async def test_the_database_clock_reads_within_a_second_of_this_process(
    engine: AsyncEngine,
) -> None:
    dialect = dialect_of(engine)
    async with engine.connect() as connection:
        before = time.time() * 1000
        read = await read_db_now_ms(connection)
        expression = await connection.scalar(select(dialect.now_ms()))
        after = time.time() * 1000
    assert before - 1000 <= read <= after + 1000
    assert expression is not None and abs(expression - read) < 1000


async def test_a_claim_chunk_of_keys_fits_in_one_statement(engine: AsyncEngine) -> None:
    """``claim_chunk`` rows of the inbox's key go in one multi-row INSERT (SQLite binds a
    parameter per value and older builds allow 999)."""
    dialect: Dialect = dialect_of(engine)
    rows = [_inbox_row(f"e-{i}") for i in range(dialect.claim_chunk)]
    statement = dialect.insert_or_skip(
        inbox_events, inbox_key(dialect), returning=[inbox_events.c.event_id]
    )
    async with engine.begin() as connection:
        inserted = (await connection.execute(statement.values(rows))).all()
        count = await connection.scalar(select(func.count()).select_from(inbox_events))
    assert len(inserted) == count == dialect.claim_chunk


async def test_an_in_list_parameter_selects_the_listed_rows_whatever_its_length(
    engine: AsyncEngine,
) -> None:
    dialect = dialect_of(engine)
    column = inbox_events.c.event_id
    async with engine.begin() as connection:
        await connection.execute(insert(inbox_events), [_inbox_row(f"e-{i}") for i in range(5)])
        listed = select(column).where(dialect.in_list(column, "ids", column.type)).order_by(column)
        for ids in (["e-1"], ["e-0", "e-3", "e-9"]):
            found = (await connection.execute(listed, {"ids": ids})).scalars().all()
            assert found == sorted(set(ids) - {"e-9"})


async def test_local_timeouts_last_until_the_transaction_ends(engine: AsyncEngine) -> None:
    """Selected first, they bound the transaction's later statements; the next transaction on
    the same connection has the session's settings again (PostgreSQL; none on SQLite)."""
    dialect = dialect_of(engine)
    timeouts = dialect.local_timeouts(150, 2500)
    if not timeouts:
        return  # a database without such settings: nothing to bound
    show = select(func.current_setting("lock_timeout"), func.current_setting("statement_timeout"))
    async with engine.connect() as connection:
        async with connection.begin():
            await connection.execute(select(*timeouts))
            assert tuple((await connection.execute(show)).one()) == ("150ms", "2500ms")
        async with connection.begin():
            assert tuple((await connection.execute(show)).one()) != ("150ms", "2500ms")


async def test_a_locked_block_runs_its_statements_as_one_and_sums_their_rows(
    engine: AsyncEngine,
) -> None:
    """Its statements commit together when it ends, on a connection that was outside a
    transaction and is back at its isolation level after it; the lock timeout it set is gone
    (PostgreSQL; elsewhere there is no block: the caller keeps its transaction)."""
    dialect = dialect_of(engine)
    insert_two = (
        "INSERT INTO inbox_events (consumer, source, event_id, processed_ms)"
        " VALUES ('c', '/s', 'e-8', 8), ('c', '/s', 'e-9', 9)"
    )
    block = dialect.locked_block(
        [insert_two, "DELETE FROM inbox_events WHERE processed_ms < 3"], lock_timeout_ms=150
    )
    assert (block is not None) == dialect.locked_blocks
    if block is None:
        return
    async with engine.begin() as connection:
        await connection.execute(
            insert(inbox_events), [_inbox_row(f"e-{i}", processed_ms=i) for i in range(5)]
        )
    async with engine.connect() as connection:
        held = await run_locked(connection, block)
        assert held.rows == 2 + 3
        assert await connection.get_isolation_level() == connection.default_isolation_level
        assert held.server_ms >= 0 and held.round_trip_ms >= 0
        async with connection.begin():  # a transaction again, with the session's settings
            assert await connection.scalar(select(func.current_setting("lock_timeout"))) != (
                "150ms"
            )
            found = await connection.execute(
                select(inbox_events.c.processed_ms).order_by(inbox_events.c.processed_ms)
            )
            assert found.scalars().all() == [3, 4, 8, 9]


async def test_a_locked_block_waits_for_a_lock_no_longer_than_its_lock_timeout(
    engine: AsyncEngine,
) -> None:
    """The timeout is in force before its first statement asks for its table's lock: behind
    an ACCESS EXCLUSIVE lock the block fails at once (lock_not_available) and changes
    nothing; the connection is usable after it."""
    dialect = dialect_of(engine)
    if not dialect.locked_blocks:
        return
    async with engine.begin() as connection:
        await connection.execute(insert(inbox_events), [_inbox_row("e-1", processed_ms=1)])
    block = dialect.locked_block(["DELETE FROM inbox_events"], lock_timeout_ms=100)
    assert block is not None
    async with engine.connect() as holder, engine.connect() as connection:
        await holder.execute(text("LOCK TABLE inbox_events IN ACCESS EXCLUSIVE MODE"))
        with pytest.raises(DBAPIError) as failed:
            await asyncio.wait_for(run_locked(connection, block), scaled(5))
        assert sqlstate(failed.value) == "55P03"
        await holder.rollback()
        async with connection.begin():
            assert await connection.scalar(select(func.count()).select_from(inbox_events)) == 1


async def test_a_refusal_fails_its_block_with_its_code_and_changes_nothing(
    engine: AsyncEngine,
) -> None:
    """A step that refuses where its condition holds: the statements before it are undone and
    the error carries its code; where it does not hold, it counts in none of the rows."""
    dialect = dialect_of(engine)
    if not dialect.locked_blocks:
        return
    async with engine.begin() as connection:
        await connection.execute(
            insert(inbox_events), [_inbox_row(f"e-{i}", processed_ms=i) for i in range(4)]
        )
    count = "(SELECT count(*) FROM inbox_events)"

    def deleting_below(below: int, refuse_over: int) -> LockedBlock:
        block = dialect.locked_block(
            [
                f"DELETE FROM inbox_events WHERE processed_ms < {below}",
                Refusal(f"{count} > {refuse_over}", "OBX99"),
            ],
            lock_timeout_ms=150,
        )
        assert block is not None
        return block

    async with engine.connect() as connection:
        with pytest.raises(DBAPIError) as refused:
            await run_locked(connection, deleting_below(1, refuse_over=2))
        assert sqlstate(refused.value) == "OBX99"
        assert await connection.scalar(select(func.count()).select_from(inbox_events)) == 4
        await connection.rollback()
        assert (await run_locked(connection, deleting_below(2, refuse_over=2))).rows == 2
        assert await connection.scalar(select(func.count()).select_from(inbox_events)) == 2


async def test_a_locked_block_takes_its_values_beside_its_text(engine: AsyncEngine) -> None:
    """A list of integers, an integer and a string (quotes and all) reach the statements as
    values; the block's text does not change with them."""
    dialect = dialect_of(engine)
    if not dialect.locked_blocks:
        return
    async with engine.begin() as connection:
        rows = [_inbox_row(f"e-{i}", processed_ms=i) for i in range(5)]
        await connection.execute(insert(inbox_events), [*rows, _inbox_row("o'e", 3)])
    columns = inbox_events.c
    statement = delete(inbox_events).where(
        dialect.in_block_list(columns.processed_ms, "v_listed"),
        columns.processed_ms < dialect.block_value("v_below", BigInteger()),
        columns.event_id != dialect.block_value("v_spared", String()),
    )
    async with engine.connect() as connection:
        sql = str(statement.compile(dialect=connection.dialect))
        blocks = [
            dialect.locked_block(
                [sql],
                lock_timeout_ms=100,
                values={"v_listed": listed, "v_below": 4, "v_spared": "o'e"},
            )
            for listed in ([1, 3, 9], [0, 1, 2, 3, 4])
        ]
        assert blocks[0] is not None and blocks[1] is not None
        assert blocks[0].sql == blocks[1].sql
        assert (await run_locked(connection, blocks[0])).rows == 2  # e-1, e-3
        async with connection.begin():
            left = await connection.execute(select(columns.event_id).order_by(columns.event_id))
            assert left.scalars().all() == ["e-0", "e-2", "e-4", "o'e"]
            # The values were the block's transaction's alone: nothing of them stays in the
            # session, where another block sent through a transaction-mode pooler could read
            # them instead of its own.
            stays = await connection.execute(
                text("SELECT current_setting('outboxkit.block_value_v_listed', true)")
            )
            assert stays.scalar() in (None, "")
