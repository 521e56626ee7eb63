"""``DriverSession``: one statement on the driver's own connection, committed alone, its
failures raised as SQLAlchemy's errors (parameters hidden), a lost connection never pooled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.driver import DriverSession, driver_session, send_script
from outboxkit.outbox.secrecy import sqlstate
from sqlalchemy import (
    Boolean,
    Column,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    bindparam,
    func,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlalchemy.sql.expression import ClauseElement

from tests.support.kafka import wait_for

notes = Table(
    "driver_notes",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("name", String(40), unique=True, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("flag", Boolean, nullable=False),
)
SECRET = b"card 4111-1111-1111-1111"


@pytest.fixture
async def engine(pg_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_async_engine(pg_url, pool_size=1, max_overflow=0)
    async with engine.begin() as connection:
        await connection.run_sync(notes.metadata.create_all)
    yield engine
    async with engine.begin() as connection:
        await connection.run_sync(notes.metadata.drop_all)
    await engine.dispose()


def _insert(skip_existing: bool) -> ClauseElement:
    statement = postgresql.insert(notes).values(
        name=bindparam("name"), payload=bindparam("payload"), flag=False
    )
    if skip_existing:
        statement = statement.on_conflict_do_nothing(index_elements=["name"])
    return statement.returning(notes.c.id, notes.c.name, notes.c.flag)


INSERT_OR_SKIP = _insert(skip_existing=True)
INSERT = _insert(skip_existing=False)


async def _count(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        return int((await connection.execute(select(func.count()).select_from(notes))).scalar())


async def test_a_statement_commits_alone_and_returns_its_row(engine: AsyncEngine) -> None:
    driver = DriverSession(engine)
    row = await driver.first(INSERT_OR_SKIP, {"name": "a", "payload": SECRET})
    assert row is not None and row["name"] == "a" and row["flag"] is False
    assert await _count(engine) == 1  # committed: another connection reads it
    assert await driver.first(INSERT_OR_SKIP, {"name": "a", "payload": b"?"}) is None
    assert await _count(engine) == 1


async def test_a_database_error_is_sqlalchemys_with_its_sqlstate_and_no_parameters(
    engine: AsyncEngine,
) -> None:
    driver = DriverSession(engine)
    await driver.first(INSERT, {"name": "a", "payload": SECRET})
    with pytest.raises(DBAPIError) as raised:
        await driver.first(INSERT, {"name": "a", "payload": SECRET})
    assert sqlstate(raised.value) == "23505"  # unique_violation
    assert not raised.value.connection_invalidated
    assert "4111" not in str(raised.value) and "4111" not in repr(raised.value)
    assert await _count(engine) == 1  # the failed statement left nothing
    # the connection went back to the pool usable: the pool has one
    assert await driver.first(INSERT, {"name": "b", "payload": b"x"}) is not None


async def test_a_connection_lost_under_a_statement_is_invalidated_not_pooled(
    engine: AsyncEngine,
) -> None:
    driver = DriverSession(engine)
    suicide = select(func.pg_terminate_backend(func.pg_backend_pid()))
    with pytest.raises(DBAPIError) as raised:
        await driver.first(suicide, {})
    assert raised.value.connection_invalidated
    # the pool's one connection was replaced, not handed out closed
    assert await driver.first(INSERT, {"name": "c", "payload": b"x"}) is not None
    assert await _count(engine) == 1


async def test_a_missing_parameter_is_refused_before_anything_is_sent(
    engine: AsyncEngine,
) -> None:
    with pytest.raises(KeyError, match="payload"):
        await DriverSession(engine).first(INSERT, {"name": "a"})
    assert await _count(engine) == 0


async def test_only_postgresql_sessions_get_a_driver_session(pg_url: str, sqlite_url: str) -> None:
    for url, expected in ((pg_url, True), (sqlite_url, False)):
        engine = make_async_engine(url)
        try:
            assert (driver_session(async_sessionmaker(engine)) is not None) is expected
            async with engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
        finally:
            await engine.dispose()
    assert driver_session(lambda: None) is None  # type: ignore[arg-type]  # no engine to use


async def test_a_statement_cancelled_in_flight_is_not_pooled_half_read(
    engine: AsyncEngine, pg_url: str
) -> None:
    """Cancelled while the server runs it: the connection is dropped (its reply may still be
    on the way), and the next statement runs on a new one (another backend)."""
    driver = DriverSession(engine)
    backend = select(func.pg_backend_pid())
    before = (await driver.first(backend, {}))[0]
    task = asyncio.ensure_future(driver.first(select(func.pg_sleep(30)), {}))
    watcher = make_async_engine(pg_url, pool_size=1, max_overflow=0)
    try:

        async def sleeping() -> bool:
            async with watcher.connect() as connection:
                found = await connection.execute(
                    text("SELECT 1 FROM pg_stat_activity WHERE pid = :pid AND state = 'active'"),
                    {"pid": before},
                )
                return found.first() is not None

        await wait_for(sleeping, bool, 10, "the statement running on the server")
    finally:
        await watcher.dispose()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    after = (await driver.first(backend, {}))[0]
    assert after != before


async def test_a_script_is_one_transaction_its_local_settings_bound_it(
    engine: AsyncEngine, pg_url: str
) -> None:
    """``SET LOCAL`` in a script holds for its statements only; a lock it cannot get within
    the script's lock timeout fails the whole script, SQLSTATE 55P03, and nothing of it stays."""
    driver = DriverSession(engine)
    for name in ("a", "b", "c"):
        await driver.first(INSERT, {"name": name, "payload": b"x"})
    delete_a = "DELETE FROM driver_notes WHERE name = 'a'"
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        status = await send_script(connection, f"SET LOCAL lock_timeout = '100ms'; {delete_a}")
        assert status == "DELETE 1"
        assert (await connection.execute(text("SHOW lock_timeout"))).scalar() == "0"
    holder = make_async_engine(pg_url)
    try:
        async with holder.connect() as holding, holding.begin():
            await holding.execute(text("SELECT 1 FROM driver_notes WHERE name = 'c' FOR UPDATE"))
            async with engine.connect() as connection:
                await connection.execution_options(isolation_level="AUTOCOMMIT")
                script = (
                    "SET LOCAL lock_timeout = '100ms';"
                    " DELETE FROM driver_notes WHERE name = 'b';"
                    " DELETE FROM driver_notes WHERE name = 'c'"
                )
                with pytest.raises(DBAPIError) as raised:
                    await send_script(connection, script)
                assert sqlstate(raised.value) == "55P03"  # lock_not_available
    finally:
        await holder.dispose()
    assert await _count(engine) == 2  # b and c: the failed script deleted neither
