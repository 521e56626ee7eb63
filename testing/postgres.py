"""Throwaway PostgreSQL databases for tests and benchmarks (pytest-postgresql's janitor)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from outboxkit.migrations.runner import upgrade
from sqlalchemy.engine import make_url

DEFAULT_SERVER_URL = "postgresql://postgres:postgres@127.0.0.1:5432/postgres"
SERVER_URL_ENV = "OUTBOXKIT_TEST_PG_URL"


def server_url() -> str:
    """The server to create databases on: ``OUTBOXKIT_TEST_PG_URL`` or the local default."""
    return os.environ.get(SERVER_URL_ENV, DEFAULT_SERVER_URL)


@contextmanager
def throwaway_database(prefix: str = "outboxkit", migrate: bool = True) -> Iterator[str]:
    """Create a fresh database (migrated unless told not to), yield its URL, then drop it.

    Dropping terminates whatever connections are still open to it.
    """
    from pytest_postgresql.janitor import DatabaseJanitor

    server = make_url(server_url())
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    janitor = DatabaseJanitor(
        user=server.username or "postgres",
        host=server.host or "127.0.0.1",
        port=server.port or 5432,
        dbname=name,
        password=server.password,
    )
    janitor.init()
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        if migrate:
            upgrade(url)
        yield url
    finally:
        janitor.drop()
