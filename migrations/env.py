"""Alembic environment for outboxkit's own tables.

It keeps its own version table, ``alembic_version_outboxkit``, so a host application with its
own Alembic history can run these migrations beside its own without merging heads.
"""

from __future__ import annotations

from alembic import context
from outboxkit.migrations.runner import VERSION_TABLE
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.dialects import dialect_of
from sqlalchemy import Connection


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        render_as_batch=dialect_of(connection).batch_alter_table,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against the connection the caller passed, or a new engine from ``sqlalchemy.url``."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if url is None:
        raise SystemExit("outboxkit migrations need a database URL (sqlalchemy.url)")
    engine = make_engine(url)
    try:
        with engine.connect() as new_connection:
            _run(new_connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("outboxkit migrations run online only: give a database URL")
run_migrations_online()
