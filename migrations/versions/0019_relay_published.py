"""When each relay last had a row acknowledged by Kafka, for the stall check of ``status``.

Revision ID: 0019_relay_published
Revises: 0018_slot_failover
Create Date: 2026-12-07

``outbox_relays.published_ms`` (database clock, written with each heartbeat; ``NULL`` until the
relay published something). ``outboxkit status`` and the console compare it with the age of
the oldest due row on the relay's shards: rows waiting while their relay has published
nothing for a set time is a stalled relay (docs/observability.md#stalls). A nullable column
with no default: a catalogue change only, whatever the table holds.
"""

import sqlalchemy as sa
from alembic import op

revision = "0019_relay_published"
down_revision = "0018_slot_failover"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``outbox_relays.published_ms``."""
    op.add_column("outbox_relays", sa.Column("published_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Drop it."""
    with op.batch_alter_table("outbox_relays") as batch:
        batch.drop_column("published_ms")
