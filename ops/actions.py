"""Operator actions on agent operations: the UNKNOWN queue, and resolving one by hand.

``outboxkit actions resolve`` and the console's actions page both resolve through
:func:`resolve_operation`: audited with who and why, and published on the actions topic.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from outboxkit.actions.records import AuditEntry, OperationRecord, Resolution
from outboxkit.actions.states import State
from outboxkit.actions.store import ActionStore
from outboxkit.outbox.secrecy import redact
from outboxkit.outbox.writer import Outbox
from sqlalchemy.ext.asyncio import AsyncSession


async def unknown_queue(
    session: AsyncSession,
    *,
    tenant: str | None = None,
    limit: int = 100,
    tenants: Collection[str] | None = None,
) -> list[OperationRecord]:
    """UNKNOWN operations, the longest UNKNOWN first; ``tenants``: only theirs."""
    return await ActionStore().list_operations(
        session, tenant=tenant, state=State.UNKNOWN, limit=limit, tenants=tenants
    )


def shown(operation: OperationRecord) -> dict[str, Any]:
    """The operation as ``actions list`` and ``show`` print it: its result's secret fields
    (:func:`~outboxkit.outbox.secrecy.is_secret_key`) redacted, as stored otherwise."""
    document = operation.to_json()
    document["result"] = redact(document["result"])
    return document


def shown_entry(entry: AuditEntry) -> dict[str, Any]:
    """An audit entry as ``actions show`` prints it: its detail redacted like a result."""
    document = entry.to_json()
    document["detail"] = redact(document["detail"])
    return document


def resolving_store(topic: str) -> ActionStore:
    """The store that publishes a resolution on ``topic``; ``ValueError`` for a bad name."""
    return ActionStore(Outbox(default_topic=topic))


async def resolve_operation(
    session: AsyncSession,
    store: ActionStore,
    *,
    tenant: str,
    key: str,
    resolution: Resolution,
    by: str,
    reason: str,
    result: Any = None,
    external_ref: str | None = None,
) -> OperationRecord:
    """Resolve one operation in a transaction of its own (``session`` is not in one)."""
    async with session.begin():
        return await store.resolve(
            session,
            tenant=tenant,
            key=key,
            resolution=resolution,
            by=by,
            reason=reason,
            result=result,
            external_ref=external_ref,
        )
