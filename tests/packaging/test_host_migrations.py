"""A host service with its own models and Alembic history, in a database where outboxkit's
tables exist: with ``outboxkit.migrations.include_object`` in its env.py, ``alembic revision
--autogenerate`` proposes its own change and nothing about outboxkit's tables. Real SQLite and
PostgreSQL, the real ``alembic`` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from outboxkit.migrations import TABLES, include_object
from sqlalchemy import create_engine, inspect

MODELS = """
from sqlalchemy import Column, Integer, MetaData, String, Table

metadata = MetaData()
customers = Table(
    "customers",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(80), nullable=False),
)
"""


def alembic(root: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def host_project(root: Path, db_url: str, *, exclude_outboxkit: bool) -> None:
    """``alembic init`` of a host service, its env.py edited as docs/deploy.md says."""
    (root / "models.py").write_text(MODELS)
    alembic(root, "init", "migrations")
    ini = root / "alembic.ini"
    ini.write_text(
        ini.read_text().replace(
            "sqlalchemy.url = driver://user:pass@localhost/dbname",
            f"sqlalchemy.url = {db_url.replace('%', '%%')}",
        )
    )
    env = root / "migrations" / "env.py"
    text = env.read_text().replace(
        "target_metadata = None", "from models import metadata as target_metadata"
    )
    if exclude_outboxkit:
        text = "from outboxkit.migrations import include_object\n" + text.replace(
            "target_metadata=target_metadata",
            "target_metadata=target_metadata, include_object=include_object",
        )
    env.write_text(text)


def autogenerate(root: Path, message: str) -> str:
    """The upgrade() body of the revision autogenerate writes."""
    alembic(root, "revision", "--autogenerate", "-m", message)
    (script,) = (root / "migrations" / "versions").glob(f"*_{message}.py")
    body = script.read_text()
    return body[body.index("def upgrade()") : body.index("def downgrade()")]


def sync(db_url: str) -> str:
    return db_url.replace("postgresql://", "postgresql+psycopg://")


@pytest.mark.timeout(240)
def test_autogenerate_leaves_outboxkit_tables_alone(tmp_path: Path, db_url: str) -> None:
    url = sync(db_url)  # migrated by the fixture: outboxkit's tables are there
    engine = create_engine(url)
    try:
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()
    host_project(tmp_path, url, exclude_outboxkit=True)

    first = autogenerate(tmp_path, "customers")
    assert "op.create_table('customers'" in first
    assert not any(name in first for name in TABLES), first
    alembic(tmp_path, "upgrade", "head")

    second = autogenerate(tmp_path, "nothing")
    assert "op." not in second and "pass" in second, second


def test_without_the_filter_autogenerate_would_drop_them(tmp_path: Path, sqlite_url: str) -> None:
    # What a host saw before: its autogenerate proposed dropping every outboxkit table.
    host_project(tmp_path, sqlite_url, exclude_outboxkit=False)
    first = autogenerate(tmp_path, "customers")
    for name in TABLES:
        assert f"op.drop_table('{name}')" in first


def test_tables_are_exactly_what_the_migrations_create(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    try:
        assert set(inspect(engine).get_table_names()) == TABLES
    finally:
        engine.dispose()
    assert not include_object(None, "outbox_events", "table", True, None)
    assert include_object(None, "customers", "table", True, None)
