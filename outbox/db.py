"""Engines for outboxkit's own processes: URL driver selection and SQLite transaction set-up."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from outboxkit.outbox.errors import (
    InvalidDatabaseUrlError,
    NotMigratedError,
    UnsupportedDatabaseError,
)
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

_ASYNC_DRIVERS = {"postgresql": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite"}
_SYNC_DRIVERS = {"postgresql": "postgresql+psycopg", "sqlite": "sqlite"}
SQLITE_BUSY_TIMEOUT_MS = 30_000
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# The query parameter each PostgreSQL driver reads for TLS, and its "no TLS" value.
_NO_TLS = {"postgresql+asyncpg": ("ssl", "disable"), "postgresql+psycopg": ("sslmode", "disable")}


def async_url(url: str) -> str:
    """Return ``url`` with the async driver outboxkit uses for its backend."""
    return _with_driver(url, _ASYNC_DRIVERS)


def sync_url(url: str) -> str:
    """Return ``url`` with the sync driver outboxkit uses for its backend."""
    return _with_driver(url, _SYNC_DRIVERS)


def parse_url(url: str) -> URL:
    """``url`` parsed, for a backend outboxkit supports (PostgreSQL or SQLite, any driver).

    Raises :class:`InvalidDatabaseUrlError` for text that is no URL and
    :class:`UnsupportedDatabaseError` for another database; neither message shows a password.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        # ArgumentError's text repeats the URL, which may hold a password
        raise InvalidDatabaseUrlError(
            "invalid database URL: expected e.g. postgresql://user:password@host:5432/db "
            "or sqlite:///path/to/file.db"
        ) from None
    if parsed.get_backend_name() not in _ASYNC_DRIVERS:
        raise UnsupportedDatabaseError(
            f"unsupported database URL {parsed!r}: use postgresql:// or sqlite://"
        )
    return parsed


def _with_driver(url: str, drivers: dict[str, str]) -> str:
    parsed = parse_url(url)
    backend = parsed.get_backend_name()
    parsed = _without_loopback_tls(parsed.set(drivername=drivers[backend]))
    return parsed.render_as_string(hide_password=False)


def _without_loopback_tls(url: URL) -> URL:
    """Turn TLS off for a server on this host unless the URL asks for something else.

    The drivers' default ("prefer") negotiates TLS even over loopback, where it protects
    nothing and costs the relay about a quarter of its throughput (bench/README.md).
    """
    parameter = _NO_TLS.get(url.drivername)
    if parameter is None or url.host not in LOOPBACK_HOSTS:
        return url
    if "ssl" in url.query or "sslmode" in url.query:
        return url
    name, value = parameter
    return url.update_query_dict({name: value})


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create a sync engine; on SQLite, transactions begin with ``BEGIN IMMEDIATE``."""
    engine = create_engine(sync_url(url), **kwargs)
    if engine.dialect.name == "sqlite":
        _use_immediate_transactions(engine)
    return engine


def make_async_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """Create an async engine; on SQLite, transactions begin with ``BEGIN IMMEDIATE``."""
    engine = create_async_engine(async_url(url), **kwargs)
    if engine.dialect.name == "sqlite":
        _use_immediate_transactions(engine.sync_engine)
    return engine


def _use_immediate_transactions(engine: Engine) -> None:
    # pysqlite's own transaction handling defers BEGIN and then fails with "database is
    # locked" on upgrade; taking the write lock at BEGIN makes writers queue on busy_timeout.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def is_missing_table(error: BaseException) -> bool:
    """True when ``error`` is the database saying a table does not exist."""
    if not isinstance(error, DBAPIError):
        return False
    if getattr(error.orig, "sqlstate", None) == "42P01":  # PostgreSQL: undefined_table
        return True
    return "no such table" in str(error.orig)  # SQLite


async def require_tables(engine: AsyncEngine, names: Iterable[str]) -> None:
    """Raise :class:`NotMigratedError` naming the first of ``names`` missing from the database."""
    async with engine.connect() as connection:
        present = await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    for name in names:
        if name not in present:
            raise NotMigratedError(f"table {name} is missing: run 'outboxkit migrate' first")
