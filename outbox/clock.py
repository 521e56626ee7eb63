"""The database clock, as epoch milliseconds, so every process compares times from one clock."""

from __future__ import annotations

from outboxkit.outbox.dialects import supported
from sqlalchemy import BigInteger, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.sql.elements import ColumnElement

_NOW_MS_SQL = {
    "postgresql": "(floor(extract(epoch from clock_timestamp()) * 1000))::bigint",
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
}


def db_now_ms(dialect_name: str) -> ColumnElement[int]:
    """Return a SQL expression for the database's current time in epoch milliseconds."""
    return literal_column(_NOW_MS_SQL[supported(dialect_name)], BigInteger)


async def read_db_now_ms(executor: AsyncSession | AsyncConnection) -> int:
    """The database's current time in epoch milliseconds (one round trip)."""
    dialect = (
        executor.get_bind().dialect if isinstance(executor, AsyncSession) else executor.dialect
    )
    now = await executor.scalar(select(db_now_ms(dialect.name)))
    assert now is not None  # one row, always
    return int(now)
