"""Migrations: outboxkit's history beside a host application's own Alembic history."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from outboxkit.migrations.runner import VERSION_TABLE, downgrade, upgrade
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.relay.claims import Claims
from sqlalchemy import inspect, text
from sqlalchemy.dialects import postgresql

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
                    "AND parked_ms IS NULL AND deliver_at_ms IS NULL AND shard IN (1, 2, 3) "
                    "ORDER BY id LIMIT 500"
                )
            )
        )
    engine.dispose()
    assert "ix_outbox_events_pending" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_claim_and_next_due_use_their_indexes_with_published_rows_and_future_timers(
    pg_url: str,
) -> None:
    """The relay's own statements: 200,000 published rows and 100,000 timers due in a day never
    enter the claim's scans; the timers are read from their own index, bounded by the clock."""
    engine = make_engine(pg_url)
    columns = "source, event_id, type, topic, shard, headers, payload, created_ms, available_ms"
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO outbox_events ({columns}, attempts, published_ms) "
                "SELECT '/s', g::text, 't', 'topic', g % 64, '{}', '', 0, 0, 0, 1 "
                "FROM generate_series(1, 200000) g"
            )
        )
        conn.execute(
            text(
                f"INSERT INTO outbox_events ({columns}, attempts, deliver_at_ms) "
                "SELECT '/s', 's' || g, 't', 'topic', g % 64, '{}', '', 0, 0, 0, "
                "(extract(epoch from now()) * 1000)::bigint + 86400000 "
                "FROM generate_series(1, 100000) g"
            )
        )
        conn.execute(
            text(
                f"INSERT INTO outbox_events ({columns}, attempts) "
                "SELECT '/s', 'p' || g, 't', 'topic', g % 64, '{}', '', 0, 0, 0 "
                "FROM generate_series(1, 50) g"
            )
        )
        conn.execute(text("UPDATE outbox_shard_leases SET holder = 'r1', expires_ms = 2e13"))
        conn.execute(text("ANALYZE outbox_events"))
        claims = Claims(make_async_engine(pg_url), "r1")
        plans = {}
        for name, statement in (
            ("claim", claims._claim_statement),
            ("next due", claims._next_due_statement),
        ):
            compiled = statement.compile(dialect=postgresql.psycopg.dialect())
            parameters = {**compiled.params, "limit": 500, "in_flight": [0]}
            explained = conn.exec_driver_sql(f"EXPLAIN ANALYZE {compiled}", parameters)
            plans[name] = "\n".join(explained.scalars())
    engine.dispose()
    claim, next_due = plans["claim"], plans["next due"]
    assert "ix_outbox_events_pending" in claim and "ix_outbox_events_scheduled" in claim, claim
    assert "Seq Scan on outbox_events" not in claim, claim
    assert "rows=50 " in claim  # the 50 pending rows; not one timer was read
    assert "ix_outbox_events_scheduled" in next_due, next_due
    assert "Seq Scan on outbox_events" not in next_due, next_due
