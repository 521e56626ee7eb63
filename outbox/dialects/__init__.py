"""The databases outboxkit supports: one :class:`Dialect` each, the seam every store asks.

No store compares a database's name: it asks ``dialect_of(session)`` how to insert-or-skip,
claim rows while skipping locked ones, read the database clock, how many keys go in one
statement, whether LISTEN/NOTIFY exists, and so on. Each database's answers stand in its own
module (``postgresql.py``, ``sqlite.py``); adding one is CONTRIBUTING.md's "Adding a database".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from outboxkit.outbox.dialects.base import Dialect
from outboxkit.outbox.dialects.postgresql import PostgreSQL
from outboxkit.outbox.dialects.sqlite import SQLite
from outboxkit.outbox.errors import UnsupportedDatabaseError
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.engine.interfaces import Dialect as SqlDialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

__all__ = [
    "DIALECTS",
    "POSTGRESQL",
    "SQLITE",
    "Bound",
    "Dialect",
    "PostgreSQL",
    "SQLite",
    "dialect_insert",
    "dialect_of",
    "supported",
]

POSTGRESQL: Dialect = PostgreSQL()
SQLITE: Dialect = SQLite()
DIALECTS: dict[str, Dialect] = {dialect.name: dialect for dialect in (POSTGRESQL, SQLITE)}
"""Every supported database's :class:`Dialect`, by name."""

Bound = (
    AsyncSession | Session | AsyncConnection | Connection | AsyncEngine | Engine | SqlDialect | URL
)


def supported(dialect_name: str) -> str:
    """Return ``dialect_name``, or raise :class:`UnsupportedDatabaseError` for other databases."""
    if dialect_name not in DIALECTS:
        raise UnsupportedDatabaseError(
            f"outboxkit supports postgresql and sqlite, not {dialect_name!r}"
        )
    return dialect_name


def dialect_of(bound: Bound | str) -> Dialect:
    """The :class:`Dialect` of a session, connection, engine, SQLAlchemy dialect, parsed URL
    (``outboxkit.outbox.db.parse_url`` parses text) or name (``"postgresql"``); raises
    :class:`UnsupportedDatabaseError` for a database outboxkit does not support."""
    return DIALECTS[supported(_name_of(bound))]


def _name_of(bound: Bound | str) -> str:
    if isinstance(bound, str):
        return bound
    if isinstance(bound, URL):
        return bound.get_backend_name()
    if isinstance(bound, SqlDialect):
        return bound.name
    if isinstance(bound, AsyncSession | Session):
        return bound.get_bind().dialect.name
    return bound.dialect.name


def dialect_insert(dialect_name: str) -> Callable[..., Any]:
    """The dialect's ``insert`` (with ``on_conflict_do_nothing``/``_do_update``)."""
    return dialect_of(dialect_name).insert
