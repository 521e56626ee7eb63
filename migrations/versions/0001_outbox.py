"""Outbox table, relay registry and shard leases.

Revision ID: 0001_outbox
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from outboxkit.outbox.dialects import dialect_of

revision = "0001_outbox"
down_revision = None
branch_labels = None
depends_on = None

SHARD_COUNT = 64  # outboxkit.outbox.sharding.SHARD_COUNT at the time of this revision
NOTIFY_CHANNEL = "outboxkit_outbox"  # outboxkit.relay.notify.CHANNEL


def upgrade() -> None:
    """Create the outbox tables; on PostgreSQL also the NOTIFY trigger that wakes relays."""
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "outbox_events",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("source", sa.String(512), nullable=False),
        sa.Column("event_id", sa.String(256), nullable=False),
        sa.Column("type", sa.String(256), nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("kafka_key", sa.LargeBinary, nullable=True),
        sa.Column("shard", sa.SmallInteger, nullable=False),
        sa.Column("headers", sa.Text, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("available_ms", sa.BigInteger, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("lease_token", sa.String(36), nullable=True),
        sa.Column("lease_until_ms", sa.BigInteger, nullable=True),
        sa.Column("published_ms", sa.BigInteger, nullable=True),
        sa.Column("parked_ms", sa.BigInteger, nullable=True),
        sa.UniqueConstraint("source", "event_id", name="uq_outbox_events_source_event_id"),
    )
    pending = sa.text("published_ms IS NULL AND parked_ms IS NULL")
    op.create_index(
        "ix_outbox_events_pending",
        "outbox_events",
        ["id"],
        postgresql_where=pending,
        sqlite_where=pending,
    )
    published = sa.text("published_ms IS NOT NULL")
    op.create_index(
        "ix_outbox_events_published",
        "outbox_events",
        ["published_ms"],
        postgresql_where=published,
        sqlite_where=published,
    )
    parked = sa.text("parked_ms IS NOT NULL")
    op.create_index(
        "ix_outbox_events_parked",
        "outbox_events",
        ["parked_ms"],
        postgresql_where=parked,
        sqlite_where=parked,
    )
    op.create_table(
        "outbox_relays",
        sa.Column("relay_id", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_ms", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_ms", sa.BigInteger, nullable=False),
    )
    leases = op.create_table(
        "outbox_shard_leases",
        sa.Column("shard", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("holder", sa.String(64), nullable=True),
        sa.Column("expires_ms", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.bulk_insert(
        leases, [{"shard": s, "holder": None, "expires_ms": 0} for s in range(SHARD_COUNT)]
    )
    if dialect_of(op.get_bind()).listen_notify:
        op.execute(
            f"""
            CREATE FUNCTION outboxkit_notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_notify('{NOTIFY_CHANNEL}', '');
                RETURN NULL;
            END $$;
            """
        )
        op.execute(
            "CREATE TRIGGER outboxkit_outbox_notify AFTER INSERT ON outbox_events "
            "FOR EACH STATEMENT EXECUTE FUNCTION outboxkit_notify_outbox()"
        )


def downgrade() -> None:
    """Drop everything :func:`upgrade` created."""
    if dialect_of(op.get_bind()).listen_notify:
        op.execute("DROP TRIGGER IF EXISTS outboxkit_outbox_notify ON outbox_events")
        op.execute("DROP FUNCTION IF EXISTS outboxkit_notify_outbox()")
    op.drop_table("outbox_shard_leases")
    op.drop_table("outbox_relays")
    op.drop_table("outbox_events")
