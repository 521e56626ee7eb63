"""The console's audit trail: every action taken in ``outboxkit console``.

Revision ID: 0012_console_audit
Revises: 0011_slot_catch_ups
Create Date: 2026-12-01

One row per action an operator took in the web console (a replay, a requeue, a resolution, a
workflow decision): who, what, on which filter, how many rows or records it touched, when and
why. Listed newest first by ``id``.
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_console_audit"
down_revision = "0011_slot_catch_ups"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``console_audit``."""
    op.create_table(
        "console_audit",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(512), nullable=False),
        sa.Column("filter", sa.Text(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
    )
    op.create_index("ix_console_audit_at_ms", "console_audit", ["at_ms"])


def downgrade() -> None:
    """Drop ``console_audit``."""
    op.drop_index("ix_console_audit_at_ms", table_name="console_audit")
    op.drop_table("console_audit")
