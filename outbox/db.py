"""Engines for outboxkit's own processes: URL driver selection, PostgreSQL TLS, SQLite set-up.

A database URL spells TLS the libpq way, whatever its driver: ``sslmode`` (``disable``,
``allow``, ``prefer``, ``require``, ``verify-ca``, ``verify-full``), ``sslrootcert`` (a CA file,
or ``system`` for the system's trust store), ``sslcert`` and ``sslkey`` (a client certificate).
``ssl=<mode>``, asyncpg's spelling, is read as ``sslmode``. :func:`pg_tls` reads them once and
every connection outboxkit makes is configured from that one reading: psycopg gets the libpq
parameters as they are, asyncpg (engines and the relay's LISTEN connection) gets ``ssl=`` as a
mode or an :class:`ssl.SSLContext` built from the files.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from outboxkit.outbox.dialects import DIALECTS, Dialect, dialect_of
from outboxkit.outbox.errors import (
    InvalidDatabaseUrlError,
    NotMigratedError,
    UnsupportedDatabaseError,
)
from outboxkit.outbox.extras import require
from outboxkit.outbox.hosts import (
    DEFAULT_CONNECT_TIMEOUT_S,
    MULTI_HOST_EXAMPLE,
    connect_in_turn,
    engine_url,
    pg_address,
    with_libpq_hosts_read,
)
from outboxkit.outbox.pooler import use_pooler_setting
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

SQLITE_BUSY_TIMEOUT_MS = 30_000
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# The URL query parameters that are about TLS; none of them reaches a driver as written.
TLS_PARAMETERS = ("sslmode", "ssl", "sslrootcert", "sslcert", "sslkey")
_SSL_ALIASES = {"true": "require", "false": "disable"}


@dataclass(frozen=True)
class PgTls:
    """The TLS settings of a PostgreSQL URL, read the libpq way (see the module docstring).

    ``mode`` is ``None`` when the URL leaves it to the driver (``prefer``).
    """

    mode: str | None = None
    rootcert: str | None = None
    cert: str | None = None
    key: str | None = None

    def libpq_query(self) -> dict[str, str]:
        """The libpq parameters (psycopg's spelling, and asyncpg's DSN spelling)."""
        pairs = {
            "sslmode": self.mode,
            "sslrootcert": self.rootcert,
            "sslcert": self.cert,
            "sslkey": self.key,
        }
        return {name: value for name, value in pairs.items() if value is not None}

    def asyncpg_ssl(self) -> ssl.SSLContext | str | None:
        """What asyncpg's ``ssl=`` needs: ``None`` (its default), a mode, or a context.

        A mode alone is passed as it is (asyncpg applies libpq's rules and its ``~/.postgresql``
        defaults); with files, the context follows libpq: ``require`` with a root certificate
        verifies the chain like ``verify-ca``; only ``verify-full`` checks the host name.
        """
        if self.mode == "disable" or not (self.rootcert or self.cert):
            return self.mode
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = self.mode == "verify-full"
        rootcert = self.rootcert
        if rootcert is None and self.mode in ("verify-ca", "verify-full"):
            rootcert = os.path.expanduser("~/.postgresql/root.crt")  # libpq's default
        if rootcert is None or self.mode not in ("require", "verify-ca", "verify-full"):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            try:
                if rootcert == "system":
                    context.load_default_certs()
                else:
                    context.load_verify_locations(cafile=rootcert)
            except (OSError, ssl.SSLError) as error:
                raise InvalidDatabaseUrlError(f"sslrootcert {rootcert}: {_reason(error)}") from None
            context.verify_mode = ssl.CERT_REQUIRED
        if self.cert is not None:
            try:
                context.load_cert_chain(self.cert, keyfile=self.key)
            except (OSError, ssl.SSLError) as error:
                raise InvalidDatabaseUrlError(
                    f"sslcert {self.cert} / sslkey {self.key}: {_reason(error)}"
                ) from None
        return context


def pg_tls(url: str | URL) -> PgTls:
    """Read the TLS parameters of a PostgreSQL URL (:class:`InvalidDatabaseUrlError` if bad).

    A server on this host (127.0.0.1, localhost, ::1) gets ``sslmode=disable`` unless the URL
    says something about TLS: over loopback TLS protects nothing and costs the relay about a
    quarter of its throughput (bench/README.md).
    """
    parsed = make_url(with_libpq_hosts_read(url)) if isinstance(url, str) else url
    query = {name: _single(parsed, name) for name in TLS_PARAMETERS if name in parsed.query}
    mode = query.get("sslmode")
    alias = query.get("ssl")
    if alias is not None:
        alias = _SSL_ALIASES.get(alias.lower(), alias)
        if mode is not None and mode != alias:
            raise InvalidDatabaseUrlError(
                f"the URL sets both sslmode={mode} and ssl={alias}: keep one"
            )
        mode = alias
    if mode is not None and mode not in SSL_MODES:
        raise InvalidDatabaseUrlError(f"sslmode={mode} is not one of {', '.join(SSL_MODES)}")
    tls = PgTls(mode, query.get("sslrootcert"), query.get("sslcert"), query.get("sslkey"))
    if tls.key is not None and tls.cert is None:
        raise InvalidDatabaseUrlError("sslkey needs sslcert (the client certificate) too")
    for name, path in (("sslrootcert", tls.rootcert), ("sslcert", tls.cert), ("sslkey", tls.key)):
        if path is not None and path != "system" and not os.access(path, os.R_OK):
            raise InvalidDatabaseUrlError(f"{name} file {path} does not exist or cannot be read")
    if tls == PgTls() and pg_address(parsed).loopback_only:
        return PgTls("disable")
    return tls


def _single(url: URL, name: str) -> str:
    value = url.query[name]
    if isinstance(value, tuple):
        raise InvalidDatabaseUrlError(f"the URL sets {name} more than once")
    return value


def _reason(error: BaseException) -> str:
    return getattr(error, "strerror", None) or str(error).splitlines()[0]


def async_url(url: str) -> str:
    """Return ``url`` with the async driver outboxkit uses, TLS spelled the libpq way.

    :func:`make_async_engine` hands the TLS parameters to asyncpg as it expects them; a URL
    from here given to ``create_async_engine`` directly needs :func:`asyncpg_connect_args`.
    """
    return _with_driver(url, lambda dialect: dialect.async_driver)


def sync_url(url: str) -> str:
    """Return ``url`` with the sync driver outboxkit uses (psycopg reads libpq's parameters)."""
    return _with_driver(url, lambda dialect: dialect.sync_driver)


def parse_url(url: str) -> URL:
    """``url`` parsed, for a backend outboxkit supports (PostgreSQL or SQLite, any driver).

    Several PostgreSQL hosts may be written in any of the forms :mod:`outboxkit.outbox.hosts`
    reads (libpq's ``h1:p1,h2:p2`` comes back as ``host=h1,h2&port=p1,p2``). Raises
    :class:`InvalidDatabaseUrlError` for text that is no URL and
    :class:`UnsupportedDatabaseError` for another database; neither message shows a password.
    """
    try:
        parsed = make_url(with_libpq_hosts_read(url))
    except InvalidDatabaseUrlError:
        raise
    except (ArgumentError, ValueError):
        # ArgumentError's text repeats the URL, which may hold a password
        raise InvalidDatabaseUrlError(
            "invalid database URL: expected e.g. postgresql://user:password@host:5432/db, "
            f"{MULTI_HOST_EXAMPLE} for several hosts, or sqlite:///path/to/file.db"
        ) from None
    if parsed.get_backend_name() not in DIALECTS:
        raise UnsupportedDatabaseError(
            f"unsupported database URL {parsed!r}: use postgresql:// or sqlite://"
        )
    return parsed


def _with_driver(url: str, driver: Callable[[Dialect], str]) -> str:
    parsed = parse_url(url)
    dialect = dialect_of(parsed)
    parsed = parsed.set(drivername=driver(dialect))
    if dialect.url_tls:
        parsed = engine_url(pg_address(parsed))
        tls = pg_tls(parsed)
        parsed = parsed.difference_update_query(TLS_PARAMETERS).update_query_dict(tls.libpq_query())
    return parsed.render_as_string(hide_password=False)


def asyncpg_connect_args(url: str | URL) -> dict[str, Any]:
    """asyncpg's TLS keyword arguments for a PostgreSQL URL: ``{"ssl": ...}`` or nothing."""
    ssl_value = pg_tls(url).asyncpg_ssl()
    return {} if ssl_value is None else {"ssl": ssl_value}


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create a sync engine; on SQLite, transactions begin with ``BEGIN IMMEDIATE``.

    On PostgreSQL a connection attempt gives up after the URL's ``connect_timeout`` (libpq's,
    per host), else :data:`~outboxkit.outbox.hosts.DEFAULT_CONNECT_TIMEOUT_S`, and the URL's
    ``pooler=transaction`` is read (:mod:`outboxkit.outbox.pooler`).
    """
    url = sync_url(url)
    _require_driver(url, sync=True)
    engine = create_engine(url, **kwargs)
    dialect = dialect_of(engine)
    if dialect.single_writer:
        _use_immediate_transactions(engine)
    elif dialect.url_tls:
        _bound_libpq_connects(engine)
        use_pooler_setting(engine, sync=True)
    return engine


def make_async_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """Create an async engine; on SQLite, transactions begin with ``BEGIN IMMEDIATE``.

    On PostgreSQL the URL keeps its libpq-style TLS parameters, ``target_session_attrs`` and
    ``connect_timeout`` (``engine.url`` shows them, and the LISTEN connections read them from
    there); each connection gets them translated for asyncpg. An ``ssl`` or ``timeout`` in
    ``connect_args`` wins over the URL. A connection attempt gives up after the URL's
    ``connect_timeout``, else :data:`~outboxkit.outbox.hosts.DEFAULT_CONNECT_TIMEOUT_S`; with
    several hosts, per host (:func:`~outboxkit.outbox.hosts.connect_in_turn`).
    The URL's ``pooler=transaction`` (:mod:`outboxkit.outbox.pooler`) makes every connection
    safe behind a transaction pooler.
    """
    url = async_url(url)
    _require_driver(url, sync=False)
    engine = create_async_engine(url, **kwargs)
    dialect = dialect_of(engine)
    if dialect.single_writer:
        _use_immediate_transactions(engine.sync_engine)
    elif dialect.url_tls:
        _configure_asyncpg(engine.sync_engine, asyncpg_connect_args(engine.url))
        use_pooler_setting(engine.sync_engine, sync=False)
    return engine


def _require_driver(url: str, *, sync: bool) -> None:
    """Raise :class:`MissingExtraError` naming the extra when the driver is not installed."""
    dialect = dialect_of(make_url(url))
    if dialect.drivers_extra is not None:
        module = dialect.sync_module if sync else dialect.async_module
        require(module, dialect.drivers_extra, dialect.title)


def _configure_asyncpg(engine: Engine, tls_args: dict[str, Any]) -> None:
    """TLS, the connect timeout and several hosts, translated from libpq's spelling."""
    timeout_s = pg_address(engine.url).timeout_or(DEFAULT_CONNECT_TIMEOUT_S)

    @event.listens_for(engine, "do_connect")
    def _on_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        given = cparams.get("ssl")  # from connect_args: async_url leaves no ssl in the URL
        for name in TLS_PARAMETERS:
            cparams.pop(name, None)
        cparams.update(tls_args if given is None else {"ssl": given})
        cparams.pop("connect_timeout", None)  # asyncpg calls it timeout
        cparams.setdefault("timeout", timeout_s)
        if isinstance(cparams.get("host"), list):  # several hosts: the dialect made lists
            cparams.setdefault("async_creator_fn", connect_in_turn)


def _bound_libpq_connects(engine: Engine) -> None:
    @event.listens_for(engine, "do_connect")
    def _on_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        cparams.setdefault("connect_timeout", round(DEFAULT_CONNECT_TIMEOUT_S))


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
