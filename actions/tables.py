"""Tables of agent actions: the operations and their append-only audit trail.

Times are epoch milliseconds from the database clock (:mod:`outboxkit.outbox.clock`), so leases and
expiry are compared against one clock by every process. JSON values are stored as text.
"""

from __future__ import annotations

from outboxkit.outbox.tables import metadata
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)

_BIG_ID = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only

agent_operations = Table(
    "agent_operations",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("tenant", String(64), nullable=False),
    Column("op_key", String(128), nullable=False),
    Column("generation", Integer, nullable=False, default=1),
    Column("action_type", String(128), nullable=False),
    Column("params_hash", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("lease_holder", String(64), nullable=True),
    Column("lease_expires_ms", BigInteger, nullable=True),
    Column("result", Text, nullable=True),
    Column("external_ref", String(256), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("needs_attention", Boolean, nullable=False, default=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    Column("expires_ms", BigInteger, nullable=False),
    # True on a recorded request that waits for a person's decision (an agent's approval
    # request), NULL otherwise (migration 0015).
    Column("awaiting_decision", Boolean, nullable=True),
    UniqueConstraint("tenant", "op_key", name="uq_agent_operations_tenant_key"),
)
Index("ix_agent_operations_state_updated", agent_operations.c.state, agent_operations.c.updated_ms)
Index("ix_agent_operations_expires", agent_operations.c.expires_ms)
_AWAITING = agent_operations.c.awaiting_decision.is_(True)
# The keyset of the requests waiting for a decision, oldest first; partial: only they are in it.
Index(
    "ix_agent_operations_awaiting",
    agent_operations.c.created_ms,
    agent_operations.c.id,
    postgresql_where=_AWAITING,
    sqlite_where=_AWAITING,
)

agent_operation_audit = Table(
    "agent_operation_audit",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("tenant", String(64), nullable=False),
    Column("op_key", String(128), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("from_state", String(16), nullable=True),
    Column("to_state", String(16), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("reason", Text, nullable=False),
    Column("detail", Text, nullable=True),
)
Index(
    "ix_agent_operation_audit_op",
    agent_operation_audit.c.tenant,
    agent_operation_audit.c.op_key,
    agent_operation_audit.c.id,
)
Index("ix_agent_operation_audit_at", agent_operation_audit.c.at_ms)
