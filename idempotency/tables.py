"""The table of HTTP idempotency keys: one row per (scope, key), claimed before the work.

Times are epoch milliseconds from the database clock (:mod:`outboxkit.outbox.clock`) unless a
clock is injected (tests), so every server process judges leases and expiry by one clock.
"""

from __future__ import annotations

from outboxkit.outbox.tables import metadata
from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)

_BIG_ID = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only

IN_PROGRESS = "in_progress"
COMPLETED = "completed"

http_idempotency_keys = Table(
    "http_idempotency_keys",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("scope", String(128), nullable=False),
    Column("idem_key", String(255), nullable=False),
    # SHA-256 of the whole fingerprint, and the hashes of its parts (JSON), to say which differed
    Column("fingerprint", String(64), nullable=False),
    Column("fingerprint_parts", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("lease_token", String(36), nullable=True),
    Column("lease_expires_ms", BigInteger, nullable=True),
    Column("response_status", Integer, nullable=True),
    Column("response_headers", Text, nullable=True),
    Column("response_body", LargeBinary, nullable=True),
    Column("created_ms", BigInteger, nullable=False),
    Column("completed_ms", BigInteger, nullable=True),
    Column("expires_ms", BigInteger, nullable=False),
    UniqueConstraint("scope", "idem_key", name="uq_http_idempotency_keys_scope_key"),
)
Index("ix_http_idempotency_keys_expires", http_idempotency_keys.c.expires_ms)
