"""Bounded access to Kafka and the database for the operator tools, and their errors.

Every failure an operator can fix (an unreachable broker or database, a missing table, a bad
time) becomes an :class:`OpsError`, which ``outboxkit`` prints as one line with exit code 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from aiokafka.errors import KafkaConnectionError, KafkaError
from outboxkit.outbox.db import make_async_engine, parse_url
from outboxkit.outbox.db_failures import tls_failure
from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.errors import OutboxError
from outboxkit.outbox.kafka_failures import explain, mask
from outboxkit.outbox.kafka_settings import KafkaSettings
from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

DEFAULT_TIMEOUT_S = 10.0


class OpsError(OutboxError):
    """An operator command cannot do what was asked; the message says why, in one line."""


class KafkaUnreachableError(OpsError):
    """The broker did not answer, or refused the connection, within the time allowed."""


class DatabaseUnreachableError(OpsError):
    """The database did not answer, or refused the connection, within the time allowed."""


def quiet_kafka_logs() -> None:
    """Silence aiokafka's own log lines: a command reports a broker problem once, itself."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


@contextlib.asynccontextmanager
async def kafka_bounded(kafka: KafkaSettings, timeout: float, what: str) -> AsyncIterator[None]:
    """Run the block within ``timeout`` seconds; broker failures become one-line errors.

    A failed connection names its cause (wrong password, untrusted certificate, hostname
    mismatch, refused), found by connecting once more; no secret is ever part of the line.
    """
    bootstrap = kafka.bootstrap
    try:
        async with asyncio.timeout(timeout):
            yield
    except TimeoutError:
        raise KafkaUnreachableError(
            f"kafka at {bootstrap} did not answer within {timeout:g} s ({what})"
        ) from None
    except KafkaConnectionError as error:
        cause = await explain(kafka, error, timeout)
        raise KafkaUnreachableError(f"kafka at {bootstrap} unreachable ({what}): {cause}") from None
    except KafkaError as error:
        cause = mask(str(error) or type(error).__name__, kafka)
        raise KafkaUnreachableError(f"kafka at {bootstrap} failed ({what}): {cause}") from None


def ops_engine(db_url: str, timeout: float) -> AsyncEngine:
    """An async engine whose connection attempts give up after ``timeout`` seconds.

    A SQLite file that does not exist is an error rather than a new empty database.
    """
    url = parse_url(db_url)
    dialect = dialect_of(url)
    if dialect.file_database:
        database = url.database or ""
        if database and database != ":memory:" and not Path(database).exists():
            raise DatabaseUnreachableError(f"database file {database} does not exist")
    connect_args = dialect.connect_timeout_args(timeout)
    try:
        return make_async_engine(db_url, connect_args=connect_args)
    except ValueError as error:
        raise OpsError(str(error)) from None


@contextlib.asynccontextmanager
async def database_bounded(engine: AsyncEngine, timeout: float) -> AsyncIterator[None]:
    """Run the block; an unreachable database or a bounded wait becomes one-line errors."""
    where = engine.url.render_as_string(hide_password=True)
    try:
        yield
    except TimeoutError:
        raise DatabaseUnreachableError(
            f"database {where} did not answer within {timeout:g} s"
        ) from None
    except (DBAPIError, OSError) as error:
        if (tls := tls_failure(error)) is not None:
            raise DatabaseUnreachableError(tls) from None
        if isinstance(error, OSError):
            raise DatabaseUnreachableError(f"database {where} unreachable: {error}") from None
        reason = str(error.orig or error).strip().splitlines()
        raise DatabaseUnreachableError(
            f"database {where} unreachable or refused the request: "
            f"{reason[0] if reason else type(error).__name__}"
        ) from None


async def require_tables(engine: AsyncEngine, names: Iterable[str]) -> None:
    """Raise :class:`OpsError` naming the first of ``names`` missing from the database."""
    async with engine.connect() as connection:
        present = await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    for name in names:
        if name not in present:
            raise OpsError(f"table {name} is missing: run 'outboxkit migrate' first")


async def ping_database(db_url: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Connect once and run ``SELECT 1``; any failure is a one-line :class:`OpsError`.

    For commands that would otherwise retry a misconfigured database (a wrong CA, a refused
    ``sslmode``) forever, such as ``relay --drain``.
    """
    engine = ops_engine(db_url, timeout)
    try:
        async with (
            database_bounded(engine, timeout),
            asyncio.timeout(timeout),
            engine.connect() as connection,
        ):
            await connection.execute(text("SELECT 1"))
    finally:
        await engine.dispose()
