"""The databases outboxkit supports, and their ``INSERT ... ON CONFLICT`` constructs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from outboxkit.outbox.errors import UnsupportedDatabaseError
from sqlalchemy.dialects import postgresql, sqlite

_INSERTS: dict[str, Callable[..., Any]] = {
    "postgresql": postgresql.insert,
    "sqlite": sqlite.insert,
}


def supported(dialect_name: str) -> str:
    """Return ``dialect_name``, or raise :class:`UnsupportedDatabaseError` for other databases."""
    if dialect_name not in _INSERTS:
        raise UnsupportedDatabaseError(
            f"outboxkit supports postgresql and sqlite, not {dialect_name!r}"
        )
    return dialect_name


def dialect_insert(dialect_name: str) -> Callable[..., Any]:
    """The dialect's ``insert`` (with ``on_conflict_do_nothing``/``_do_update``)."""
    return _INSERTS[supported(dialect_name)]
