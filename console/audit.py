"""The console's audit trail (table ``console_audit``, migration ``0012_console_audit``).

Every action taken in the console is one row, written whether the action succeeded or failed:
who (name and role), what, on which target and filter, how many rows or records it touched,
when (database clock) and the reason the operator typed. Never a payload or a token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.tables import metadata
from sqlalchemy import BigInteger, Column, Index, Integer, String, Table, Text, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

console_audit = Table(
    "console_audit",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("at_ms", BigInteger, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("role", String(16), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", String(512), nullable=False),
    Column("filter", Text, nullable=False),
    Column("count", Integer, nullable=True),
    Column("reason", Text, nullable=False),
    Column("outcome", Text, nullable=False),
)
Index("ix_console_audit_at_ms", console_audit.c.at_ms)


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One action taken in the console."""

    id: int
    at_ms: int
    actor: str
    role: str
    action: str
    target: str
    filter: str
    count: int | None
    reason: str
    outcome: str


async def record(
    engine: AsyncEngine,
    *,
    actor: str,
    role: str,
    action: str,
    target: str,
    filter: dict[str, Any],
    count: int | None,
    reason: str,
    outcome: str,
) -> None:
    """Write one audit row (its own transaction)."""
    values = {
        "at_ms": dialect_of(engine).now_ms(),
        "actor": actor[:128],
        "role": role,
        "action": action,
        "target": target[:512],
        "filter": json.dumps(filter, sort_keys=True, default=str),
        "count": count,
        "reason": reason,
        "outcome": outcome[:2000],
    }
    async with engine.begin() as connection:
        await connection.execute(insert(console_audit).values(**values))


async def recent(
    engine: AsyncEngine,
    *,
    limit: int = 100,
    before_id: int | None = None,
    action: str | None = None,
) -> list[AuditRow]:
    """Audit rows newest first, paged by keyset on ``id``."""
    query = select(console_audit).order_by(console_audit.c.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(console_audit.c.id < before_id)
    if action:
        query = query.where(console_audit.c.action == action)
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).all()
    return [AuditRow(**row._mapping) for row in rows]
