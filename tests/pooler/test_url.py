"""The database URL's ``pooler=transaction``: read and taken out before a driver sees it, and
every engine made from it works through PgBouncer in transaction mode."""

from __future__ import annotations

import asyncio

import pytest
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.errors import InvalidDatabaseUrlError
from outboxkit.outbox.pooler import PoolerSettingError, listen_url, pooler_setting
from outboxkit.testing.pgbouncer import PgBouncer
from sqlalchemy import text

URL = "postgresql://u:p@pooler:6432/app"


def test_the_setting_is_read_and_a_listen_host_is_where_listen_goes() -> None:
    assert not pooler_setting(URL).transaction
    assert pooler_setting(f"{URL}?pooler=transaction").transaction
    assert listen_url(URL) is not None and listen_url(URL).port == 6432  # type: ignore[union-attr]
    assert listen_url(f"{URL}?pooler=transaction") is None
    direct = listen_url(f"{URL}?pooler=transaction&listen_host=db:5433&sslmode=require")
    assert direct is not None
    assert (direct.host, direct.port, direct.database, direct.password) == ("db", 5433, "app", "p")
    assert dict(direct.query) == {"sslmode": "require"}


def test_a_libpq_multi_host_url_is_read_with_its_hosts() -> None:
    many = "postgresql://u:p@db1:5433,db2:5434/app?target_session_attrs=read-write"
    assert not pooler_setting(many).transaction
    direct = listen_url(many)
    assert direct is not None
    assert dict(direct.query) == {
        "target_session_attrs": "read-write",
        "host": "db1,db2",
        "port": "5433,5434",
    }


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("pooler=session", "pooler=session is not known: pooler=transaction is the one setting"),
        ("listen_host=db", "listen_host goes with pooler=transaction"),
        ("pooler=transaction&listen_host=db:x", "listen_host=db:x: expected HOST or HOST:PORT"),
        ("pooler=transaction&pooler=transaction", "the URL sets pooler more than once"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(query: str, message: str) -> None:
    with pytest.raises(InvalidDatabaseUrlError, match=message):
        make_async_engine(f"{URL}?{query}")


async def test_engines_from_the_url_work_through_the_pooler(
    pgbouncer: PgBouncer, pgbouncer_url: str
) -> None:
    url = f"{pgbouncer_url}?pooler=transaction"
    engine = make_async_engine(url, pool_size=10, max_overflow=0)
    try:
        await pgbouncer.fill_pool(pgbouncer_url)

        async def query(n: int, autocommit: bool) -> int:
            async with engine.connect() as connection:
                if autocommit:
                    await connection.execution_options(isolation_level="AUTOCOMMIT")
                value: int = (
                    await connection.execute(text("SELECT :n + 1"), {"n": n})
                ).scalar_one()
                await connection.commit()
                return value

        results = await asyncio.gather(*(query(n, n % 2 == 0) for n in range(200)))
    finally:
        await engine.dispose()
    assert results == [n + 1 for n in range(200)]
    sync = make_engine(url)
    try:
        with sync.connect() as connection:  # psycopg prepares a statement run 5 times: not here
            assert [
                connection.execute(text("SELECT :n"), {"n": n}).scalar() for n in range(20)
            ] == list(range(20))
    finally:
        sync.dispose()


async def test_without_the_setting_an_engines_failure_through_the_pooler_names_it(
    pgbouncer: PgBouncer, pgbouncer_url: str
) -> None:
    engine = make_async_engine(pgbouncer_url, pool_size=10, max_overflow=0)
    try:
        await pgbouncer.fill_pool(pgbouncer_url)

        async def query(n: int) -> int:
            async with engine.connect() as connection:
                await connection.execution_options(isolation_level="AUTOCOMMIT")
                value: int = (
                    await connection.execute(text("SELECT :n + 2"), {"n": n})
                ).scalar_one()
                return value

        results = await asyncio.gather(*(query(n) for n in range(100)), return_exceptions=True)
    finally:
        await engine.dispose()
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures, "100 statements through PgBouncer without the setting all passed"
    assert {type(f) for f in failures} == {PoolerSettingError}, failures[0]
    assert all("add pooler=transaction to the database URL" in str(f) for f in failures)
