"""Durable workflows: instances, their append-only history, and the signals they receive.

Revision ID: 0009_workflows
Revises: 0008_outbox_scheduled
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_workflows"
down_revision = "0008_outbox_scheduled"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``workflow_instances``, ``workflow_history`` and ``workflow_signals``."""
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "workflow_instances",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("workflow_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("state", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("input_hash", sa.String(64), nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("run_at_ms", sa.BigInteger, nullable=True),
        sa.Column("wait", sa.Text, nullable=True),
        sa.Column("wait_deadline_ms", sa.BigInteger, nullable=True),
        sa.Column("correlation", sa.String(200), nullable=True),
        sa.Column("lease_holder", sa.String(64), nullable=True),
        sa.Column("lease_expires_ms", sa.BigInteger, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("first_failure_ms", sa.BigInteger, nullable=True),
        sa.Column("failure_class", sa.String(16), nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("open_unknown", sa.String(128), nullable=True),
        sa.Column("approval", sa.Text, nullable=True),
        sa.Column("compensations", sa.Text, nullable=False),
        sa.Column("after_compensation", sa.String(64), nullable=True),
        sa.Column("review_from", sa.String(64), nullable=True),
        sa.Column("cancel_requested_ms", sa.BigInteger, nullable=True),
        sa.Column("cancel_reason", sa.Text, nullable=True),
        sa.Column("deadline_ms", sa.BigInteger, nullable=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("entered_seq", sa.Integer, nullable=False),
        sa.Column("state_since_ms", sa.BigInteger, nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("updated_ms", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("tenant", "workflow_id", name="uq_workflow_instances_tenant_id"),
    )
    op.create_index("ix_workflow_instances_due", "workflow_instances", ["status", "run_at_ms"])
    op.create_index("ix_workflow_instances_deadline", "workflow_instances", ["wait_deadline_ms"])
    op.create_index("ix_workflow_instances_state", "workflow_instances", ["state", "updated_ms"])
    op.create_table(
        "workflow_history",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("workflow_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("from_state", sa.String(64), nullable=True),
        sa.Column("to_state", sa.String(64), nullable=False),
        sa.Column("trigger", sa.Text, nullable=False),
        sa.Column("decision", sa.Text, nullable=True),
        sa.Column("steps", sa.Text, nullable=False),
        sa.Column("observations", sa.Text, nullable=False),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("unknown", sa.Text, nullable=True),
        sa.Column("approval_ref", sa.String(256), nullable=True),
        sa.Column("versions", sa.Text, nullable=True),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("deadline_ms", sa.BigInteger, nullable=True),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("at_ms", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("tenant", "workflow_id", "seq", name="uq_workflow_history_seq"),
    )
    op.create_index("ix_workflow_history_at", "workflow_history", ["at_ms"])
    op.create_table(
        "workflow_signals",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("workflow_id", sa.String(128), nullable=False),
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("event_id", sa.String(255), nullable=False),
        sa.Column("type", sa.String(255), nullable=False),
        sa.Column("correlation", sa.String(200), nullable=True),
        sa.Column("request_hash", sa.String(64), nullable=True),
        sa.Column("principal", sa.String(128), nullable=True),
        sa.Column("data", sa.Text, nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("received_ms", sa.BigInteger, nullable=False),
        sa.Column("consumed_seq", sa.Integer, nullable=True),
        sa.UniqueConstraint("source", "event_id", name="uq_workflow_signals_source_id"),
    )
    op.create_index(
        "ix_workflow_signals_instance",
        "workflow_signals",
        ["tenant", "workflow_id", "outcome"],
    )


def downgrade() -> None:
    """Drop what :func:`upgrade` created."""
    op.drop_table("workflow_signals")
    op.drop_table("workflow_history")
    op.drop_table("workflow_instances")
