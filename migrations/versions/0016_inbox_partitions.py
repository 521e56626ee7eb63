"""The inbox partitioned by the time in its event ids (PostgreSQL); each consumer's window.

Revision ID: 0016_inbox_partitions
Revises: 0015_awaiting_decisions
Create Date: 2026-12-03

PostgreSQL: the inbox as it was is renamed ``inbox_events_unpartitioned`` (with its indexes),
and a new ``inbox_events`` is partitioned by range of ``id_ms``, the millisecond time in a
UUIDv7 event id (``outboxkit.outbox.id_time``; 0 for an id that carries none), the last column
of its primary key. Its partitions: ``inbox_events_untimed`` (``id_ms`` 0) and
``inbox_events_default`` for times no other partition covers; the time ranges
(``inbox_events_p<lower ms>``) are attached ahead by the consumers' retention, each of a width
fitted to its window (``outboxkit.consumers.inbox_partitions``). The renamed table keeps its
claims: every claim looks there too, none goes in, and retention empties it in chunks
(docs/operations.md#moving-an-existing-inbox). The upgrade is two renames and empty tables:
milliseconds of ``ACCESS EXCLUSIVE`` on the old table, whatever its size.

SQLite keeps its table: ``id_ms`` is added as a plain column.

Both: ``inbox_windows``, each consumer's inbox window as its retention last ran, so a
partition is dropped only when every claim in it is older than its own consumer's window.
"""

import sqlalchemy as sa
from alembic import op
from outboxkit.outbox.dialects import dialect_of

revision = "0016_inbox_partitions"
down_revision = "0015_awaiting_decisions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Partition the inbox (PostgreSQL) or add its ``id_ms`` column (SQLite); add the windows."""
    op.create_table(
        "inbox_windows",
        sa.Column("consumer", sa.String(200), primary_key=True),
        sa.Column("window_ms", sa.BigInteger, nullable=False),
        sa.Column("seen_ms", sa.BigInteger, nullable=False),
    )
    if not dialect_of(op.get_bind()).time_partitions:
        op.add_column(
            "inbox_events",
            sa.Column("id_ms", sa.BigInteger, nullable=False, server_default="0"),
        )
        return
    op.execute("ALTER TABLE inbox_events RENAME TO inbox_events_unpartitioned")
    op.execute("ALTER INDEX inbox_events_pkey RENAME TO inbox_events_unpartitioned_pkey")
    op.execute(
        "ALTER INDEX ix_inbox_events_processed_ms "
        "RENAME TO ix_inbox_events_unpartitioned_processed_ms"
    )
    op.execute(
        "CREATE TABLE inbox_events ("
        " consumer VARCHAR(200) NOT NULL, source VARCHAR(512) NOT NULL,"
        " event_id VARCHAR(256) NOT NULL, processed_ms BIGINT NOT NULL,"
        " id_ms BIGINT NOT NULL DEFAULT 0,"
        " CONSTRAINT inbox_events_pkey PRIMARY KEY (consumer, source, event_id, id_ms)"
        ") PARTITION BY RANGE (id_ms)"
    )
    op.execute("CREATE INDEX ix_inbox_events_processed_ms ON inbox_events (processed_ms)")
    op.execute(
        "CREATE TABLE inbox_events_untimed PARTITION OF inbox_events "
        "FOR VALUES FROM (MINVALUE) TO (1)"
    )
    op.execute("CREATE TABLE inbox_events_default PARTITION OF inbox_events DEFAULT")
    # Attaching a partition moves the default's rows of its range: found by this index.
    op.execute("CREATE INDEX ix_inbox_events_default_id_ms ON inbox_events_default (id_ms)")


def downgrade() -> None:
    """Drop the windows; PostgreSQL: put the unpartitioned inbox back, with the claims made
    since the upgrade copied into it."""
    op.drop_table("inbox_windows")
    if not dialect_of(op.get_bind()).time_partitions:
        with op.batch_alter_table("inbox_events") as batch:
            batch.drop_column("id_ms")
        return
    op.execute(
        "INSERT INTO inbox_events_unpartitioned (consumer, source, event_id, processed_ms) "
        "SELECT consumer, source, event_id, processed_ms FROM inbox_events "
        "ON CONFLICT DO NOTHING"
    )
    op.execute("DROP TABLE inbox_events")
    op.execute("ALTER TABLE inbox_events_unpartitioned RENAME TO inbox_events")
    op.execute("ALTER INDEX inbox_events_unpartitioned_pkey RENAME TO inbox_events_pkey")
    op.execute(
        "ALTER INDEX ix_inbox_events_unpartitioned_processed_ms "
        "RENAME TO ix_inbox_events_processed_ms"
    )
