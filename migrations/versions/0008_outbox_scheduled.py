"""Scheduled delivery: ``outbox_events.deliver_at_ms`` and the index of scheduled rows.

Revision ID: 0008_outbox_scheduled
Revises: 0007_http_idempotency
Create Date: 2026-12-01

A row with ``deliver_at_ms`` is not published before that time (database clock). Existing rows
keep ``deliver_at_ms`` NULL: published as soon as they are claimed, as before.

The pending index is rebuilt without scheduled rows, so the claim's walk in id order never
steps over timers that are not due (one scan of the table to build it; the index holds the
backlog only). Scheduled rows get their own partial index in due order.
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_outbox_scheduled"
down_revision = "0007_http_idempotency"
branch_labels = None
depends_on = None

UNSETTLED = "published_ms IS NULL AND parked_ms IS NULL"


def upgrade() -> None:
    """Add ``deliver_at_ms``; pending index without scheduled rows; index of scheduled rows."""
    op.add_column("outbox_events", sa.Column("deliver_at_ms", sa.BigInteger, nullable=True))
    _pending_index(f"{UNSETTLED} AND deliver_at_ms IS NULL")
    scheduled = sa.text(f"{UNSETTLED} AND deliver_at_ms IS NOT NULL")
    op.create_index(
        "ix_outbox_events_scheduled",
        "outbox_events",
        ["deliver_at_ms", "id"],
        postgresql_where=scheduled,
        sqlite_where=scheduled,
    )


def downgrade() -> None:
    """Drop the column and the index of scheduled rows; the pending index as in 0001.

    Rows still scheduled become ordinary pending rows (published at the next claim).
    """
    op.drop_index("ix_outbox_events_scheduled", table_name="outbox_events")
    _pending_index(UNSETTLED)
    op.drop_column("outbox_events", "deliver_at_ms")


def _pending_index(where: str) -> None:
    op.drop_index("ix_outbox_events_pending", table_name="outbox_events")
    predicate = sa.text(where)
    op.create_index(
        "ix_outbox_events_pending",
        "outbox_events",
        ["id"],
        postgresql_where=predicate,
        sqlite_where=predicate,
    )
