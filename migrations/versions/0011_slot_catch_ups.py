"""The state of a logical slot's catch-up from the table: ``outbox_slot_catch_ups``.

Revision ID: 0011_slot_catch_ups
Revises: 0010_outbox_publication
Create Date: 2026-12-01

When the logical relay creates its slot (first start, after ``relay --drop-slot``, or after
the slot was dropped or invalidated) it publishes the rows already in the table before it
streams. That catch-up may take minutes (1,000,000 rows); the row kept here until it is done
lets a relay that dies midway leave the rest to the next one, and ``outboxkit status`` show
its progress. One row per slot being caught up, none otherwise.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_slot_catch_ups"
down_revision = "0010_outbox_publication"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``outbox_slot_catch_ups``."""
    op.create_table(
        "outbox_slot_catch_ups",
        sa.Column("slot_name", sa.String(63), primary_key=True),
        sa.Column("after_id", sa.BigInteger, nullable=False),
        sa.Column("until_id", sa.BigInteger, nullable=True),
        sa.Column("published", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("started_ms", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    """Drop ``outbox_slot_catch_ups`` (a catch-up in progress is then not resumed)."""
    op.drop_table("outbox_slot_catch_ups")
