"""Tables of durable workflows: the instances, their append-only history, and their signals.

Business times (``*_ms``: deadlines, time in state, history) come from the engine's clock, which
tests may replace; lease times come from the database clock, so workers compare leases on one
clock. JSON values are stored as text.
"""

from __future__ import annotations

from outboxkit.outbox.tables import metadata
from outboxkit.workflows.records import Status
from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    case,
    literal_column,
)
from sqlalchemy.sql.elements import ColumnClause, Grouping

_BIG_ID = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only

workflow_instances = Table(
    "workflow_instances",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("tenant", String(64), nullable=False),
    Column("workflow_id", String(128), nullable=False),
    Column("name", String(128), nullable=False),
    Column("version", Integer, nullable=False),
    Column("state", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("input_hash", String(64), nullable=False),
    Column("data", Text, nullable=False),
    Column("owner", String(128), nullable=True),
    Column("run_at_ms", BigInteger, nullable=True),
    Column("wait", Text, nullable=True),
    Column("wait_deadline_ms", BigInteger, nullable=True),
    Column("correlation", String(200), nullable=True),
    Column("lease_holder", String(64), nullable=True),
    Column("lease_expires_ms", BigInteger, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("first_failure_ms", BigInteger, nullable=True),
    Column("failure_class", String(16), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("open_unknown", String(128), nullable=True),
    Column("approval", Text, nullable=True),
    Column("compensations", Text, nullable=False, default="[]"),
    Column("after_compensation", String(64), nullable=True),
    Column("review_from", String(64), nullable=True),
    Column("cancel_requested_ms", BigInteger, nullable=True),
    Column("cancel_reason", Text, nullable=True),
    Column("deadline_ms", BigInteger, nullable=True),
    Column("seq", Integer, nullable=False, default=0),
    Column("entered_seq", Integer, nullable=False, default=0),
    Column("state_since_ms", BigInteger, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    UniqueConstraint("tenant", "workflow_id", name="uq_workflow_instances_tenant_id"),
)
Index("ix_workflow_instances_due", workflow_instances.c.status, workflow_instances.c.run_at_ms)
Index("ix_workflow_instances_deadline", workflow_instances.c.wait_deadline_ms)
Index("ix_workflow_instances_state", workflow_instances.c.state, workflow_instances.c.updated_ms)
# The keyset of the workflow list, most recently changed first (migration 0014).
Index("ix_workflow_instances_updated", workflow_instances.c.updated_ms, workflow_instances.c.id)

# Literal constants, not parameters: a generic plan of a prepared statement still matches the
# index's expression and predicate.
_RUNNABLE: ColumnClause[str] = literal_column(f"'{Status.RUNNABLE.value}'", String)
_WAITING: ColumnClause[str] = literal_column(f"'{Status.WAITING.value}'", String)
DUE_MS = case(
    (workflow_instances.c.status == _RUNNABLE, workflow_instances.c.run_at_ms),
    (workflow_instances.c.status == _WAITING, workflow_instances.c.wait_deadline_ms),
)
"""When an instance's work falls due: a runnable one's ``run_at_ms``, a waiting one's deadline
(``NULL`` otherwise): the order of the stuck filter."""
DUE_STATUSES = workflow_instances.c.status.in_([_RUNNABLE, _WAITING])
"""The instances that can be due (the predicate of ``ix_workflow_instances_due_keyset``)."""
# The keyset of the stuck filter, oldest due first (migration 0015); partial: only instances
# that can be due are in it.
Index(
    "ix_workflow_instances_due_keyset",
    Grouping(DUE_MS),  # PostgreSQL wants an expression in parentheses
    workflow_instances.c.id,
    postgresql_where=DUE_STATUSES,
    sqlite_where=DUE_STATUSES,
)

workflow_history = Table(
    "workflow_history",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("tenant", String(64), nullable=False),
    Column("workflow_id", String(128), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("name", String(128), nullable=False),
    Column("version", Integer, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("from_state", String(64), nullable=True),
    Column("to_state", String(64), nullable=False),
    Column("trigger", Text, nullable=False),
    Column("decision", Text, nullable=True),
    Column("steps", Text, nullable=False),
    Column("observations", Text, nullable=False),
    Column("result", Text, nullable=True),
    Column("unknown", Text, nullable=True),
    Column("approval_ref", String(256), nullable=True),
    Column("versions", Text, nullable=True),
    Column("data", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("deadline_ms", BigInteger, nullable=True),
    Column("actor", String(128), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    UniqueConstraint("tenant", "workflow_id", "seq", name="uq_workflow_history_seq"),
)
Index("ix_workflow_history_at", workflow_history.c.at_ms)

workflow_signals = Table(
    "workflow_signals",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("tenant", String(64), nullable=False),
    Column("workflow_id", String(128), nullable=False),
    Column("source", String(255), nullable=False),
    Column("event_id", String(255), nullable=False),
    Column("type", String(255), nullable=False),
    Column("correlation", String(200), nullable=True),
    Column("request_hash", String(64), nullable=True),
    Column("principal", String(128), nullable=True),
    Column("data", Text, nullable=True),
    Column("outcome", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("received_ms", BigInteger, nullable=False),
    Column("consumed_seq", Integer, nullable=True),
    UniqueConstraint("source", "event_id", name="uq_workflow_signals_source_id"),
)
Index(
    "ix_workflow_signals_instance",
    workflow_signals.c.tenant,
    workflow_signals.c.workflow_id,
    workflow_signals.c.outcome,
)
