"""Autovacuum storage parameters on ``outbox_events``, so the space of deleted rows is reused.

Revision ID: 0017_outbox_autovacuum
Revises: 0016_inbox_partitions
Create Date: 2026-12-03

The relay deletes published rows in a steady stream (retention). With the server's defaults
autovacuum waits for 20 % of the table to be dead and then runs throttled (cost limit 200 per
2 ms), so under inflow it fell behind and the table grew while its row count stayed flat
(docs/operations.md#retention-under-inflow). Here it starts after 10,000 dead rows whatever
the table's size and runs with a tenfold cost limit and a 1 ms delay. PostgreSQL only (the
Dialect's ``autovacuum``); SQLite reuses freed pages itself and gets nothing.
"""

from alembic import op
from outboxkit.outbox.dialects import dialect_of

revision = "0017_outbox_autovacuum"
down_revision = "0016_inbox_partitions"
branch_labels = None
depends_on = None

SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "10000",
    "autovacuum_vacuum_cost_limit": "2000",
    "autovacuum_vacuum_cost_delay": "1",
}


def upgrade() -> None:
    """Set the outbox's autovacuum parameters."""
    if dialect_of(op.get_bind()).autovacuum:
        settings = ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
        op.execute(f"ALTER TABLE outbox_events SET ({settings})")


def downgrade() -> None:
    """Back to the server's defaults."""
    if dialect_of(op.get_bind()).autovacuum:
        op.execute(f"ALTER TABLE outbox_events RESET ({', '.join(SETTINGS)})")
