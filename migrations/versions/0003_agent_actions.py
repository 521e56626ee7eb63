"""Agent actions: operations and their append-only audit trail.

Revision ID: 0003_agent_actions
Revises: 0002_inbox
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_agent_actions"
down_revision = "0002_inbox"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``agent_operations`` and ``agent_operation_audit``."""
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "agent_operations",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("op_key", sa.String(128), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False, server_default="1"),
        sa.Column("action_type", sa.String(128), nullable=False),
        sa.Column("params_hash", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("lease_holder", sa.String(64), nullable=True),
        sa.Column("lease_expires_ms", sa.BigInteger, nullable=True),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("external_ref", sa.String(256), nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("needs_attention", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("updated_ms", sa.BigInteger, nullable=False),
        sa.Column("expires_ms", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("tenant", "op_key", name="uq_agent_operations_tenant_key"),
    )
    op.create_index(
        "ix_agent_operations_state_updated", "agent_operations", ["state", "updated_ms"]
    )
    op.create_index("ix_agent_operations_expires", "agent_operations", ["expires_ms"])
    op.create_table(
        "agent_operation_audit",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("op_key", sa.String(128), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("at_ms", sa.BigInteger, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("detail", sa.Text, nullable=True),
    )
    op.create_index(
        "ix_agent_operation_audit_op", "agent_operation_audit", ["tenant", "op_key", "id"]
    )
    op.create_index("ix_agent_operation_audit_at", "agent_operation_audit", ["at_ms"])


def downgrade() -> None:
    """Drop everything :func:`upgrade` created."""
    op.drop_table("agent_operation_audit")
    op.drop_table("agent_operations")
