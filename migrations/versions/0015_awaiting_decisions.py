"""Agent approval requests waiting for a decision, and the keyset of the stuck-workflow filter.

Revision ID: 0015_awaiting_decisions
Revises: 0014_dlq_discards
Create Date: 2026-12-03

``agent_operations.awaiting_decision``: true on an approval request recorded by
``outboxkit.agents`` until its decision is recorded (NULL on every other operation), and
``ix_agent_operations_awaiting`` on ``(created_ms, id)`` of those rows only (partial): the
keyset of the console's and ``outboxkit actions approvals``' list, oldest first. Requests
recorded before this revision are not flagged, so they are not listed.

``ix_workflow_instances_due_keyset``: ``(due_ms, id)`` of runnable and waiting instances
(partial), where due_ms is a runnable instance's ``run_at_ms`` and a waiting one's
``wait_deadline_ms``: the keyset of the stuck filter of the workflow list, oldest due first.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.sql.elements import ColumnClause, Grouping

revision = "0015_awaiting_decisions"
down_revision = "0014_dlq_discards"
branch_labels = None
depends_on = None

_WAITING: ColumnClause[str] = sa.literal_column("'waiting'", sa.String)
_RUNNABLE: ColumnClause[str] = sa.literal_column("'runnable'", sa.String)


def upgrade() -> None:
    """Add ``awaiting_decision`` and the two partial indexes."""
    with op.batch_alter_table("agent_operations") as batch:
        batch.add_column(sa.Column("awaiting_decision", sa.Boolean, nullable=True))
    # Written as the queries write them (each dialect renders its own), so planners match them.
    awaiting = sa.column("awaiting_decision", sa.Boolean).is_(True)
    op.create_index(
        "ix_agent_operations_awaiting",
        "agent_operations",
        ["created_ms", "id"],
        postgresql_where=awaiting,
        sqlite_where=awaiting,
    )
    status = sa.column("status", sa.String)
    due_ms = sa.case(
        (status == _RUNNABLE, sa.column("run_at_ms", sa.BigInteger)),
        (status == _WAITING, sa.column("wait_deadline_ms", sa.BigInteger)),
    )
    due_statuses = status.in_([_RUNNABLE, _WAITING])
    op.create_index(
        "ix_workflow_instances_due_keyset",
        "workflow_instances",
        [Grouping(due_ms), "id"],  # PostgreSQL wants an expression in parentheses
        postgresql_where=due_statuses,
        sqlite_where=due_statuses,
    )


def downgrade() -> None:
    """Drop everything :func:`upgrade` added."""
    op.drop_index("ix_workflow_instances_due_keyset", table_name="workflow_instances")
    op.drop_index("ix_agent_operations_awaiting", table_name="agent_operations")
    with op.batch_alter_table("agent_operations") as batch:
        batch.drop_column("awaiting_decision")
