"""Inbox table of the consumer runtime.

Revision ID: 0002_inbox
Revises: 0001_outbox
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_inbox"
down_revision = "0001_outbox"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``inbox_events``: one row per ``(consumer, source, event_id)`` applied."""
    op.create_table(
        "inbox_events",
        sa.Column("consumer", sa.String(200), primary_key=True),
        sa.Column("source", sa.String(512), primary_key=True),
        sa.Column("event_id", sa.String(256), primary_key=True),
        sa.Column("processed_ms", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_inbox_events_processed_ms", "inbox_events", ["processed_ms"])


def downgrade() -> None:
    """Drop the inbox table."""
    op.drop_index("ix_inbox_events_processed_ms", table_name="inbox_events")
    op.drop_table("inbox_events")
