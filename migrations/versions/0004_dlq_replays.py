"""Ledger of dead-letter records republished by ``outboxkit dlq replay``.

Revision ID: 0004_dlq_replays
Revises: 0003_agent_actions
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_dlq_replays"
down_revision = "0003_agent_actions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``dlq_replays``: one row per (dead-letter record, target topic) replayed."""
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "dlq_replays",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("dlq_topic", sa.String(249), nullable=False),
        sa.Column("dlq_partition", sa.Integer, nullable=False),
        sa.Column("dlq_offset", sa.BigInteger, nullable=False),
        sa.Column("target_topic", sa.String(249), nullable=False),
        sa.Column("replayed_ms", sa.BigInteger, nullable=False),
        sa.Column("replayed_by", sa.String(128), nullable=False),
        sa.Column("replay_id", sa.String(36), nullable=False),
        sa.UniqueConstraint(
            "dlq_topic",
            "dlq_partition",
            "dlq_offset",
            "target_topic",
            name="uq_dlq_replays_record",
        ),
    )
    op.create_index("ix_dlq_replays_replay_id", "dlq_replays", ["replay_id"])


def downgrade() -> None:
    """Drop everything :func:`upgrade` created."""
    op.drop_table("dlq_replays")
