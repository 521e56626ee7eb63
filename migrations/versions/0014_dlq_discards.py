"""Discarded dead letters, and the index the console's workflow list pages by.

Revision ID: 0014_dlq_discards
Revises: 0013_consumer_sequences
Create Date: 2026-12-02

``dlq_discards``: one row per dead-letter record an operator discarded (``outboxkit dlq
discard`` or the console), keyed like the replay ledger by ``(dlq topic, partition, offset)``.
A Kafka record cannot be deleted: a discarded letter stays in its topic, inspectable, and is
left out of listings and replays until it is un-discarded (its row deleted).

``ix_workflow_instances_updated``: ``(updated_ms, id)``, the keyset of the workflow list (most
recently changed first).
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_dlq_discards"
down_revision = "0013_consumer_sequences"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``dlq_discards`` and ``ix_workflow_instances_updated``."""
    op.create_table(
        "dlq_discards",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("dlq_topic", sa.String(249), nullable=False),
        sa.Column("dlq_partition", sa.Integer, nullable=False),
        sa.Column("dlq_offset", sa.BigInteger, nullable=False),
        sa.Column("discarded_ms", sa.BigInteger, nullable=False),
        sa.Column("discarded_by", sa.String(128), nullable=False),
        sa.Column("reason", sa.String(1000), nullable=False),
        sa.Column("discard_id", sa.String(36), nullable=False),
        sa.UniqueConstraint(
            "dlq_topic", "dlq_partition", "dlq_offset", name="uq_dlq_discards_record"
        ),
    )
    op.create_index("ix_dlq_discards_discard_id", "dlq_discards", ["discard_id"])
    op.create_index("ix_workflow_instances_updated", "workflow_instances", ["updated_ms", "id"])


def downgrade() -> None:
    """Drop everything :func:`upgrade` created."""
    op.drop_index("ix_workflow_instances_updated", table_name="workflow_instances")
    op.drop_table("dlq_discards")
