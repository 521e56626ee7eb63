"""The database clock, as epoch milliseconds, so every process compares times from one clock."""

from __future__ import annotations

from outboxkit.outbox.dialects import dialect_of
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.sql.elements import ColumnElement


def db_now_ms(dialect_name: str) -> ColumnElement[int]:
    """Return a SQL expression for the database's current time in epoch milliseconds."""
    return dialect_of(dialect_name).now_ms()


async def read_db_now_ms(executor: AsyncSession | AsyncConnection) -> int:
    """The database's current time in epoch milliseconds (one round trip)."""
    now = await executor.scalar(select(dialect_of(executor).now_ms()))
    assert now is not None  # one row, always
    return int(now)
