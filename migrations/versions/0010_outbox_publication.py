"""The publication the logical relay decodes: inserts into ``outbox_events`` (PostgreSQL only).

Revision ID: 0010_outbox_publication
Revises: 0009_workflows
Create Date: 2026-12-01

``outboxkit relay --mode logical`` reads a logical replication slot with ``pgoutput`` through
this publication. Only inserts are published: the relay's own updates and deletes of outbox
rows are filtered out by the server. Creating a publication needs no ``wal_level=logical``
(the slot does), so the migration runs on any PostgreSQL; on SQLite it does nothing.
"""

from alembic import op
from outboxkit.outbox.dialects import dialect_of

revision = "0010_outbox_publication"
down_revision = "0009_workflows"
branch_labels = None
depends_on = None

PUBLICATION = "outboxkit_outbox"  # outboxkit.relay.slot.PUBLICATION


def upgrade() -> None:
    """Create the publication of outbox inserts on PostgreSQL."""
    if dialect_of(op.get_bind()).logical_replication:
        op.execute(
            f"CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox_events WITH (publish = 'insert')"
        )


def downgrade() -> None:
    """Drop the publication (drop the relay's slots first: ``outboxkit relay --drop-slot``)."""
    if dialect_of(op.get_bind()).logical_replication:
        op.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}")
