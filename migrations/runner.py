"""Running outboxkit's Alembic migrations, alone or from a host application's deploy step."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

VERSION_TABLE = "alembic_version_outboxkit"


def alembic_config(db_url: str | None = None, connection: Connection | None = None) -> Config:
    """Return an Alembic config for outboxkit's migrations (bundled in the package)."""
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    if db_url is not None:
        config.set_main_option("sqlalchemy.url", db_url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(db_url: str | None = None, *, connection: Connection | None = None) -> None:
    """Upgrade outboxkit's tables to the newest revision.

    Pass a URL, or a connection from the host application's own engine (its transaction is
    used as it is). The history lives in ``alembic_version_outboxkit``, apart from the host's.
    """
    if (db_url is None) == (connection is None):
        raise ValueError("pass exactly one of db_url or connection")
    command.upgrade(alembic_config(db_url, connection), "heads")


def downgrade(db_url: str, revision: str = "base") -> None:
    """Downgrade outboxkit's tables to ``revision`` (default: remove them all)."""
    command.downgrade(alembic_config(db_url), revision)
