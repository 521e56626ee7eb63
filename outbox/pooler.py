"""Behind a transaction pooler (PgBouncer's ``pool_mode = transaction``): the database URL's
``pooler=transaction``.

Through such a pooler each transaction may run on another server connection, so nothing may
outlive a transaction on the server: a named prepared statement made in one is missing (or
already there, made by another client) in the next. With ``pooler=transaction`` in the URL,
every connection outboxkit makes from it prepares none: asyncpg's statement cache is off
(``statement_cache_size=0``: its statements are the unnamed one, parsed again at each
execution), SQLAlchemy's too (``prepared_statement_cache_size=0``, and its statements are
asyncpg's unnamed one as well), psycopg never prepares (``prepare_threshold=None``). LISTEN
needs a session of its own: it goes to ``listen_host=HOST:PORT`` (the server itself, with the
URL's user, password and database) when the URL gives one, and otherwise is not tried (the
listeners poll, :func:`listen_url`).

Both parameters are outboxkit's own: they are taken out before the URL reaches a driver.
Without the setting, the pooler's "prepared statement ... does not exist" (or "already
exists") is raised as a :class:`PoolerSettingError`, one line naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from outboxkit.outbox.errors import InvalidDatabaseUrlError, OutboxError
from outboxkit.outbox.hosts import with_libpq_hosts_read
from sqlalchemy import Engine, event
from sqlalchemy.engine import URL, make_url

POOLER = "pooler"
LISTEN_HOST = "listen_host"
PARAMETERS = (POOLER, LISTEN_HOST)
"""The URL query parameters that are outboxkit's, never a driver's."""
TRANSACTION = "transaction"
HINT = (
    "add pooler=transaction to the database URL when it goes through a transaction pooler"
    " (PgBouncer pool_mode = transaction; docs/deploy.md)"
)
# asyncpg's errors (and PostgreSQL's codes) for a named prepared statement that a pooler made
# on another server connection, or that another client made on this one.
_MISSING_STATEMENT = "26000"  # invalid_sql_statement_name
_DUPLICATE_STATEMENT = "42P05"  # duplicate_prepared_statement


class PoolerSettingError(OutboxError):
    """A prepared statement failed the way it does through a transaction pooler whose URL lacks
    ``pooler=transaction``: the message says so in one line (the driver's error is
    ``__cause__``)."""


@dataclass(frozen=True)
class PoolerSetting:
    """A URL's pooler parameters: ``transaction`` when it goes through a transaction pooler,
    and the server's address for LISTEN (``listen_host``, ``None`` when not given)."""

    transaction: bool = False
    listen_host: str | None = None
    listen_port: int | None = None

    def asyncpg_args(self) -> dict[str, Any]:
        """``asyncpg.connect`` keyword arguments: its statement cache off behind a pooler."""
        return {"statement_cache_size": 0} if self.transaction else {}

    def async_engine_args(self) -> dict[str, Any]:
        """``connect_args`` of a SQLAlchemy ``postgresql+asyncpg`` engine: asyncpg's and
        SQLAlchemy's statement caches off, and SQLAlchemy's statements asyncpg's unnamed one
        (a named one, even with a unique name, is missing when the pooler runs its execution
        on another server connection, and stays on the one it was made on)."""
        if not self.transaction:
            return {}
        return {
            **self.asyncpg_args(),
            "prepared_statement_cache_size": 0,
            "prepared_statement_name_func": _unnamed,
        }

    def sync_engine_args(self) -> dict[str, Any]:
        """``connect_args`` of a psycopg engine: it never prepares a statement."""
        return {"prepare_threshold": None} if self.transaction else {}


def _unnamed() -> str:
    return ""


