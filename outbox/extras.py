"""Optional drivers: imported where they are used, a missing one named with its extra.

The base install serves SQLite; PostgreSQL's drivers come with extras (``postgres``: asyncpg
and psycopg 3; ``logical``: psycopg2 for the relay's replication stream).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from outboxkit.outbox.errors import OutboxError

POSTGRES = "postgres"
LOGICAL = "logical"


class MissingExtraError(OutboxError, ImportError):
    """A feature needs a driver that is not installed; the message names the extra (one line)."""


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtraError` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(
            f"{purpose} needs {module.split('.')[0]}, which is not installed: "
            f"pip install 'outboxkit[{extra}]'"
        ) from None
