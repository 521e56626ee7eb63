"""Agent tool calls waiting for a person's approval: what ``outboxkit actions approvals`` and
the console's actions page list.

A request recorded by :func:`outboxkit.agents.approvals.request_approval` is flagged
``awaiting_decision`` until its decision is recorded; the list reads those rows only, oldest
request first, along the partial index ``ix_agent_operations_awaiting`` (keyset
``(created_ms, id)``). Nothing here decides: the run's own process records a decision
(:func:`outboxkit.agents.approvals.decide`), bound to the arguments' hash shown here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from outboxkit.actions.records import OperationRecord
from outboxkit.actions.tables import agent_operations
from outboxkit.agents.approvals import REQUESTED
from outboxkit.agents.ledger import json_hash
from outboxkit.outbox.secrecy import redact
from sqlalchemy import Select, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True, slots=True)
class WaitingApproval:
    """One tool call waiting for a decision. ``run_id`` and ``tool_call_id`` are ``None`` for
    requests recorded before they were stored with the request."""

    id: int
    tenant: str
    key: str
    run_id: str | None
    tool_call_id: str | None
    tool: str
    args: Any
    args_hash: str
    requested_ms: int
    expires_ms: int
    expired: bool

    @property
    def keyset(self) -> str:
        """Where the next page starts, as ``VALUE.ID``."""
        return f"{self.requested_ms}.{self.id}"

    def shown(self, *, with_args: bool) -> dict[str, Any]:
        """The request as printed and rendered: its arguments (secret fields redacted) only
        ``with_args``, for those allowed to see payloads; the hash always."""
        document: dict[str, Any] = {
            "tenant": self.tenant,
            "key": self.key,
            "run_id": self.run_id,
            "tool_call_id": self.tool_call_id,
            "tool": self.tool,
            "args_hash": self.args_hash,
            "requested_ms": self.requested_ms,
            "expires_ms": self.expires_ms,
            "expired": self.expired,
        }
        if with_args:
            document["args"] = redact(self.args)
        return document


def waiting_query(
    *,
    tenant: str | None = None,
    tenants: Collection[str] | None = None,
    limit: int = 100,
    after: tuple[int, int] | None = None,
) -> Select[Any]:
    """The query of :func:`waiting_approvals` (for its EXPLAIN test)."""
    ops = agent_operations
    query = (
        select(ops)
        .where(ops.c.awaiting_decision.is_(True), ops.c.action_type == REQUESTED)
        .order_by(ops.c.created_ms, ops.c.id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(tuple_(ops.c.created_ms, ops.c.id) > tuple_(*after))
    if tenant is not None:
        query = query.where(ops.c.tenant == tenant)
    if tenants is not None:
        query = query.where(ops.c.tenant.in_(sorted(tenants)))
    return query


async def waiting_approvals(
    session: AsyncSession,
    *,
    now_ms: int,
    tenant: str | None = None,
    tenants: Collection[str] | None = None,
    limit: int = 100,
    after: tuple[int, int] | None = None,
) -> list[WaitingApproval]:
    """Approval requests with no decision yet, oldest first; ``tenant``: only its, ``tenants``:
    only those (``None``: any); ``after``: the ``(requested_ms, id)`` keyset the previous page
    ended with (:attr:`WaitingApproval.keyset`).

    ``expired`` compares the request's expiry with ``now_ms`` (the database clock); the run
    checks its own clock when a decision comes, and refuses one after the expiry.
    """
    query = waiting_query(tenant=tenant, tenants=tenants, limit=limit, after=after)
    rows = (await session.execute(query)).mappings()
    return [_waiting(OperationRecord.from_row(row), now_ms) for row in rows]


def _waiting(operation: OperationRecord, now_ms: int) -> WaitingApproval:
    result = operation.result if isinstance(operation.result, dict) else {}
    args = result.get("args")
    expires_ms = round(float(result.get("expires_at", 0)) * 1000)
    return WaitingApproval(
        id=operation.id,
        tenant=operation.tenant,
        key=operation.key,
        run_id=result.get("run_id"),
        tool_call_id=result.get("tool_call_id"),
        tool=str(result.get("tool", "?")),
        args=args,
        args_hash=json_hash(args),
        requested_ms=operation.created_ms,
        expires_ms=expires_ms,
        expired=now_ms > expires_ms,
    )
