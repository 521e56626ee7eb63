"""Migrations: outboxkit's history beside a host application's own Alembic history."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from outboxkit.migrations.runner import VERSION_TABLE, downgrade, upgrade
from outboxkit.outbox.db import make_engine
from sqlalchemy import inspect, text

HOST_ENV = """
from alembic import context
from sqlalchemy import create_engine

engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    context.configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
"""

HOST_REVISION = """
from alembic import op
import sqlalchemy as sa

revision = "host_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("customers", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("customers")
"""


def test_host_application_runs_our_migrations_with_a_separate_version_table(
    pg_url: str, tmp_path: Path
) -> None:
    downgrade(pg_url)  # the fixture migrated; start from an empty schema like a host would
    (tmp_path / "versions").mkdir()
    (tmp_path / "env.py").write_text(HOST_ENV)
    (tmp_path / "versions" / "host_0001.py").write_text(HOST_REVISION)
    config = Config()
    config.set_main_option("script_location", str(tmp_path))
    config.set_main_option(
        "sqlalchemy.url", pg_url.replace("postgresql://", "postgresql+psycopg://")
    )

    command.upgrade(config, "head")  # the host's own history, in alembic_version
    engine = make_engine(pg_url)
    with engine.begin() as conn:  # the host's deploy step, on the host's own connection
        upgrade(connection=conn)

    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        host_version = conn.scalar(text("SELECT version_num FROM alembic_version"))
        ours = conn.scalars(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    engine.dispose()
    assert {"customers", "outbox_events", "alembic_version", VERSION_TABLE} <= tables
    assert host_version == "host_0001"
    assert ours, "outboxkit's revision is recorded in its own table"
    command.upgrade(config, "head")  # the host's history is untouched by ours: still at head


def test_upgrade_is_idempotent_and_downgrade_removes_everything(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    downgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        remaining = set(inspect(conn).get_table_names()) - {VERSION_TABLE}
    engine.dispose()
    assert remaining == set()


def test_claim_query_uses_the_pending_index_with_many_published_rows(pg_url: str) -> None:
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO outbox_events (source, event_id, type, topic, shard, headers, "
                "payload, created_ms, available_ms, attempts, published_ms) "
                "SELECT '/s', g::text, 't', 'topic', g % 64, '{}', '', 0, 0, 0, 1 "
                "FROM generate_series(1, 200000) g"
            )
        )
        conn.execute(
            text(
                "INSERT INTO outbox_events (source, event_id, type, topic, shard, headers, "
                "payload, created_ms, available_ms, attempts) "
                "SELECT '/s', 'p' || g, 't', 'topic', g % 64, '{}', '', 0, 0, 0 "
                "FROM generate_series(1, 50) g"
            )
        )
        conn.execute(text("ANALYZE outbox_events"))
        plan = "\n".join(
            conn.scalars(
                text(
                    "EXPLAIN SELECT id FROM outbox_events WHERE published_ms IS NULL "
                    "AND parked_ms IS NULL AND shard IN (1, 2, 3) ORDER BY id LIMIT 500"
                )
            )
        )
    engine.dispose()
    assert "ix_outbox_events_pending" in plan, plan
    assert "Seq Scan" not in plan, plan