def pooler_setting(url: str | URL) -> PoolerSetting:
    """Read a URL's pooler parameters (:class:`InvalidDatabaseUrlError`, one line, if bad)."""
    query = _parsed(url).query
    mode = _single(query, POOLER)
    if mode is not None and mode != TRANSACTION:
        raise InvalidDatabaseUrlError(
            f"{POOLER}={mode} is not known: {POOLER}={TRANSACTION} is the one setting"
            " (a session pooler needs none)"
        )
    listen = _single(query, LISTEN_HOST)
    if listen is not None and mode is None:
        raise InvalidDatabaseUrlError(f"{LISTEN_HOST} goes with {POOLER}={TRANSACTION}")
    host, port = None, None
    if listen is not None:
        host, _, port_text = listen.rpartition(":") if ":" in listen else (listen, "", "")
        if not host or (port_text and not port_text.isdigit()):
            raise InvalidDatabaseUrlError(f"{LISTEN_HOST}={listen}: expected HOST or HOST:PORT")
        port = int(port_text) if port_text else None
    return PoolerSetting(mode == TRANSACTION, host, port)


def _parsed(url: str | URL) -> URL:
    # libpq's multi-host authority (h1:p1,h2:p2) is more than make_url reads.
    return make_url(with_libpq_hosts_read(url)) if isinstance(url, str) else url


def _single(query: Mapping[str, str | tuple[str, ...]], name: str) -> str | None:
    value = query.get(name)
    if isinstance(value, tuple):
        raise InvalidDatabaseUrlError(f"the URL sets {name} more than once")
    return value


def without_pooler(url: str | URL) -> URL:
    """``url`` without outboxkit's pooler parameters: what a driver may be given."""
    return _parsed(url).difference_update_query(PARAMETERS)


def listen_url(url: str | URL) -> URL | None:
    """Where a LISTEN connection goes for ``url``: the URL itself without a pooler; behind a
    transaction pooler the server at ``listen_host`` (same user, password and database), or
    ``None`` when the URL gives none (LISTEN through the pooler would hear nothing)."""
    setting = pooler_setting(url)
    direct = without_pooler(url)
    if not setting.transaction:
        return direct
    if setting.listen_host is None:
        return None
    return direct.set(host=setting.listen_host, port=setting.listen_port or 5432)


def pooler_error(error: BaseException) -> PoolerSettingError | None:
    """The one-line error for a driver error that a transaction pooler causes to named
    prepared statements (``None`` for any other error)."""
    orig = getattr(error, "orig", None) or error
    cause = getattr(orig, "__cause__", None)  # SQLAlchemy's adapted errors wrap asyncpg's
    for candidate in (orig, cause):
        code = getattr(candidate, "sqlstate", None)
        if code in (_MISSING_STATEMENT, _DUPLICATE_STATEMENT) and "prepared statement" in str(
            candidate
        ):
            what = "does not exist" if code == _MISSING_STATEMENT else "already exists"
            return PoolerSettingError(f"a prepared statement {what} on the server: {HINT}")
    return None


def use_pooler_setting(engine: Engine, *, sync: bool) -> None:
    """Configure every connection of ``engine`` (the sync engine of an async one, ``sync``
    false) from its URL's pooler setting: the parameters taken out of what the driver gets,
    its statements none a pooler can lose (``connect_args`` given by the caller win); and a
    prepared statement failure a pooler causes raised as a :class:`PoolerSettingError`."""
    setting = pooler_setting(engine.url)
    extra = setting.sync_engine_args() if sync else setting.async_engine_args()

    @event.listens_for(engine, "do_connect")
    def _on_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        for name in PARAMETERS:
            cparams.pop(name, None)
        for name, value in extra.items():
            cparams.setdefault(name, value)

    @event.listens_for(engine, "handle_error")
    def _on_error(context: Any) -> BaseException | None:
        return pooler_error(context.original_exception)


__all__ = [
    "HINT",
    "PoolerSetting",
    "PoolerSettingError",
    "listen_url",
    "pooler_error",
    "pooler_setting",
    "use_pooler_setting",
    "without_pooler",
]
