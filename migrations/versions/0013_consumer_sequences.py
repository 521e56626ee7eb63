"""Dead letters that keep the order: blocked keys and the records held behind them.

Revision ID: 0013_consumer_sequences
Revises: 0012_console_audit
Create Date: 2026-12-01

A consumer handler with ``on_dead_letter="sequence"`` blocks a key whose record was
dead-lettered (``consumer_sequences``) and stores the key's later records
(``consumer_held_events``) until the head is replayed, skipped or released.
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_consumer_sequences"
down_revision = "0012_console_audit"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``consumer_sequences`` and ``consumer_held_events``."""
    op.create_table(
        "consumer_sequences",
        sa.Column("consumer", sa.String(200), primary_key=True),
        sa.Column("topic", sa.String(249), primary_key=True),
        sa.Column("key_hash", sa.String(64), primary_key=True),
        sa.Column("key_shown", sa.String(200), nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("head_source", sa.String(512), nullable=True),
        sa.Column("head_event_id", sa.String(256), nullable=True),
        sa.Column("head_offset", sa.BigInteger, nullable=True),
        sa.Column("head_error", sa.String(200), nullable=True),
        sa.Column("held", sa.Integer, nullable=False),
        sa.Column("blocked_ms", sa.BigInteger, nullable=False),
        sa.Column("resolution", sa.String(16), nullable=True),
        sa.Column("resolved_by", sa.String(128), nullable=True),
        sa.Column("reason", sa.String(500), nullable=True),
        sa.Column("drainer", sa.String(64), nullable=True),
        sa.Column("drain_until_ms", sa.BigInteger, nullable=True),
    )
    op.create_index("ix_consumer_sequences_state", "consumer_sequences", ["consumer", "state"])
    op.create_table(
        "consumer_held_events",
        sa.Column("consumer", sa.String(200), primary_key=True),
        sa.Column("topic", sa.String(249), primary_key=True),
        sa.Column("key_hash", sa.String(64), primary_key=True),
        sa.Column("kafka_offset", sa.BigInteger, primary_key=True),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("source", sa.String(512), nullable=True),
        sa.Column("event_id", sa.String(256), nullable=True),
        sa.Column("event_type", sa.String(256), nullable=True),
        sa.Column("record_key", sa.LargeBinary, nullable=True),
        sa.Column("record_value", sa.LargeBinary, nullable=True),
        sa.Column("record_headers", sa.LargeBinary, nullable=False),
        sa.Column("record_timestamp", sa.BigInteger, nullable=True),
        sa.Column("held_ms", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    """Drop everything :func:`upgrade` created."""
    op.drop_table("consumer_held_events")
    op.drop_table("consumer_sequences")
