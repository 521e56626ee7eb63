"""What the logical relay last saw of its server, and the WAL-message gaps it found.

Revision ID: 0018_slot_failover
Revises: 0017_outbox_autovacuum
Create Date: 2026-12-07

A failover takes every logical slot before PostgreSQL 17 (slots are not copied to a standby).
``outbox_slot_positions`` keeps, per slot, the server's system identifier, its timeline and
the slot's confirmed position, written by the relay as it streams: it comes along with the
replicated database, so a relay started after the promotion sees that the server changed.
``outbox_slot_gaps`` keeps each WAL range whose outbox WAL messages no slot decoded (they
were lost with the old slot), with the count of events lost when it could be made, until an
operator acknowledges it (``outboxkit relay gaps --ack``).
"""

import sqlalchemy as sa
from alembic import op

revision = "0018_slot_failover"
down_revision = "0017_outbox_autovacuum"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create ``outbox_slot_positions`` and ``outbox_slot_gaps``."""
    op.create_table(
        "outbox_slot_positions",
        sa.Column("slot_name", sa.String(63), primary_key=True),
        sa.Column("system_id", sa.String(20), nullable=False),
        sa.Column("timeline", sa.Integer, nullable=False),
        sa.Column("confirmed_lsn", sa.BigInteger, nullable=False),
        sa.Column("messages_seen_ms", sa.BigInteger, nullable=True),
        sa.Column("updated_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "outbox_slot_gaps",
        sa.Column("id", _BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("slot_name", sa.String(63), nullable=False),
        sa.Column("cause", sa.String(200), nullable=False),
        sa.Column("from_lsn", sa.BigInteger, nullable=False),
        sa.Column("to_lsn", sa.BigInteger, nullable=False),
        sa.Column("lost_events", sa.BigInteger, nullable=True),
        sa.Column("count_note", sa.Text, nullable=False),
        sa.Column("detected_ms", sa.BigInteger, nullable=False),
        sa.Column("acknowledged_ms", sa.BigInteger, nullable=True),
        sa.Column("acknowledged_by", sa.String(200), nullable=True),
        sa.UniqueConstraint("slot_name", "from_lsn", "to_lsn", name="uq_outbox_slot_gaps_range"),
    )


def downgrade() -> None:
    """Drop both tables (unacknowledged gaps are then forgotten)."""
    op.drop_table("outbox_slot_gaps")
    op.drop_table("outbox_slot_positions")
