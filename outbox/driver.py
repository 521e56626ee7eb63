"""One statement on the driver's own connection: the hot paths' way past SQLAlchemy's layers.

A tool call writes twice, each one statement in autocommit (the ledger's claim and its
finish). Through an ``AsyncSession`` each costs about 0.5 ms of client CPU beyond the round
trip (the session, the greenlet bridge to SQLAlchemy's synchronous core, the cursor adapter
and result processing), as much as the round trip itself. :class:`DriverSession` runs such a
statement on the driver connection of a pooled connection instead: the SQLAlchemy statement
is compiled once for the engine's dialect and kept, and each call binds its parameters in
order and reads the one row back, on databases whose :class:`~outboxkit.outbox.dialects.Dialect`
has ``driver_statements`` (PostgreSQL through asyncpg).

Behind a transaction pooler (the URL's ``pooler=transaction``, :mod:`outboxkit.outbox.pooler`)
the engine's connections have asyncpg's statement cache off, so each statement is the unnamed
one, parsed again with its execution in one message: no server connection needs a statement
another made. Without the setting, the failure the pooler causes is one line naming it.

What it gives up: SQLAlchemy's cursor events (``before_cursor_execute``, ``echo``) do not see
these statements. Errors are SQLAlchemy's still: a driver error is raised as a
:class:`~sqlalchemy.exc.DBAPIError` wrapping it (parameters hidden: they carry payloads), and a
connection the driver closed, or whose statement was cancelled, is invalidated, never returned
to the pool.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.pooler import pooler_error
from sqlalchemy.engine import Dialect as SqlDialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

_REQUIRED = object()


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A statement's SQL for the driver and, per positional parameter, its name, its constant
    value (or :data:`_REQUIRED`) and the type's bind processor."""

    sql: str
    slots: tuple[tuple[str, Any, Callable[[Any], Any] | None], ...]

    def arguments(self, parameters: Mapping[str, Any]) -> list[Any]:
        values = []
        for name, constant, process in self.slots:
            value = parameters.get(name, constant)
            if value is _REQUIRED:
                raise KeyError(f"statement parameter {name!r} not given")
            values.append(value if process is None else process(value))
        return values


@functools.lru_cache(maxsize=512)
def _compile(statement: ClauseElement, dialect: SqlDialect) -> _Compiled:
    compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
    names = compiled.positiontup
    if names is None or "POSTCOMPILE" in compiled.string:
        raise ValueError("a driver statement needs positional parameters and no expanding ones")
    constants = compiled.construct_params(_check=False)
    slots = []
    for name in names:
        bind = compiled.binds[name]
        constant = _REQUIRED if bind.required else constants[name]
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        slots.append((name, constant, process))
    return _Compiled(compiled.string, tuple(slots))


class DriverSession:
    """Runs single statements of ``engine`` in autocommit on its pooled connections' driver
    connections: each statement is its own transaction (use it for statements that are atomic
    alone: a write with its audit rows and events as CTEs, say)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect

    async def first(self, statement: ClauseElement, parameters: Mapping[str, Any]) -> Any:
        """The first row ``statement`` returns with ``parameters`` (a mapping by column name),
        or ``None``; the statement commits before this returns."""
        compiled = _compile(statement, self.dialect)
        arguments = compiled.arguments(parameters)
        async with self.engine.connect() as connection:
            return await _on_driver(
                connection, compiled.sql, lambda driver: driver.fetchrow(compiled.sql, *arguments)
            )


async def send_script(
    connection: AsyncConnection, script: str, *, notices: list[str] | None = None
) -> str:
    """Send ``script``, statements separated by ``;`` and no parameters, as one message on
    ``connection``'s driver connection (asyncpg's simple query protocol; ``connection`` in
    autocommit): the server runs them in one implicit transaction, on one server session
    (through a transaction-mode pooler too), and commits when the last ends. Returns the
    last statement's status (``DELETE 42``); the messages of the notices the script sent are
    appended to ``notices`` when given. Errors as :meth:`DriverSession.first`'s."""

    async def execute(driver: Any) -> Any:
        if notices is None:
            return await driver.execute(script)

        def heard(_connection: Any, message: Any) -> None:
            notices.append(str(message.message))

        driver.add_log_listener(heard)
        try:
            status = await driver.execute(script)
            # asyncpg calls listeners soon after the message, which comes before the reply:
            # they have run once the reply's waiter has (one more turn of the loop, to be sure).
            await asyncio.sleep(0)
            return status
        finally:
            driver.remove_log_listener(heard)

    return str(await _on_driver(connection, script, execute))


async def _on_driver(
    connection: AsyncConnection, sql: str, call: Callable[[Any], Awaitable[Any]]
) -> Any:
    """``call(driver_connection)``; a driver error raised as a :class:`DBAPIError`
    (parameters hidden), a connection closed or cancelled under it invalidated."""
    pooled = await connection.get_raw_connection()
    driver = pooled.driver_connection
    if driver is None:  # only a connection already invalidated has none
        raise RuntimeError("the pool handed out a connection without a driver")
    try:
        return await call(driver)
    except asyncio.CancelledError:
        await connection.invalidate()  # its reply may still be on the way: not pooled
        raise
    except Exception as error:
        closed = bool(driver.is_closed())
        if closed:
            await connection.invalidate(error)
        named = pooler_error(error)
        if named is not None:
            raise named from error
        raise DBAPIError.instance(
            sql,
            None,
            error,
            Exception,
            hide_parameters=True,
            connection_invalidated=closed,
            dialect=connection.dialect,
        ) from error


def driver_session(sessions: async_sessionmaker[AsyncSession]) -> DriverSession | None:
    """A :class:`DriverSession` on the engine ``sessions`` is bound to, where its dialect has
    ``driver_statements``; ``None`` otherwise (or when the factory binds no single engine)."""
    options = getattr(sessions, "kw", None)  # a plain callable making sessions has none
    engine = options.get("bind") if isinstance(options, dict) else None
    if not isinstance(engine, AsyncEngine) or not dialect_of(engine).driver_statements:
        return None
    return DriverSession(engine)


__all__ = ["DriverSession", "driver_session", "send_script"]
